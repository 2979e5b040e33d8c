"""A histogram model's recent slow-down estimates: what one window cannot see, several can.

Owns :class:`HistTrend`, per model: for each node and each (metric, class) key, its relative log
slow-downs of the windows of the last ``max_sample_age_s`` (against each window's peer centre,
with their standard errors), and each key's peer spread of single-window estimates. A window of
30 s sees a node 1.3x slower through noise as wide as the slow-down (TGI's e2e buckets, Triton's
mean per interval of heavy-tailed requests); the mean of a node's last windows has a standard
error ``sqrt(k)`` times smaller (:meth:`HistTrend.averages` takes their median: a window whose mean a
few long requests moved is outvoted), and the band it is judged against (:func:`trend_noise`)
shrinks with it.

Guarantees: pure (``now_s`` is passed); an estimate older than the horizon, or of a node
:meth:`~HistTrend.drop`-ped, is never used; estimates are relative to the window's own peer
centre (a load event moves no node); ``to_dict``/``from_dict`` round-trip exactly. Rationale and
measurements: docs/rules.md (Routing weights, Histogram models).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.core.judge.peers import median
from tailguard.core.judge.weights import MAD_SIGMA, MEDIAN_SE, log_spread

# A node's windows count in the pooled window noise from this many on (deviations around the
# median of two are half their difference: too small).
MIN_POOLED = 4
# A node's trend is judged from this many windows on: their median outvotes one odd window.
MIN_WINDOWS = 3


@dataclass(frozen=True, slots=True)
class Average:
    """A node's relative log slow-down over its last windows on one key."""

    rel: float          # median of the windows' log slow-downs against their peer centres
    se: float           # its standard error from the windows' own (counts) errors
    windows: int


@dataclass
class HistTrend:
    """Recent estimates of a model's histogram nodes (module docstring). Mutable, per model."""

    # node -> key -> [(ts, log slow-down against the window's centre, its standard error)]
    rel: dict[str, dict[str, list[tuple[float, float, float]]]] = field(default_factory=dict)
    # key -> [(ts, robust spread of the window's peer estimates)]
    spread: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def record(self, key: str, now_s: float, horizon_s: float,
               est: Mapping[str, tuple[float, float]], spread: float) -> None:
        """One window's estimates (node -> (relative log slow-down, SE)) and peer spread on
        ``key``; estimates older than ``horizon_s`` dropped."""
        cut = now_s - horizon_s
        for node, (rel, se) in est.items():
            rows = self.rel.setdefault(node, {}).setdefault(key, [])
            if rows and rows[-1][0] >= now_s:
                rows.pop()                         # the same tick again (a replayed window)
            rows.append((now_s, rel, se))
        rows_s = self.spread.setdefault(key, [])
        if rows_s and rows_s[-1][0] >= now_s:
            rows_s.pop()
        rows_s.append((now_s, spread))
        self.spread[key] = [r for r in rows_s if r[0] > cut]
        for node in list(self.rel):
            per = self.rel[node]
            if key in per:
                kept = [r for r in per[key] if r[0] > cut]
                if kept:
                    per[key] = kept
                else:
                    del per[key]
            if not per:
                del self.rel[node]

    def averages(self, key: str, nodes: Mapping[str, object]) -> dict[str, Average]:
        """The :class:`Average` of each of ``nodes`` with at least :data:`MIN_WINDOWS` estimates on
        ``key``: the median of its windows' (a window whose mean a few long requests moved is one
        of several)."""
        out = {}
        for node in nodes:
            rows = self.rel.get(node, {}).get(key)
            if rows and len(rows) >= MIN_WINDOWS:
                k = len(rows)
                se = MEDIAN_SE * math.sqrt(sum(r[2] ** 2 for r in rows) / k) / math.sqrt(k)
                out[node] = Average(median([r[1] for r in rows]), se, k)
        return out

    def window_noise(self, key: str) -> float:
        """A single window's noise on ``key`` (log units, robust): the larger of the median of its
        recent peer spreads and the pooled spread of every node's windows around its own median
        (many windows: steadier than a spread of three peers)."""
        rows_s = self.spread.get(key)
        peers = median([s for _, s in rows_s]) if rows_s else 0.0
        dev = []
        for per in self.rel.values():
            rows = per.get(key)
            if rows and len(rows) >= MIN_POOLED:
                m = median([r[1] for r in rows])
                dev += [abs(r[1] - m) for r in rows]
        return max(peers, MAD_SIGMA * median(dev) if dev else 0.0)

    def drop(self, node: str) -> None:
        self.rel.pop(node, None)

    def to_dict(self) -> dict[str, Any]:
        return {"rel": {n: {k: [list(r) for r in rows] for k, rows in sorted(per.items())}
                        for n, per in sorted(self.rel.items())},
                "spread": {k: [list(r) for r in rows] for k, rows in sorted(self.spread.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HistTrend:
        return cls({str(n): {str(k): [(float(ts), float(r), float(se)) for ts, r, se in rows]
                             for k, rows in per.items()} for n, per in d.get("rel", {}).items()},
                   {str(k): [(float(ts), float(s)) for ts, s in rows] for k, rows in d.get("spread", {}).items()})


def peer_spread(avgs: Mapping[str, Average]) -> float:
    """The robust spread of the nodes' averages (0.0 for fewer than two)."""
    return log_spread([math.exp(v.rel) for v in avgs.values()]) if len(avgs) > 1 else 0.0


def trend_noise(a: Average, peers: float, window: float) -> float:
    """The standard deviation (log units) of a healthy node's :class:`Average` ``a``: the largest
    of the peers' robust spread of averages (``peers``: :func:`peer_spread`), a single window's
    noise (``window``: :meth:`HistTrend.window_noise`) as a median of ``k`` windows
    (``sqrt(pi/2 / k)``), and the node's own SE."""
    return max(peers, MEDIAN_SE * window / math.sqrt(a.windows), a.se)
