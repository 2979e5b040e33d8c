"""``tailguard scrape``: the long-running bridge from servers' ``/metrics`` to ``latency-events``.

Owns the command: its options (each one a ``TAILGUARD_SCRAPE_*`` setting it
overrides), the aiohttp fetcher, the Kafka publisher (the package's Kafka
security options, so SASL/TLS work as everywhere else), the target source
(``file_sd`` watched each interval, or ``http_sd`` read every
``scrape_sd_refresh_s``), sharding, the bridge's own ``/metrics`` endpoint and
the loop that scrapes once per ``scrape_interval_s`` until SIGINT/SIGTERM.

Guarantees: a bad setting or an unusable target list at start is a one-line
error naming the setting or file, exit code 2; later, a target list that
turns bad (or an http_sd URL that stops answering) is logged once and the last
good list stays in use. A progress line every minute says how many targets
answered and how many events went to Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from tailguard import settings as app_settings
from tailguard.core.contract.config import SettingError
from tailguard.core.contract.ids import rule
from tailguard.scrape.bridge import ACCEPT, Bridge, ConverterFactory, CycleStats, Fetched, default_converter
from tailguard.scrape.config import parse_shard
from tailguard.scrape.sd import FileSource, HttpSource, LabelNames, ScrapeTarget, SdError, in_shard

log = logging.getLogger("tailguard.scrape")
PROGRESS_EVERY_S = 60.0


class HttpFetcher:
    """GETs with one shared aiohttp session (connection reuse across hundreds of targets)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def fetch(self, url: str, timeout_s: float) -> Fetched:
        async with self._session.get(url, headers={"Accept": ACCEPT},
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return Fetched(r.status, await r.read(), r.headers.get("Content-Type", ""))


class KafkaPublisher:
    def __init__(self, producer: Any, topic: str) -> None:
        self._producer, self.topic = producer, topic

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[object]:
        fut: asyncio.Future[object] = await self._producer.send(self.topic, value, key=key)
        return fut


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard scrape",
        description="Poll inference servers' /metrics (vLLM, SGLang, TGI, Triton, Dynamo) and publish "
                    "their latency histograms to Kafka: judging nodes with no code in the servers.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--file-sd", metavar="PATH", help="Prometheus file_sd targets (JSON or YAML), re-read "
                     "when it changes (TAILGUARD_SCRAPE_FILE_SD)")
    src.add_argument("--http-sd", metavar="URL", help="Prometheus http_sd URL (TAILGUARD_SCRAPE_HTTP_SD)")
    p.add_argument("--interval-s", type=float, help="seconds between scrapes of a target (default 10)")
    p.add_argument("--timeout-s", type=float, help="per-target timeout (default: 5 or the interval, the shorter)")
    p.add_argument("--shard", metavar="I/N", help="scrape only the targets whose stable hash mod N is I")
    p.add_argument("--metrics-port", type=int, help="the bridge's own /metrics port (default 9465, 0: none)")
    p.add_argument("--profiles", metavar="PATH", help="mapping file of other servers' metrics, JSON or YAML "
                   "(TAILGUARD_SCRAPE_PROFILES_FILE)")
    p.add_argument("--once", action="store_true", help="scrape twice (one interval apart), publish, exit")
    return p


def converter_factory(s: app_settings.Settings) -> ConverterFactory:
    """Converters knowing the built-in profiles and those of ``scrape_profiles_file`` (read once, now);
    an unreadable or bad file is a :class:`SettingError` naming it."""
    if not s.scrape_profiles_file:
        return default_converter
    from tailguard.scrape.profiles import PROFILES, profiles_from_text

    path = s.scrape_profiles_file
    try:
        with open(path, encoding="utf-8") as fh:
            extra = profiles_from_text(fh.read(), "its")
    except OSError as e:
        raise SettingError("TAILGUARD_SCRAPE_PROFILES_FILE", path, f"a readable mapping file ({e.strerror})") from None
    except (ValueError, UnicodeDecodeError) as e:
        why = " ".join(str(e).split())[:300]
        raise SettingError("TAILGUARD_SCRAPE_PROFILES_FILE", path,
                           f"a mapping file of server profiles (docs/scrape.md); {why}") from None
    profiles = {**PROFILES, **extra}
    return functools.partial(default_converter, profiles=profiles)


def _settings(args: argparse.Namespace) -> app_settings.Settings:
    over: dict[str, Any] = {}
    for opt, name in (("file_sd", "scrape_file_sd"), ("http_sd", "scrape_http_sd"),
                      ("interval_s", "scrape_interval_s"), ("timeout_s", "scrape_timeout_s"),
                      ("shard", "scrape_shard"), ("metrics_port", "scrape_metrics_port"),
                      ("profiles", "scrape_profiles_file")):
        if getattr(args, opt) is not None:
            over[name] = getattr(args, opt)
    if over.get("scrape_file_sd"):
        over["scrape_http_sd"] = ""
    if over.get("scrape_http_sd"):
        over["scrape_file_sd"] = ""
    s = app_settings.load(**over)
    if not (s.scrape_file_sd or s.scrape_http_sd):
        raise SettingError("TAILGUARD_SCRAPE_FILE_SD", "", "a Prometheus file_sd file (or --file-sd PATH), "
                           "or TAILGUARD_SCRAPE_HTTP_SD / --http-sd URL: the targets to scrape")
    return s


class Targets:
    """The target list from the configured source, sharded; keeps the last good list on errors."""

    def __init__(self, s: app_settings.Settings, session: aiohttp.ClientSession) -> None:
        names = LabelNames(s.scrape_node_label, s.scrape_model_label, s.scrape_hardware_label,
                           s.scrape_profile_label, rule(s.detector.id_pattern))
        self._file = FileSource(s.scrape_file_sd, names) if s.scrape_file_sd else None
        self._http = HttpSource(s.scrape_http_sd, names) if s.scrape_http_sd else None
        self._session, self._refresh_s = session, s.scrape_sd_refresh_s
        self._shard = parse_shard("TAILGUARD_SCRAPE_SHARD", s.scrape_shard)
        self._next_http = 0.0
        self._error = ""
        self.source = s.scrape_file_sd or s.scrape_http_sd

    async def poll(self, *, first: bool = False) -> list[ScrapeTarget] | None:
        """The new list when the source changed (None otherwise); ``first``: errors raise."""
        try:
            got = await self._read()
        except SdError as e:
            if first:
                raise
            if str(e) != self._error:
                log.error("tailguard scrape: %s; keeping the last good target list", e)
                self._error = str(e)
            return None
        if got is None:
            return None
        if self._error:
            log.info("tailguard scrape: %s is usable again", self.source)
            self._error = ""
        return in_shard(got, *self._shard)

    async def _read(self) -> list[ScrapeTarget] | None:
        if self._file is not None:
            return self._file.poll()
        assert self._http is not None
        now = time.monotonic()
        if now < self._next_http:
            return None
        self._next_http = now + self._refresh_s
        try:
            async with self._session.get(self._http.url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                return self._http.parse(r.status, await r.read())
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise SdError(f"{self._http.url}: cannot read the http_sd list ({type(e).__name__}: {e})") from None


async def run(s: app_settings.Settings, *, once: bool = False, stop: asyncio.Event | None = None,
              registry: CollectorRegistry | None = None) -> CycleStats | None:
    """Scrape until ``stop`` is set (or twice with ``once``); the last cycle's stats."""
    from aiokafka import AIOKafkaProducer

    from tailguard.security import check_kafka, kafka_client_options

    stop = stop or asyncio.Event()
    registry = registry or CollectorRegistry()
    factory = converter_factory(s)
    await check_kafka(s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=s.scrape_concurrency)) as session:
        targets = Targets(s, session)
        first = await targets.poll(first=True) or []
        producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, linger_ms=20,
                                    **kafka_client_options(s))
        await producer.start()
        try:
            bridge = Bridge(HttpFetcher(session), KafkaPublisher(producer, s.topics.latency_events),
                            timeout_s=s.scrape_timeout, concurrency=s.scrape_concurrency, registry=registry,
                            converter_factory=factory)
            bridge.set_targets(first)
            print(f"tailguard scrape: {len(first)} targets from {targets.source}"
                  f"{f' (shard {s.scrape_shard})' if s.scrape_shard else ''}, every {s.scrape_interval_s:g} s "
                  f"(timeout {s.scrape_timeout:g} s), publishing to {s.topics.latency_events} on "
                  f"{s.kafka_bootstrap}", file=sys.stderr, flush=True)
            return await _loop(bridge, targets, s.scrape_interval_s, stop, 2 if once else None)
        finally:
            await producer.stop()


async def _loop(bridge: Bridge, targets: Targets, interval_s: float, stop: asyncio.Event,
                cycles: int | None) -> CycleStats | None:
    stats: CycleStats | None = None
    next_at = time.monotonic()
    progress_at, answered, sent, done = next_at + PROGRESS_EVERY_S, 0, 0, 0
    while not stop.is_set() and (cycles is None or done < cycles):
        changed = await targets.poll()
        if changed is not None:
            added, removed = bridge.set_targets(changed)
            if added or removed:
                log.info("tailguard scrape: %s changed: %d targets (+%d, -%d)", targets.source,
                         len(bridge.targets), added, removed)
        stats = await bridge.scrape_once()
        done += 1
        answered, sent = answered + stats.ok, sent + stats.events
        now = time.monotonic()
        if now >= progress_at:
            print(f"tailguard scrape: last minute: {answered} scrapes answered, {sent} events sent; "
                  f"now {stats.ok}/{stats.targets} targets answer", file=sys.stderr, flush=True)
            progress_at, answered, sent = now + PROGRESS_EVERY_S, 0, 0
        next_at += interval_s
        if next_at < now:
            log.warning("tailguard scrape: a cycle took longer than the interval (%.1f s); "
                        "raise TAILGUARD_SCRAPE_CONCURRENCY or the interval", interval_s)
            next_at = now
        if cycles is not None and done >= cycles:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_at - time.monotonic()))
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    s = _settings(args)
    logging.basicConfig(level=s.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")

    try:
        stats = asyncio.run(_main(s, args.once))
    except SdError as e:
        print(f"tailguard scrape: {e}", file=sys.stderr)
        return 2
    if args.once and stats is not None:
        print(f"tailguard scrape: {stats.ok}/{stats.targets} targets answered, {stats.events} events sent",
              file=sys.stderr)
    return 0


async def _main(s: app_settings.Settings, once: bool) -> CycleStats | None:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    registry = CollectorRegistry()
    if s.scrape_metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(s.scrape_metrics_port, addr=s.metrics_host, registry=registry)
        except OSError as e:
            raise SettingError("TAILGUARD_SCRAPE_METRICS_PORT", s.scrape_metrics_port,
                               f"a free port on {s.metrics_host} ({e.strerror}); 0 turns the endpoint off") from None
    return await run(s, once=once, stop=stop, registry=registry)
