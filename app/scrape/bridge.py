"""The scrape bridge: poll every target's ``/metrics`` once per interval, publish the converter's events.

Owns :class:`Bridge`: the set of targets (each with its own converter, kept
while the target stays in the list), one scrape cycle
(:meth:`Bridge.scrape_once`) and the bridge's own Prometheus metrics. The
network and Kafka are injected (:class:`Fetcher`, :class:`Publisher`), and so
are the clock and the converter factory, so tests need neither.

Guarantees:

- at most ``concurrency`` scrapes are in flight; each is bounded by ``timeout_s``;
- a target that fails (timeout, refused connection, HTTP status other than 200,
  an exposition the converter rejects) publishes nothing for that interval; the
  failure is counted (``tailguard_scrape_failures_total{instance,reason}``) and
  logged once when the target starts failing and once when it answers again;
- the events a converter returns are published as they are, keyed
  ``node_id|model``, to one topic; a failed publish is counted and logged, never
  fatal;
- a target that leaves the list drops its converter (and its metric series);
  one that comes back starts a new converter (its first scrape sends nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tailguard.scrape.sd import ScrapeTarget

log = logging.getLogger("tailguard.scrape")

OPENMETRICS = "application/openmetrics-text"
#: What the bridge asks for: the text format only. Named at all, OpenMetrics is what prometheus_client
#: (vLLM, SGLang) serves, and since 0.22 it escapes ``vllm:x`` to ``vllm_x`` there (docs/scrape.md).
#: A server that sends OpenMetrics anyway is parsed as OpenMetrics.
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


@dataclass(frozen=True, slots=True)
class Fetched:
    status: int
    body: bytes
    content_type: str = ""


class Fetcher(Protocol):
    """GET a URL; raises :class:`OSError` (or aiohttp's ClientError) when it cannot connect."""

    async def fetch(self, url: str, timeout_s: float) -> Fetched: ...


class Publisher(Protocol):
    """Hands one message to Kafka; awaiting the returned awaitable waits for its acknowledgement."""

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[object]: ...


class Converter(Protocol):
    """One target's exposition → histogram events (hist-core's ``TargetConverter``)."""

    def observe(self, text: str, ts: float, *, openmetrics: bool = False) -> list[dict[str, object]]: ...


ConverterFactory = Callable[[ScrapeTarget], Converter]


def default_converter(target: ScrapeTarget, profiles: Mapping[str, object] | None = None) -> Converter:
    """The ``TargetConverter`` for ``target`` (``profiles``: the built-in ones and a mapping file's);
    ``ValueError`` for a profile it does not know. Imported late: the bridge's tests inject fakes."""
    convert = importlib.import_module("tailguard.scrape.convert")
    t = convert.Target(node_id=target.node_id, model=target.model, hardware=target.hardware,
                       profile=target.profile)
    conv: Converter = convert.TargetConverter(t) if profiles is None else convert.TargetConverter(t, profiles)
    return conv


@dataclass(frozen=True, slots=True)
class CycleStats:
    targets: int
    ok: int
    failed: int
    events: int
    published_failed: int = 0


@dataclass
class _State:
    target: ScrapeTarget
    converter: Converter
    failing: str = ""                  # the reason while failing, "" while fine
    reasons: set[str] = field(default_factory=set)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram("tailguard_scrape_duration_seconds", "Time to fetch and convert one target",
                                  ["instance"], registry=registry)
        self.failures = Counter("tailguard_scrape_failures", "Scrapes that sent nothing, by reason",
                                ["instance", "reason"], registry=registry)
        self.up = Gauge("tailguard_scrape_up", "1 if the last scrape of the target succeeded", ["instance"],
                        registry=registry)
        self.targets = Gauge("tailguard_scrape_targets", "Targets this process scrapes", registry=registry)
        self.events = Counter("tailguard_scrape_events", "Histogram events handed to Kafka", registry=registry)
        self.publish_failures = Counter("tailguard_scrape_publish_failures", "Events Kafka did not take",
                                        registry=registry)
        self.overruns = Counter("tailguard_scrape_overruns", "Cycles that took longer than the interval",
                                registry=registry)


class Bridge:
    """Scrapes a set of targets and publishes their histogram events."""

    def __init__(self, fetcher: Fetcher, publisher: Publisher, *, timeout_s: float, concurrency: int,
                 registry: CollectorRegistry, converter_factory: ConverterFactory = default_converter,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        self._fetcher, self._publisher = fetcher, publisher
        self.timeout_s, self._limit = timeout_s, asyncio.Semaphore(concurrency)
        self._factory, self._clock, self._mono = converter_factory, clock, monotonic
        self._m = _Metrics(registry)
        self._states: dict[str, _State] = {}

    @property
    def targets(self) -> list[ScrapeTarget]:
        return [s.target for s in self._states.values()]

    def set_targets(self, targets: Iterable[ScrapeTarget]) -> tuple[int, int]:
        """Replace the target list; ``(added, removed)``. Kept targets keep their converters."""
        new = {t.key: t for t in targets}
        removed = [k for k in self._states if k not in new]
        for k in removed:
            self._forget(self._states.pop(k))
        added = 0
        for k, t in new.items():
            st = self._states.get(k)
            if st is None or st.target != t:       # new, or its labels changed: start afresh
                if st is not None:
                    self._forget(self._states.pop(k))
                try:
                    converter = self._factory(t)
                except ValueError as e:            # e.g. a profile nobody defined: skip this target only
                    log.error("tailguard scrape: %s (%s) is not scraped: %s", t.node_id, t.url, _one_line(e))
                    self._m.failures.labels(t.node_id, "profile").inc()
                    continue
                self._states[k] = _State(t, converter)
                added += 1
        self._m.targets.set(len(self._states))
        return added, len(removed)

    def _forget(self, st: _State) -> None:
        inst = st.target.node_id
        for metric in (self._m.up, self._m.duration):
            with contextlib.suppress(KeyError):
                metric.remove(inst)
        for reason in st.reasons:
            with contextlib.suppress(KeyError):
                self._m.failures.remove(inst, reason)

    async def scrape_once(self) -> CycleStats:
        """One scrape of every target, concurrently; waits for Kafka to acknowledge the events."""
        results = await asyncio.gather(*(self._scrape(st) for st in list(self._states.values())))
        futures = [f for ok, fs in results for f in fs]
        acks = await asyncio.gather(*futures, return_exceptions=True)
        lost = sum(1 for a in acks if isinstance(a, BaseException))
        if lost:
            self._m.publish_failures.inc(lost)
            log.warning("tailguard scrape: Kafka did not take %d of %d events (%s)", lost, len(acks),
                        next(a for a in acks if isinstance(a, BaseException)))
        self._m.events.inc(len(acks) - lost)
        ok = sum(1 for good, _ in results if good)
        return CycleStats(len(results), ok, len(results) - ok, len(acks) - lost, lost)

    async def _scrape(self, st: _State) -> tuple[bool, list[asyncio.Future[object]]]:
        t = st.target
        async with self._limit:
            t0 = self._mono()
            try:
                got = await asyncio.wait_for(self._fetcher.fetch(t.url, self.timeout_s), self.timeout_s)
            except TimeoutError:
                return self._fail(st, "timeout", f"no answer within {self.timeout_s:g} s"), []
            except OSError as e:     # aiohttp's ClientConnectionError is an OSError too
                return self._fail(st, "connect", _one_line(e)), []
            except Exception as e:   # any other client error: counted, never fatal
                return self._fail(st, "http", _one_line(e)), []
            ts = self._clock()
            if got.status != 200:
                return self._fail(st, f"http_{got.status}", f"HTTP {got.status}"), []
            try:
                text = got.body.decode("utf-8")
                events = st.converter.observe(text, ts, openmetrics=got.content_type.startswith(OPENMETRICS))
            except Exception as e:   # a bad exposition: this target's problem, not the bridge's
                return self._fail(st, "parse", f"{type(e).__name__}: {_one_line(e)}"), []
            self._m.duration.labels(t.node_id).observe(self._mono() - t0)
        if st.failing:
            log.info("tailguard scrape: %s (%s) answers again", t.node_id, t.url)
            st.failing = ""
        self._m.up.labels(t.node_id).set(1)
        futures = []
        for ev in events:
            key = f"{ev.get('node_id', t.node_id)}|{ev.get('model', t.model)}".encode()
            try:
                futures.append(await self._publisher.send(key, encode(ev)))
            except Exception as e:   # Kafka refused at once (buffer full, closed): count, go on
                fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
                fut.set_exception(e)
                futures.append(fut)
        return True, futures

    def _fail(self, st: _State, reason: str, detail: str) -> bool:
        t = st.target
        self._m.failures.labels(t.node_id, reason).inc()
        self._m.up.labels(t.node_id).set(0)
        st.reasons.add(reason)
        if st.failing != reason:
            log.warning("tailguard scrape: %s (%s): %s; it sends nothing until it answers", t.node_id, t.url,
                        detail)
            st.failing = reason
        return False


def encode(event: Mapping[str, object]) -> bytes:
    return json.dumps(event, separators=(",", ":"), allow_nan=False).encode()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
