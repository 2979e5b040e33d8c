"""Histogram models whose buckets cannot resolve them: each node's window mean judged too.

Owns :class:`MeanRef`: one hardware class's peers on one metric of a model whose buckets cannot
resolve it (:func:`tailguard.core.judge.hist_resolution.unresolved`: most requests below the
first bound, where a node a few times slower still looks like its peers). What the scrape does
carry there is each window's mean (``sum_s / observations``: vLLM, SGLang, TGI and Dynamo export
``_sum`` beside ``_count``): the reference is the peers' median log mean and the robust spread of
their log means. :meth:`MeanRef.judge` makes a node abnormal (``relative_p50``) when its mean is
more than ``relative_p50_factor`` times the median and past ``Z`` times a window's noise (the
peers' spread, times ``sqrt(median requests / its requests)``: a mean of fewer requests is
noisier); a smaller slow-down is the routing weights' (the median of recent windows' means,
:mod:`tailguard.core.judge.hist_weights`). :func:`as_means` makes such a model's summary P50s
their window means (an interpolation inside the first bucket is flat: a fleet-wide swing under
it moved no baseline and raised no fleet event).

Guarantees: pure; no reference from fewer than ``min_peers`` windows with sums; relabelling
nodes changes nothing; a node within ``Z`` times the peers' noise is never abnormal. Rationale
and measurements: docs/scrape.md (Resolution), docs/replay.md (Backtests).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import Reason, WindowSummary
from tailguard.core.judge.health import Evidence, Judgement, Verdict
from tailguard.core.judge.peers import median
from tailguard.core.judge.weights import log_spread
from tailguard.core.window.hist_window import US_PER_S, HistWindow

# A node's mean must be this many of a window's standard deviations above the peers' median.
Z: Final = 3.0


def window_mean_s(w: HistWindow) -> float | None:
    """``w``'s mean (s) from its sum; None without a positive sum."""
    return w.sum_s / w.observations if w.sum_s is not None and w.sum_s > 0 and w.observations else None


@dataclass(frozen=True, slots=True)
class MeanRef:
    """The peers' window means on one unresolved metric of one class (module docstring)."""

    mean_s: float          # the median of the peers' means (geometric: of their logs)
    spread: float          # the robust spread of their log means
    requests: float        # the median of their request counts
    peers: int

    @classmethod
    def of(cls, wins: Sequence[HistWindow], min_peers: int) -> MeanRef | None:
        rows = [(math.log(m), float(min(w.requests, w.observations)))
                for w in wins if (m := window_mean_s(w)) is not None]
        if len(rows) < min_peers:
            return None
        centre = median([lm for lm, _ in rows])
        return cls(math.exp(centre), log_spread([math.exp(lm - centre) for lm, _ in rows]),
                   median([n for _, n in rows]), len(rows))

    def limit(self, w: HistWindow, st: DetectorSettings) -> float:
        """The factor over :attr:`mean_s` past which ``w``'s mean is abnormal."""
        n = max(1, min(w.requests, w.observations))
        noise = self.spread * math.sqrt(max(1.0, self.requests / n))
        return max(st.relative_p50_factor, math.exp(Z * noise))

    def judge(self, metric: str, w: HistWindow, st: DetectorSettings, ev: Evidence) -> Judgement | None:
        """``w``'s mean against the peers' (``ev``: the bucket verdict's evidence, given the
        means); None when ``w`` has no sum."""
        mean = window_mean_s(w)
        if mean is None:
            return None
        lim = self.limit(w, st)
        sev = mean / (lim * self.mean_s)
        ev = dataclasses.replace(ev, p50=mean * US_PER_S, p99=None, ratio=None, peers_p50=self.mean_s * US_PER_S)
        if sev > 1.0:
            return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, sev,
                             f"{metric} mean {mean:.3g} s > {lim:.3g} x the peers' median mean"
                             f" ({self.mean_s:.3g} s, {self.peers} peers): its buckets cannot resolve"
                             " the model (most requests below the first bound), its mean can")
        return Judgement(Verdict.NORMAL, Reason.NORMAL.value, ev, sev)


def as_means(by_node: Mapping[str, WindowSummary], unresolved: Collection[str],
             suffix: str) -> dict[str, WindowSummary]:
    """``by_node`` with each histogram summary's ``p50``/``p99`` (of its signal's metric: the
    signal less ``suffix``) replaced by its window mean (µs) when that metric is in
    ``unresolved``, as Triton's counters give theirs (the baselines, fleet events and statuses
    read them); a summary without a window sum there is unchanged."""
    out = {}
    for node, s in by_node.items():
        metric = s.signal.removesuffix(suffix)
        raw = s.extra.get("hist") if s.extra and metric in unresolved else None
        d = raw.get(metric) if isinstance(raw, Mapping) else None
        w = HistWindow.from_dict(d) if isinstance(d, Mapping) else None
        m = None if w is None else window_mean_s(w)
        out[node] = s if m is None else s._replace(p50=m * US_PER_S, p99=m * US_PER_S)
    return out
