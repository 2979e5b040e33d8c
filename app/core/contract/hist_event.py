"""The histogram form of the latency-event contract: decode and validate one interval's buckets.

Owns :class:`HistogramBatch` and :func:`parse_histogram` (called by :func:`tailguard.core.contract.events.parse_event`
for ``"type": "histogram"``): what ``tailguard scrape`` and any other producer send for servers
that export latency histograms instead of per-request events (docs/contracts.md). One event is
one (node, model, metric) and one scrape interval: the NON-cumulative count of observations per
bucket since the previous scrape.

Guarantees: bad input raises :class:`~tailguard.core.contract.errors.BadEvent` with a reason from
``tailguard.core.contract.events.REASONS`` (``bad_histogram``, ``bad_metric``, ``bad_interval`` and the shared
ones for ids, ``ts`` and optional strings) and a message naming the field; a returned batch has
finite, strictly ascending, positive bounds (at most :data:`MAX_BUCKETS`), one more count than
bounds (the last is +Inf), integer counts in [0, :data:`MAX_COUNT`], ``failed <= requests``, and
``sum_s`` for a bucketless mean (``bounds_s: []``, Triton's counters).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tailguard.core.contract.errors import BadEvent

METRICS: Final = ("e2e", "ttft", "itl")
MAX_BUCKETS: Final = 256
MAX_COUNT: Final = 1_000_000_000
MAX_INTERVAL_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class HistogramBatch:
    """One scrape interval of one latency histogram of one (node_id, model)."""

    node_id: str
    model: str
    hardware: str | None
    metric: str                        # "e2e" | "ttft" | "itl"
    ts: float                          # end of the interval (scrape time), Unix s
    interval_s: float
    bounds_s: tuple[float, ...]        # finite upper bounds, ascending; () = a mean only
    counts: tuple[int, ...]            # per bucket, len(bounds_s) + 1 (the last is +Inf)
    sum_s: float | None = None
    requests: int | None = None
    failed: int | None = None
    instance: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.node_id, self.model)

    @property
    def observations(self) -> int:
        return sum(self.counts)


def _num(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def _count(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if _num(v) and 0 <= v <= MAX_COUNT and v == int(v):
        return int(v)
    raise BadEvent("bad_histogram", f"{key} must be an integer in [0, {MAX_COUNT}], got {v!r:.40}",
                   field=key)


def parse_histogram(d: Mapping[str, Any], node_id: str, model: str, hardware: str | None,
                    ts: float, instance: str | None) -> HistogramBatch:
    """The histogram fields of ``d`` (ids, ``ts``, ``hardware`` and ``instance`` already checked
    by the caller, as for every form)."""
    metric = d.get("metric")
    if metric not in METRICS:
        raise BadEvent("bad_metric" if metric is not None else "missing_field",
                       f"metric must be one of {', '.join(METRICS)}, got {metric!r:.40}", field="metric")
    interval = d.get("interval_s")
    if interval is None:
        raise BadEvent("missing_field", "interval_s is required (seconds since the previous scrape)",
                       field="interval_s")
    if not _num(interval) or not 0 < interval <= MAX_INTERVAL_S:
        raise BadEvent("bad_interval", f"interval_s must be a number in (0, {MAX_INTERVAL_S:g}],"
                       f" got {interval!r:.40}", field="interval_s")
    bounds, counts = d.get("bounds_s"), d.get("counts")
    if bounds is None or counts is None:
        key = "bounds_s" if bounds is None else "counts"
        raise BadEvent("missing_field", f"{key} is required (a list)", field=key)
    if type(bounds) is not list or type(counts) is not list:
        raise BadEvent("bad_histogram", "bounds_s and counts must be lists", field="bounds_s")
    if len(bounds) > MAX_BUCKETS:
        raise BadEvent("too_long", f"bounds_s has {len(bounds)} entries; at most {MAX_BUCKETS}",
                       field="bounds_s")
    if not all(_num(b) and b > 0 for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise BadEvent("bad_histogram", "bounds_s must be finite seconds > 0, strictly ascending"
                       f" (the +Inf bucket is implied), got {bounds!r:.80}", field="bounds_s")
    if len(counts) != len(bounds) + 1:
        raise BadEvent("bad_histogram", f"counts must have len(bounds_s) + 1 = {len(bounds) + 1}"
                       f" entries (the last is +Inf), got {len(counts)}", field="counts")
    if not all(_num(c) and 0 <= c <= MAX_COUNT and c == int(c) for c in counts):
        raise BadEvent("bad_histogram", "counts must be integers in [0, 1e9] (observations per"
                       f" bucket in the interval, not cumulative), got {counts!r:.80}", field="counts")
    sum_s = d.get("sum_s")
    if sum_s is not None and (not _num(sum_s) or sum_s < 0):
        raise BadEvent("bad_histogram", f"sum_s must be a finite number >= 0, got {sum_s!r:.40}",
                       field="sum_s")
    n = sum(int(c) for c in counts)
    if not bounds and n > 0 and sum_s is None:
        raise BadEvent("missing_field", "a histogram without bounds (a mean) needs sum_s", field="sum_s")
    requests, failed = _count(d, "requests"), _count(d, "failed")
    if requests is not None and failed is not None and failed > requests:
        raise BadEvent("bad_histogram", f"failed ({failed}) must be <= requests ({requests})",
                       field="failed")
    return HistogramBatch(node_id, model, hardware, str(metric), float(ts), float(interval),
                          tuple(float(b) for b in bounds), tuple(int(c) for c in counts),
                          None if sum_s is None else float(sum_s), requests, failed, instance)
