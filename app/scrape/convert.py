"""Exposition → histogram events: the pure core of ``tailguard scrape`` and of replayed captures.

Owns :class:`TargetConverter` (one per scrape target): it parses a scrape's Prometheus text or
OpenMetrics with ``prometheus_client``'s parsers, reads the latency series of the target's
:mod:`~tailguard.scrape.profiles` profile (given, or detected from the metric names), and returns the
histogram events of docs/contracts.md: per (model, metric) the NON-cumulative bucket counts since
the previous scrape, with the request and failed counts of the interval. A model whose series did
not move gets a heartbeat instead (the target answered: a sign of life, so a hung server whose
/metrics still answers is judged ``stalled``, not ``gone``). :func:`events_from_capture` turns a
file of captured scrapes (``/federate`` output, many targets, millisecond timestamps) into the
same events, in time order, for ``tailguard replay``.

Guarantees: pure (no I/O, no clock: time is the scrape's ``ts``); the first scrape of a target
returns ``[]`` (no interval yet); series of one model that differ only in other labels (vLLM's
``engine``, Triton's ``version``) are summed; a cumulative value that goes down, or buckets
that change, is a restart (a missing series keeps its last value): the interval's counts are
then the new process's totals and the events carry a new ``instance``: ``<node>@<start>``
when the server exports ``process_start_time_seconds`` (stable across bridge restarts), else
the node id until a restart is seen and ``<node>#<ts>`` after it. Unparsable text or a model that cannot be named raises
:class:`ScrapeError` with the target and what to change; the bridge counts it per target.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as _om_families
from prometheus_client.parser import text_string_to_metric_families as _text_families

from tailguard.scrape.profiles import PROFILES, CounterSpec, HistogramSpec, ServerProfile, detect, escaped

_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total")
START_TIME = "process_start_time_seconds"


class ScrapeError(ValueError):
    """A scrape that cannot be converted (bad exposition, no model name, unknown profile)."""


@dataclass(frozen=True)
class Target:
    node_id: str
    model: str | None = None          # for servers without a model label (TGI), or as a fallback
    hardware: str | None = None
    profile: str = "auto"             # vllm|sglang|tgi|triton|dynamo|auto|<mapping name>


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    ts: float | None = None


@dataclass
class _Hist:
    bounds: tuple[float, ...]          # finite upper bounds, seconds
    cum: list[float]                   # cumulative counts per finite bound, then +Inf
    sum_s: float
    count: float


@dataclass
class _Snapshot:
    hists: dict[tuple[str, str], _Hist] = field(default_factory=dict)      # (model, metric)
    requests: dict[str, float] = field(default_factory=dict)               # model -> cumulative
    failed: dict[str, float] = field(default_factory=dict)
    start_time: float | None = None


def parse_samples(text: str, *, openmetrics: bool = False) -> list[Sample]:
    """Every sample of an exposition, by ``prometheus_client``'s parser for the format."""
    try:
        families = list((_om_families if openmetrics else _text_families)(text))
    except Exception as e:   # the parsers raise ValueError, KeyError, IndexError, …
        fmt = "OpenMetrics" if openmetrics else "Prometheus text format"
        raise ScrapeError(f"not valid {fmt}: {e}"[:300]) from None
    return [Sample(s.name, s.labels, float(s.value), None if s.timestamp is None else float(s.timestamp))
            for f in families for s in f.samples]


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _le(v: str, scale_s: float) -> float:
    """A bucket's upper bound in seconds, to 12 significant digits (1e-3 × 100 is 0.1)."""
    b = float(v)
    return b if math.isinf(b) else float(f"{b * scale_s:.12g}")


class TargetConverter:
    """One scrape target's exposition → histogram events (module docstring). Not thread-safe."""

    def __init__(self, target: Target, profiles: Mapping[str, ServerProfile] = PROFILES) -> None:
        if target.profile != "auto" and target.profile not in profiles:
            raise ValueError(f"target {target.node_id!r}: unknown profile {target.profile!r};"
                             f" expected auto or one of {', '.join(sorted(profiles))}")
        self.target = target
        self._profiles = profiles
        self.profile: ServerProfile | None = None if target.profile == "auto" else profiles[target.profile]
        self._prev: _Snapshot | None = None
        self._prev_ts: float | None = None
        # Without a process start time: the node id until a restart is seen, then node#<ts>.
        self._instance = target.node_id

    def observe(self, text: str, ts: float, *, openmetrics: bool = False) -> list[dict[str, Any]]:
        """The events of one scrape taken at ``ts`` (Unix s); ``[]`` on the first."""
        return self.observe_samples(parse_samples(text, openmetrics=openmetrics), ts)

    def observe_samples(self, samples: Iterable[Sample], ts: float) -> list[dict[str, Any]]:
        """:meth:`observe` of already parsed samples (a capture's scrapes)."""
        samples = list(samples)
        profile = self.profile or detect({s.name for s in samples}, self._profiles)
        if profile is None:
            names = ", ".join(sorted(p for p in self._profiles))
            raise ScrapeError(f"target {self.target.node_id!r}: no known latency histogram in the"
                              f" scrape; set its profile ({names}) or give a mapping file")
        self.profile = profile
        snap = self._snapshot(samples, profile)
        prev, prev_ts = self._prev, self._prev_ts
        self._prev, self._prev_ts = snap, ts
        if snap.start_time is not None:
            self._instance = f"{self.target.node_id}@{snap.start_time:.0f}"
        if prev is None or prev_ts is None or ts <= prev_ts:
            return []
        if _went_down(prev, snap) or snap.start_time != prev.start_time:
            if snap.start_time is None:
                self._instance = f"{self.target.node_id}#{ts:.0f}"
            return self._events(_Snapshot(), snap, ts, ts - prev_ts)
        events = self._events(prev, snap, ts, ts - prev_ts)
        _carry_vanished(prev, snap)
        return events

    def _model_of(self, labels: Mapping[str, str], profile: ServerProfile) -> str:
        model = labels.get(profile.model_label) if profile.model_label else None
        model = model or self.target.model
        if not model:
            where = (f"its series have no {profile.model_label!r} label" if profile.model_label
                     else f"{profile.name} exports no model label")
            raise ScrapeError(f"target {self.target.node_id!r}: {where}; give the target a model"
                              " (the file_sd label named by --model-label)")
        return model

    def _snapshot(self, samples: list[Sample], profile: ServerProfile) -> _Snapshot:
        snap = _Snapshot()
        by_base: dict[str, list[Sample]] = {}
        for s in samples:
            if s.name == START_TIME:
                snap.start_time = s.value if snap.start_time is None else min(snap.start_time, s.value)
                continue
            by_base.setdefault(_base(s.name), []).append(s)
        durations: dict[str, float] = {}
        for spec in profile.histograms:
            name = next((e for n in spec.names for e in escaped(n) if e in by_base), None)
            if name is None:
                continue
            if spec.mean_of:
                for s in by_base[name]:
                    m = self._model_of(s.labels, profile)
                    durations[m] = durations.get(m, 0.0) + s.value * spec.scale_s
            else:
                self._read_histogram(snap, spec, by_base[name], profile)
        success: dict[str, float] = {}
        for c in profile.counters:
            self._read_counter(snap, success, c, next((by_base[e] for e in escaped(c.name) if e in by_base), ()),
                               profile)
        has_requests = any(c.role == "requests" for c in profile.counters)
        for m, v in success.items():
            if has_requests:
                snap.failed[m] = max(0.0, snap.requests.get(m, v) - v)
            else:
                snap.requests[m] = v + snap.failed.get(m, 0.0)
        mean = next((h for h in profile.histograms if h.mean_of), None)
        if mean is not None:
            for m, total_s in durations.items():
                n = snap.requests.get(m)
                if n is not None:
                    snap.hists[(m, mean.metric)] = _Hist((), [n], total_s, n)
        return snap

    def _read_histogram(self, snap: _Snapshot, spec: HistogramSpec, samples: Iterable[Sample],
                        profile: ServerProfile) -> None:
        per: dict[str, dict[str, Any]] = {}     # model -> {"le": {bound: cum}, "sum": s, "count": n}
        for s in samples:
            labels = s.labels
            m = self._model_of(labels, profile)
            d = per.setdefault(m, {"le": {}, "sum": 0.0, "count": 0.0})
            if s.name.endswith("_bucket"):
                try:
                    le = _le(labels.get("le", ""), spec.scale_s)
                except ValueError:
                    raise ScrapeError(f"target {self.target.node_id!r}: {s.name} has le="
                                      f"{labels.get('le')!r}, not a number") from None
                d["le"][le] = d["le"].get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                d["sum"] += s.value * spec.scale_s
            elif s.name.endswith("_count"):
                d["count"] += s.value
        for m, d in per.items():
            les: dict[float, float] = d["le"]
            if not les:
                continue
            # A bound <= 0 (Dynamo's rounded log buckets start at le="0") holds no latency: its
            # bucket merges into the next, which the cumulative counts do by themselves.
            bounds = tuple(sorted(b for b in les if 0 < b < math.inf))
            total = les.get(math.inf, d["count"])
            cum = [les[b] for b in bounds] + [total]
            snap.hists[(m, spec.metric)] = _Hist(bounds, cum, d["sum"], d["count"] or total)

    def _read_counter(self, snap: _Snapshot, success: dict[str, float], c: CounterSpec,
                      samples: Iterable[Sample], profile: ServerProfile) -> None:
        for s in samples:
            if s.name.endswith("_created"):
                continue
            m = self._model_of(s.labels, profile)
            if c.role == "outcome":
                snap.requests[m] = snap.requests.get(m, 0.0) + s.value
                if c.label is not None and s.labels.get(c.label) in c.failed_values:
                    snap.failed[m] = snap.failed.get(m, 0.0) + s.value
                else:
                    snap.failed.setdefault(m, 0.0)
            elif c.role == "requests":
                snap.requests[m] = snap.requests.get(m, 0.0) + s.value
            elif c.role == "failed":
                snap.failed[m] = snap.failed.get(m, 0.0) + s.value
            else:
                success[m] = success.get(m, 0.0) + s.value

    def _events(self, prev: _Snapshot, snap: _Snapshot, ts: float, interval_s: float) -> list[dict[str, Any]]:
        t = self.target
        out: list[dict[str, Any]] = []
        moved: set[str] = set()
        models = sorted({m for m, _ in snap.hists} | set(snap.requests))
        for m in models:
            req = _delta(prev.requests.get(m), snap.requests.get(m))
            fail = _delta(prev.failed.get(m), snap.failed.get(m))
            for metric in ("e2e", "ttft", "itl"):
                h = snap.hists.get((m, metric))
                if h is None:
                    continue
                p = prev.hists.get((m, metric))
                counts = _bucket_deltas(p, h)
                n = sum(counts)
                if n <= 0:
                    continue
                moved.add(m)
                ev: dict[str, Any] = {
                    "type": "histogram", "node_id": t.node_id, "model": m, "metric": metric,
                    "ts": ts, "interval_s": interval_s, "bounds_s": list(h.bounds),
                    "counts": [round(c) for c in counts],
                    "sum_s": max(0.0, h.sum_s - (p.sum_s if p is not None else 0.0)),
                }
                if metric == "e2e" and req is None:
                    req = round(n)
                if req is not None:
                    ev["requests"] = req
                if fail is not None:
                    ev["failed"] = min(fail, req) if req is not None else fail
                _optional(ev, t.hardware, self._instance)
                out.append(ev)
            if m not in moved:
                hb: dict[str, Any] = {"type": "heartbeat", "node_id": t.node_id, "model": m, "ts": ts}
                _optional(hb, t.hardware, self._instance)
                out.append(hb)
        return out


def _optional(ev: dict[str, Any], hardware: str | None, instance: str | None) -> None:
    if hardware is not None:
        ev["hardware"] = hardware
    if instance is not None:
        ev["instance"] = instance


def _delta(before: float | None, after: float | None) -> int | None:
    if after is None:
        return None
    return max(0, round(after - (before or 0.0)))


def _bucket_deltas(prev: _Hist | None, now: _Hist) -> list[float]:
    """Non-cumulative counts per bucket (finite bounds, then +Inf) since ``prev``."""
    cum = now.cum if prev is None else [a - b for a, b in zip(now.cum, prev.cum, strict=True)]
    out, below = [], 0.0
    for c in cum:
        out.append(max(0.0, c - below))
        below = max(below, c)
    return out


def _carry_vanished(prev: _Snapshot, now: _Snapshot) -> None:
    """Keep in ``now`` the last value of each series ``prev`` had and ``now`` lacks: a server
    restarted with no request finished yet exports none, and its series come back lower."""
    for key, h in prev.hists.items():
        now.hists.setdefault(key, h)
    for model, v in prev.requests.items():
        now.requests.setdefault(model, v)
    for model, v in prev.failed.items():
        now.failed.setdefault(model, v)


def _went_down(prev: _Snapshot, now: _Snapshot) -> bool:
    """A cumulative value below the previous scrape's, or a histogram's buckets changed."""
    for key, h in now.hists.items():
        p = prev.hists.get(key)
        if p is None:
            continue
        if p.bounds != h.bounds or h.count < p.count or any(a < b for a, b in zip(h.cum, p.cum, strict=True)):
            return True
    return any(v < prev.requests.get(m, 0.0) for m, v in now.requests.items()) or \
        any(v < prev.failed.get(m, 0.0) for m, v in now.failed.items())


# ---------------------------------------------------------------- captured scrapes

_TYPE_LINE = re.compile(r"#\s+TYPE\s+(\S+)")


def capture_blocks(lines: Iterable[str]) -> Iterator[list[str]]:
    """Split a capture into blocks that each parse alone: a block ends before a ``# TYPE`` line
    for a name already typed in it (the next scrape's header) or at an ``# EOF``."""
    block: list[str] = []
    typed: set[str] = set()
    for line in lines:
        m = _TYPE_LINE.match(line)
        if m is not None:
            if m.group(1) in typed:
                yield block
                block, typed = [], set()
            typed.add(m.group(1))
        if line.strip() == "# EOF":
            yield block
            block, typed = [], set()
            continue
        block.append(line if line.endswith("\n") else line + "\n")
    if any(ln.strip() for ln in block):
        yield block


def events_from_capture(lines: Iterable[str], *, node_label: str = "instance",
                        hardware_label: str = "hardware", model_label: str = "model",
                        profile: str = "auto",
                        profiles: Mapping[str, ServerProfile] = PROFILES) -> Iterator[dict[str, Any]]:
    """Histogram events of captured scrapes (``/federate`` output taken repeatedly), in time order.

    Every sample needs the ``node_label`` label and a timestamp (ms in the text; the parser
    gives seconds); the samples of one target with one timestamp are one scrape. ``hardware`` and
    a model for servers without a model label come from the ``hardware_label`` and
    ``model_label`` labels when present. Raises :class:`ScrapeError` naming the block and sample.
    """
    convs: dict[str, TargetConverter] = {}
    scrapes: dict[tuple[float, str], list[Sample]] = {}
    for i, block in enumerate(capture_blocks(lines)):
        try:
            samples = parse_samples("".join(block))
        except ScrapeError as e:
            raise ScrapeError(f"capture block {i + 1}: {e}") from None
        for s in samples:
            node = s.labels.get(node_label)
            if not node or s.ts is None:
                what = f"no {node_label!r} label" if not node else "no timestamp"
                raise ScrapeError(f"capture block {i + 1}: sample {s.name} has {what}; a capture is"
                                  f" /federate output: every sample has {node_label!r} and a timestamp")
            scrapes.setdefault((s.ts, node), []).append(s)
            if node not in convs:
                convs[node] = TargetConverter(Target(node, s.labels.get(model_label) or None,
                                                     s.labels.get(hardware_label) or None, profile), profiles)
    for ts, node in sorted(scrapes):
        yield from convs[node].observe_samples(scrapes[(ts, node)], ts)
