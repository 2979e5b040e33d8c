"""Each histogram pair's own baseline: an EWMA of its windows' CDFs at the bucket bounds.

Owns :class:`HistBaselines`, per (node, metric) of one model: the CDF of its windows at their
finite bounds folded into an exponentially weighted mean (half-life ``HALF_LIFE_S`` of event
time, as the sample path's own P50 baselines in :mod:`tailguard.core.judge.own_history`), and for
bucketless windows (Triton's counters) the log of the mean. Which windows are folded, and how a
baseline judges a node, is :mod:`tailguard.core.judge.hist_own`'s.

Guarantees: pure data and arithmetic (``now_s`` is passed; no clock); a baseline holds one set of
bounds (a window of other bounds starts it over); :meth:`HistBaselines.ready` only after
``MIN_TICKS`` windows; plain-data snapshot (:meth:`HistBaselines.to_dict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.core.judge.own_history import HALF_LIFE_S, MIN_TICKS
from tailguard.core.window.hist_window import HistWindow


@dataclass(frozen=True, slots=True)
class HistBaseline:
    """One pair's baseline on one metric: the EWMA of its windows' CDFs at ``bounds_s`` (the
    log of the mean per observation, bucketless), how many windows it took, when the last."""

    bounds_s: tuple[float, ...]
    cdf: tuple[float, ...]
    log_mean_s: float | None
    ticks: int
    ts: float

    def to_list(self) -> list[Any]:
        return [list(self.bounds_s), list(self.cdf), self.log_mean_s, self.ticks, self.ts]

    @classmethod
    def from_list(cls, v: Any) -> HistBaseline:
        bounds, cdf, log_mean, ticks, ts = v
        return cls(tuple(float(b) for b in bounds), tuple(float(c) for c in cdf),
                   None if log_mean is None else float(log_mean), int(ticks), float(ts))


def cdf_of(w: HistWindow) -> tuple[float, ...]:
    """``w``'s CDF at its finite bounds (exact: bucket edges only)."""
    n, acc, out = w.observations, 0, []
    for c in w.counts[:-1]:
        acc += c
        out.append(acc / n)
    return tuple(out)


def _log_mean(w: HistWindow) -> float | None:
    if w.sum_s is None or w.sum_s <= 0:
        return None
    return math.log(w.sum_s / w.observations)


@dataclass(slots=True)
class HistBaselines:
    """The baselines of one model's histogram pairs: node -> metric -> :class:`HistBaseline`."""

    nodes: dict[str, dict[str, HistBaseline]] = field(default_factory=dict)

    def drop(self, node: str) -> None:
        self.nodes.pop(node, None)

    def update(self, node: str, metric: str, w: HistWindow, now_s: float) -> None:
        """Fold one window into ``node``'s baseline on ``metric`` (other bounds: start over)."""
        per = self.nodes.setdefault(node, {})
        old = per.get(metric)
        cur, cur_mean = cdf_of(w), _log_mean(w)
        if old is None or old.bounds_s != w.bounds_s:
            per[metric] = HistBaseline(w.bounds_s, cur, cur_mean, 1, now_s)
            return
        alpha = 1.0 - 0.5 ** (max(0.0, now_s - old.ts) / HALF_LIFE_S)
        cdf = tuple(a + alpha * (b - a) for a, b in zip(old.cdf, cur, strict=True))
        log_mean = (cur_mean if old.log_mean_s is None else old.log_mean_s if cur_mean is None
                    else old.log_mean_s + alpha * (cur_mean - old.log_mean_s))
        per[metric] = HistBaseline(w.bounds_s, cdf, log_mean, old.ticks + 1, now_s)

    def ready(self, node: str, metric: str, bounds_s: tuple[float, ...]) -> HistBaseline | None:
        """``node``'s baseline on ``metric`` if it has ``MIN_TICKS`` windows of ``bounds_s``."""
        b = self.nodes.get(node, {}).get(metric)
        return b if b is not None and b.ticks >= MIN_TICKS and b.bounds_s == bounds_s else None

    def to_dict(self) -> dict[str, Any]:
        return {n: {m: b.to_list() for m, b in sorted(per.items())} for n, per in sorted(self.nodes.items())}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HistBaselines:
        return cls({str(n): {str(m): HistBaseline.from_list(v) for m, v in per.items()}
                    for n, per in d.items()})
