"""Stage 1 for histogram pairs: the bucket counts of the last intervals, and their summary.

Owns :class:`HistWindows`: for every (node_id, model) that sends histogram events
(:class:`~tailguard.core.contract.hist_event.HistogramBatch`), per metric (``e2e``, ``ttft``, ``itl``) the
intervals of the last ``max_sample_age_s`` — NOT samples: one row of bucket counts per scrape
interval. :meth:`HistWindows.summarize` turns them into the histogram part of a
:class:`~tailguard.core.contract.types.WindowSummary` at a tick: the window is the newest intervals (all
after the pair's ``judge_since`` cut, all with the newest bounds) that span at least
``tick_interval_s`` and hold ``min_samples`` requests, up to the age bound; their counts are
summed per bucket and sent to stage 2 in ``extra["hist"]`` (:mod:`tailguard.core.judge.hist_rules` judges
them), with the end of the newest interval that had requests (``extra["last_request_ts"]``).
``p50``/``p99`` of the summary are Prometheus-style interpolations (:func:`bucket_quantile`),
for dashboards and fleet events only: no node verdict rests on them.

Guarantees: pure; a window never mixes bounds (a server whose buckets changed restarts, see
app/scrape/convert.py, and its older intervals are dropped); a new ``instance`` drops the
pair's intervals from before it; ``snapshot()``/``restore()`` are plain JSON-able data.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.hist_event import HistogramBatch

PREFERENCE: Final = ("itl", "ttft", "e2e")     # per-token first, as the event path prefers tpot
US_PER_S: Final = 1e6
# extra key of a histogram pair's summary: the end of its newest interval with requests (the
# stall rule wants a sign of life after it: a scrape that did not come yet is no stall).
LAST_REQUEST_TS: Final = "last_request_ts"


@dataclass(frozen=True, slots=True)
class Interval:
    ts: float
    interval_s: float
    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    requests: int
    sum_s: float | None


@dataclass(frozen=True, slots=True)
class HistWindow:
    """One metric's window: counts summed per bucket over its intervals."""

    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    requests: int
    sum_s: float | None
    span_s: float

    @property
    def observations(self) -> int:
        return sum(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {"bounds_s": list(self.bounds_s), "counts": list(self.counts), "requests": self.requests,
                "sum_s": self.sum_s, "span_s": self.span_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HistWindow | None:
        """None for anything that is not a window (a summary from a broken stage 1)."""
        try:
            bounds = tuple(float(b) for b in d["bounds_s"])
            counts = tuple(int(c) for c in d["counts"])
            requests = int(d["requests"])
            sum_s = None if d.get("sum_s") is None else float(d["sum_s"])
            span = float(d.get("span_s", 0.0))
        except (KeyError, TypeError, ValueError):
            return None
        if len(counts) != len(bounds) + 1 or min(counts, default=0) < 0 or requests < 0:
            return None
        return cls(bounds, counts, requests, sum_s, span)


def bucket_quantile(bounds_s: tuple[float, ...], counts: tuple[int, ...], q: float,
                    sum_s: float | None = None) -> float | None:
    """``histogram_quantile``'s interpolation (seconds): linear within the bucket holding the
    q-th observation (the first bucket from 0), the highest finite bound when it is in +Inf;
    the mean for a bucketless window; None without observations."""
    n = sum(counts)
    if n <= 0:
        return None
    if not bounds_s:
        return None if sum_s is None else sum_s / n
    rank = q * n
    below = 0
    for i, c in enumerate(counts):
        if i == len(bounds_s):
            return bounds_s[-1]
        if below + c >= rank and c > 0:
            lo = bounds_s[i - 1] if i > 0 else 0.0
            return lo + (bounds_s[i] - lo) * (rank - below) / c
        below += c
    return bounds_s[-1]


class HistWindows:
    """The intervals of every histogram pair (module docstring)."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self._series: dict[tuple[str, str], dict[str, deque[Interval]]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def keys(self) -> Iterable[tuple[str, str]]:
        return self._series.keys()

    def forget(self, key: tuple[str, str]) -> None:
        self._series.pop(key, None)

    def restarted(self, key: tuple[str, str], at_ts: float) -> None:
        """A new process from ``at_ts`` on: its predecessor's intervals are no evidence about it."""
        for q in self._series.get(key, {}).values():
            while q and q[0].ts - q[0].interval_s < at_ts - 1e-6:
                q.popleft()

    def observe(self, ev: HistogramBatch) -> None:
        per = self._series.setdefault(ev.key, {})
        q = per.get(ev.metric)
        if q is None:
            q = per[ev.metric] = deque()
        requests = ev.requests if ev.requests is not None and ev.metric != "e2e" else ev.observations
        if ev.metric == "itl" and ev.requests is None:
            requests = 0       # token gaps are no request count; the window takes it from e2e
        iv = Interval(ev.ts, ev.interval_s, ev.bounds_s, ev.counts, requests, ev.sum_s)
        if q and q[-1].ts > ev.ts:          # out of order: keep the deque in event time
            items = sorted([*q, iv], key=lambda x: x.ts)
            q.clear()
            q.extend(items)
        else:
            q.append(iv)
        horizon = q[-1].ts - self.settings.max_sample_age_s - self.settings.tick_interval_s
        while q and q[0].ts < horizon:
            q.popleft()

    def windows(self, key: tuple[str, str], now_s: float, since: float | None) -> dict[str, HistWindow]:
        """Per metric, the window at tick ``now_s`` (module docstring); metrics without one left out."""
        st = self.settings
        per = self._series.get(key)
        if not per:
            return {}
        out: dict[str, HistWindow] = {}
        e2e_requests = _requests_by_ts(per.get("e2e"))
        for metric, q in per.items():
            w = _window(q, now_s, since, st, e2e_requests if metric == "itl" else None)
            if w is not None:
                out[metric] = w
        return out

    def summary_fields(self, key: tuple[str, str], now_s: float, since: float | None) -> dict[str, Any] | None:
        """The fields of a histogram pair's summary (``signal``, ``samples``, ``p50``/``p99`` in
        µs, raw-latency quantiles from e2e, ``extra["hist"]``); None if the pair has none."""
        if key not in self._series:
            return None
        wins = self.windows(key, now_s, since)
        metric = next((m for m in PREFERENCE if m in wins and wins[m].requests > 0), None)
        extra: dict[str, Any] = {"hist": {m: w.to_dict() for m, w in wins.items()}}
        last = _last_request_ts(self._series[key].get("e2e"))
        if last is not None:
            extra[LAST_REQUEST_TS] = last
        fields: dict[str, Any] = {"signal": f"{metric or PREFERENCE[-1]}_hist", "samples": 0,
                                  "p50": None, "p99": None, "extra": extra}
        if metric is not None:
            w = wins[metric]
            p50, p99 = _quantiles_us(w)
            fields.update(samples=w.requests, p50=p50, p99=p99)
            if since is not None:
                fields.update(probe_samples=w.requests, probe_p50=p50, probe_p99=p99)
        e2e = wins.get("e2e")
        if e2e is not None:
            fields["latency_p50_us"], fields["latency_p99_us"] = _quantiles_us(e2e)
        return fields

    # ---------------------------------------------------------------- snapshot

    def snapshot_of(self, key: tuple[str, str]) -> dict[str, list[list[Any]]] | None:
        per = self._series.get(key)
        if per is None:
            return None
        return {m: [[iv.ts, iv.interval_s, list(iv.bounds_s), list(iv.counts), iv.requests, iv.sum_s]
                    for iv in q] for m, q in per.items()}

    def restore_of(self, key: tuple[str, str], data: Mapping[str, Any]) -> None:
        self._series[key] = {m: deque(Interval(float(ts), float(iv_s), tuple(float(b) for b in bounds),
                                               tuple(int(c) for c in counts), int(req),
                                               None if sum_s is None else float(sum_s))
                                      for ts, iv_s, bounds, counts, req, sum_s in rows)
                             for m, rows in data.items()}


def _last_request_ts(q: deque[Interval] | None) -> float | None:
    """The end of the newest e2e interval with a request in it (None: none kept)."""
    for iv in reversed(q or ()):
        if iv.requests > 0:
            return iv.ts
    return None


def _requests_by_ts(q: deque[Interval] | None) -> dict[float, int]:
    return {} if q is None else {iv.ts: iv.requests for iv in q}


def _window(q: deque[Interval], now_s: float, since: float | None, st: DetectorSettings,
            requests_at: Mapping[float, int] | None) -> HistWindow | None:
    age_lo = now_s - st.max_sample_age_s
    bounds: tuple[float, ...] | None = None
    counts: list[int] = []
    requests = 0
    sum_s: float | None = 0.0
    lo = hi = None
    for iv in reversed(q):
        if iv.ts > now_s:
            continue
        start = iv.ts - iv.interval_s
        if iv.ts <= age_lo or (since is not None and start < since - 1e-6):
            break
        if bounds is None:
            bounds, counts = iv.bounds_s, [0] * len(iv.counts)
        elif iv.bounds_s != bounds:
            break
        counts = [a + b for a, b in zip(counts, iv.counts, strict=True)]
        requests += iv.requests if requests_at is None or iv.requests else requests_at.get(iv.ts, 0)
        sum_s = None if sum_s is None or iv.sum_s is None else sum_s + iv.sum_s
        hi = iv.ts if hi is None else hi
        lo = start
        if hi - lo >= st.tick_interval_s - 1e-6 and requests >= st.min_samples:
            break
    if bounds is None or lo is None or hi is None:
        return None
    return HistWindow(bounds, tuple(counts), requests, sum_s, hi - lo)


def _quantiles_us(w: HistWindow) -> tuple[float | None, float | None]:
    p50 = bucket_quantile(w.bounds_s, w.counts, 0.5, w.sum_s)
    p99 = bucket_quantile(w.bounds_s, w.counts, 0.99, w.sum_s)
    return (None if p50 is None else p50 * US_PER_S, None if p99 is None else p99 * US_PER_S)
