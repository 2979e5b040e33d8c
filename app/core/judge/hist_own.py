"""A histogram pair judged against its own history when its class has too few peers.

A scraped model of two nodes (or a hardware class of fewer than ``min_peers``) has no peer
CDF to compare a node with. Its own baseline (:mod:`tailguard.core.judge.hist_baselines`: the
EWMA of its windows' CDFs at the bucket bounds) stands in, fed by :func:`fold` with healthy
windows not judged abnormal. :class:`OwnHist` judges a node on a metric whose class has no
reference by the same exceedance tests as against peers (:func:`own_reference` into
:func:`tailguard.core.judge.hist_rules.judge_metric`): at a bound, the exact share of its
requests above it against what it would show there were it ``MIN_FACTOR`` times slower than
its own past, so no bucket-rounding (no interpolated quantile) ever makes a verdict.
Movement of the others: a node is not judged on its own history while at least half of the
model's other pairs with a ready baseline have provably moved from theirs too
(:func:`moved`: a shared change, not a node fault). On a metric the buckets cannot resolve its
mean is judged against its baseline's too (``relative_p50_factor``), and moves it.

Guarantees: pure (``now_s`` is passed; no clock); a window is only compared with a ready baseline
of the same bounds; no verdict without another pair to tell a shared change from a fault.
Rationale: docs/rules.md (Histogram pairs).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Final

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.health import Judgement, PairState, Verdict
from tailguard.core.judge.hist_baselines import HistBaseline, HistBaselines
from tailguard.core.judge.hist_mean import MeanRef
from tailguard.core.judge.hist_rules import Reference, Z, judge_metric, share_above, windows_of
from tailguard.core.window.hist_window import HistWindow

# A window has moved from its baseline when its share above a bound (from the baseline's
# median bound up) grew by more than this and Z binomial standard deviations; a bucketless
# window when its mean is this factor above the baseline's.
MOVED_GAP: Final = 0.1
MOVED_MEAN_FACTOR: Final = 1.25


def own_reference(b: HistBaseline) -> Reference:
    """The baseline as a reference of one (the node's past self)."""
    return Reference.of(b.bounds_s, b.cdf, 1,
                        None if b.log_mean_s is None else math.exp(b.log_mean_s))


def moved(w: HistWindow, b: HistBaseline, requests: int, *, by_mean: bool = False) -> bool:
    """``w`` provably slower than its own baseline at all (module docstring); ``by_mean``: its
    mean counts too (a metric the buckets cannot resolve: a change under the first bound)."""
    by_mean_moved = (b.log_mean_s is not None and w.sum_s is not None and w.sum_s > 0
                     and math.log(w.sum_s / w.observations) > b.log_mean_s + math.log(MOVED_MEAN_FACTOR))
    if not b.bounds_s or (by_mean and by_mean_moved):
        return by_mean_moved
    k50 = next((k for k, f in enumerate(b.cdf) if f >= 0.5), None)
    if k50 is None:
        return False
    n = max(1, requests)
    for j in range(k50, len(b.bounds_s)):
        base = 1.0 - b.cdf[j]
        if share_above(w, j) > base + max(MOVED_GAP, Z * math.sqrt(base * (1.0 - base) / n)):
            return True
    return False


class OwnHist:
    """One model's own-history fallback at one tick (:class:`tailguard.core.judge.hist_rules.OwnFallback`):
    the baselines, and which peers have moved from theirs (per metric)."""

    def __init__(self, base: HistBaselines, peers: Mapping[str, WindowSummary], st: DetectorSettings,
                 unresolved: Collection[str] = ()) -> None:
        """``unresolved``: the metrics the model's buckets cannot resolve (hist_resolution), on
        which a node's window mean is judged against its baseline's too, and moves it."""
        self.base = base
        self.st = st
        self._peers = peers
        self._unresolved = unresolved
        self._moved: dict[str, dict[str, bool]] | None = None      # on first use (few ticks need it)

    def _moved_by_metric(self) -> dict[str, dict[str, bool]]:
        if self._moved is None:
            self._moved = {}
            for node, s in self._peers.items():
                for metric, w in (windows_of(s) or {}).items():
                    b = self.base.ready(node, metric, w.bounds_s) if w.requests >= self.st.min_samples else None
                    if b is not None:
                        self._moved.setdefault(metric, {})[node] = moved(
                            w, b, min(w.requests, w.observations), by_mean=metric in self._unresolved)
        return self._moved

    def judge(self, metric: str, w: HistWindow, s: WindowSummary) -> Judgement | None:
        """``w`` against its node's own baseline; None without a ready baseline, without another
        pair with one to tell a shared change from a fault, or while half the others moved."""
        b = self.base.ready(s.node_id, metric, w.bounds_s)
        if b is None:
            return None
        others = [m for n, m in self._moved_by_metric().get(metric, {}).items() if n != s.node_id]
        if not others or 2 * sum(others) >= len(others):
            return None
        j = judge_metric(metric, w, own_reference(b), s, self.st, own=True)
        if (j.verdict is not Verdict.ABNORMAL and metric in self._unresolved and b.log_mean_s is not None
                and j.evidence is not None):
            ref = MeanRef(math.exp(b.log_mean_s), 0.0, float(min(w.requests, w.observations)), 1)
            by_mean = ref.judge(metric, w, self.st, j.evidence, own=True)
            if by_mean is not None and by_mean.verdict is Verdict.ABNORMAL:
                return by_mean
        return j


def fold(base: HistBaselines, pairs: Mapping[str, PairState], peers: Mapping[str, WindowSummary],
         judgements: Mapping[str, Judgement], now_s: float, st: DetectorSettings) -> None:
    """Fold the healthy peers' windows not judged abnormal (and of ``min_samples`` requests)
    into their baselines."""
    for node, s in peers.items():
        p = pairs[node]
        j = judgements.get(node)
        if p.state is not HealthState.HEALTHY or p.abnormal_streak or (
                j is not None and j.verdict is Verdict.ABNORMAL):
            continue
        for metric, w in (windows_of(s) or {}).items():
            if w.requests >= st.min_samples:
                base.update(node, metric, w, now_s)
