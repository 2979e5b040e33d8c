"""Stage 2 for histogram pairs: exceedance tests that respect the buckets' resolution.

Owns the verdicts on pairs whose summaries carry bucket counts (``extra["hist"]``, from
:mod:`tailguard.core.window.hist_window`); no rule here compares an interpolated quantile. Per
metric and hardware class the reference is the pointwise median of the peers' CDFs at the
bounds (``b50``/``b99``: the first bounds where it reaches 0.5/0.99). At a bound ``b`` a peer
``MIN_FACTOR`` (1.5) times slower can show at most :func:`shifted_share` above it (1 − the
reference at the largest bound ≤ b / 1.5). A node is judged by the exact share of its requests
above a bound from ``b50`` up against that: ``relative_p50`` when it exceeds
``max(P50_SHARE, shifted + P50_GAP)`` by ``Z`` binomial standard deviations (of requests),
``relative_p99`` (from ``b99`` up) when it is at least ``max(P99_SHARE, P99_FACTOR × shifted)``
with binomial p < ``ALPHA`` (that share, not significant: no verdict, a streak held). Bucketless
windows (Triton's counters): their mean. A node whose bounds differ from the class's (a server
version with other buckets) is tested at its own bounds against the peers' CDF at their largest
bound below (exact, monotone); fewer than ``min_peers`` peers: own history (:class:`OwnFallback`).
Any metric abnormal makes the node abnormal (per-token first); where the buckets cannot resolve
the model (below the first bound), its window mean too (:mod:`~tailguard.core.judge.hist_mean`).

Guarantees: pure; verdicts depend on counts (and sums) only, not on labels; a shift the buckets
cannot prove above ``MIN_FACTOR`` is a fault only by the mean. Why: docs/rules.md, docs/scrape.md.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, Reason, WindowSummary
from tailguard.core.judge import health
from tailguard.core.judge.admission import admitting
from tailguard.core.judge.health import Evidence, Judgement, PairState, Verdict
from tailguard.core.judge.hist_mean import MeanRef
from tailguard.core.judge.model_state import PairTable
from tailguard.core.judge.peers import PeerSet, hw_class, median
from tailguard.core.judge.rules import binomial_sf
from tailguard.core.window.hist_window import PREFERENCE, US_PER_S, HistWindow, bucket_quantile

HIST_SIGNAL: Final = "_hist"     # the signal of a histogram pair's summary ends so ("itl_hist")
# A node is judged against what a peer this many times slower could show at a bound (the
# buckets' resolution: no interpolation), so healthy spread below it is never a fault.
MIN_FACTOR: Final = 1.5
P50_SHARE: Final = 0.5
P50_GAP: Final = 0.25
P99_SHARE: Final = 0.02
P99_FACTOR: Final = 3.0
P99_FLOOR: Final = 0.01
ALPHA: Final = 1e-4
Z: Final = 3.0


def windows_of(s: WindowSummary) -> dict[str, HistWindow] | None:
    """The histogram windows a summary carries, by metric; None for a sample pair."""
    raw = s.extra.get("hist") if s.extra else None
    if not isinstance(raw, Mapping):
        return None
    out: dict[str, HistWindow] = {}
    for metric, d in raw.items():
        w = HistWindow.from_dict(d) if isinstance(d, Mapping) else None
        if w is not None and w.requests > 0 and w.observations > 0:
            out[str(metric)] = w
    return out


@dataclass(frozen=True, slots=True)
class Reference:
    """The peers of one class on one metric (module docstring)."""

    bounds_s: tuple[float, ...]
    cdf: tuple[float, ...]            # median peer CDF at each finite bound
    peers: int
    k50: int | None                   # index of b50 in bounds_s; None: the median is in +Inf
    k99: int | None
    mean_s: float | None              # bucketless: the median of the peers' means

    @classmethod
    def of(cls, bounds_s: tuple[float, ...], cdf: tuple[float, ...], peers: int,
           mean_s: float | None = None) -> Reference:
        """The reference with CDF ``cdf`` at ``bounds_s`` (``b50``/``b99`` found in it)."""
        k50 = next((k for k, f in enumerate(cdf) if f >= 0.5), None)
        k99 = next((k for k, f in enumerate(cdf) if f >= 0.99), None)
        return cls(bounds_s, cdf, peers, k50, k99, mean_s)

    @property
    def q50(self) -> float:
        return 1.0 - self.cdf[self.k50] if self.k50 is not None else 0.5

    @property
    def q99(self) -> float:
        return 1.0 - self.cdf[self.k99] if self.k99 is not None else 0.01


def reference(wins: Sequence[HistWindow]) -> Reference | None:
    """The reference of ``wins`` (one class's peers, one metric, same bounds)."""
    if not wins:
        return None
    bounds = wins[0].bounds_s
    if not bounds:
        means = [w.sum_s / w.observations for w in wins if w.sum_s is not None]
        return Reference((), (), len(wins), None, None, median(means) if means else None)
    cdfs = []
    for w in wins:
        n, acc, row = w.observations, 0, []
        for c in w.counts[:-1]:
            acc += c
            row.append(acc / n)
        cdfs.append(row)
    return Reference.of(bounds, tuple(median([row[k] for row in cdfs]) for k in range(len(bounds))),
                        len(wins))


def shifted_share(ref: Reference, j: int) -> float:
    """The largest share above bound ``j`` that a peer ``MIN_FACTOR`` times slower can have: its
    CDF at ``bounds[j]`` is the peers' at ``bounds[j] / MIN_FACTOR``, at least the peers' CDF at the
    largest bound below that (1.0 when there is none: the buckets cannot tell)."""
    return shifted_share_at(ref, ref.bounds_s[j])


def shifted_share_at(ref: Reference, bound_s: float) -> float:
    """:func:`shifted_share` at any bound ``bound_s`` (a node's, whose buckets may differ from
    its peers': the peers' CDF is monotone, so the one at their largest bound below
    ``bound_s / MIN_FACTOR`` still bounds it from below, exactly)."""
    i = bisect.bisect_right(ref.bounds_s, bound_s / MIN_FACTOR * (1.0 + 1e-9)) - 1
    return 1.0 if i < 0 else 1.0 - ref.cdf[i]


def on_shared_bounds(wins: Sequence[HistWindow]) -> tuple[tuple[float, ...], list[HistWindow]]:
    """``wins`` re-bucketed to the finite bounds every one of them has (exact: a bucket of the
    shared grid is the sum of the buckets between two shared bounds); ``((), [])`` when they
    share none, or some have buckets and some counters only."""
    if not wins or not all(w.bounds_s for w in wins):
        return (), []
    shared = sorted(set.intersection(*(set(w.bounds_s) for w in wins)))
    if not shared:
        return (), []
    return tuple(shared), [rebucket(w, tuple(shared)) for w in wins]


def rebucket(w: HistWindow, bounds_s: tuple[float, ...]) -> HistWindow:
    """``w`` with the buckets of ``bounds_s``, a subset of its bounds (exact: each new bucket
    is the sum of ``w``'s between two of them)."""
    cum = [0]
    for c in w.counts:
        cum.append(cum[-1] + c)
    at = [cum[w.bounds_s.index(b) + 1] for b in bounds_s] + [cum[-1]]
    counts = tuple(hi - lo for lo, hi in zip([0, *at[:-1]], at, strict=True))
    return dataclasses.replace(w, bounds_s=bounds_s, counts=counts)


def _from_bound(w: HistWindow, bound_s: float) -> int:
    """The index of ``w``'s first bound at or above ``bound_s`` (a reference's ``b50``/``b99``)."""
    return bisect.bisect_left(w.bounds_s, bound_s * (1.0 - 1e-9))


def share_above(w: HistWindow, k: int) -> float:
    """The share of ``w``'s observations above bound ``k`` (exact: bucket edges only)."""
    return sum(w.counts[k + 1:]) / w.observations


def judge_metric(metric: str, w: HistWindow, ref: Reference, s: WindowSummary,
                 st: DetectorSettings, *, own: bool = False) -> Judgement:
    """One node's window on one metric against its reference (module docstring); ``own``: the
    reference is the node's own baseline (:mod:`tailguard.core.judge.hist_own`), said so."""
    n = min(w.requests, w.observations)
    ev = _evidence(metric, w, ref, s)
    slower = (f"it would have at most {{:.{{}}%}} were it {MIN_FACTOR:g}x slower than its own baseline"
              if own else f"a peer {MIN_FACTOR:g}x slower would have at most {{:.{{}}%}}")
    whose, peers = ("its baseline", "fewer than min_peers peers") if own else ("the peers'", f"{ref.peers} peers")
    if not ref.bounds_s:
        if ref.mean_s is None or w.sum_s is None:
            return health.NO_VERDICT
        mean = w.sum_s / w.observations
        lim = st.relative_p50_factor * ref.mean_s
        if mean > lim:
            return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, mean / lim,
                             f"{metric} mean {mean:.3g} s > {st.relative_p50_factor:g} x "
                             + ("its own baseline mean" if own else "the peers' median mean")
                             + f" ({ref.mean_s:.3g} s; no buckets exported)")
        return Judgement(Verdict.NORMAL, Reason.NORMAL.value, ev, mean / lim)
    sev = 0.0
    # The node's own bounds from the peers' b50 (b99) up: the same bounds when the buckets are
    # the peers', any others exactly too (shifted_share_at).
    bounds = w.bounds_s
    if ref.k50 is not None:
        for j in range(_from_bound(w, ref.bounds_s[ref.k50]), len(bounds)):
            x, u = share_above(w, j), shifted_share_at(ref, bounds[j])
            lim = max(P50_SHARE, u + P50_GAP)
            margin = Z * math.sqrt(lim * (1.0 - lim) / n) if lim < 1.0 else 0.0
            sev = max(sev, x / (lim + margin))
            if x > lim + margin:
                return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, x / (lim + margin),
                                 f"{x:.1%} of its {metric} above {bounds[j]:g} s, where "
                                 + slower.format(u, 1)
                                 + f" ({whose} P50 is at most {ref.bounds_s[ref.k50]:g} s; limit"
                                 f" {lim + margin:.1%}, {n} requests, {peers})")
    held = None
    if ref.k99 is not None:
        for j in range(_from_bound(w, ref.bounds_s[ref.k99]), len(bounds)):
            x99, u = share_above(w, j), shifted_share_at(ref, bounds[j])
            lim99 = max(P99_SHARE, P99_FACTOR * u)
            if x99 >= lim99:
                p_value = binomial_sf(round(x99 * n), n, max(u, P99_FLOOR))
                if p_value >= ALPHA and held is None:
                    held = (f"{x99:.1%} of its {metric} above {bounds[j]:g} s, past its limit"
                            f" ({lim99:.1%}) but not yet significant on {n} requests (p = {p_value:.1e})")
                if p_value < ALPHA:
                    return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P99.value, ev, x99 / lim99,
                                     f"{x99:.1%} of its {metric} above {bounds[j]:g} s, where "
                                     + slower.format(u, 2)
                                     + f" ({whose} P99 is at most {ref.bounds_s[ref.k99]:g} s;"
                                     f" p = {p_value:.1e}, {n} requests)")
            sev = max(sev, x99 / lim99)
    if held is not None:
        # Too few requests to tell, not a healthy window: a low-rate tail's streak is held, not reset.
        return Judgement(Verdict.NONE, Reason.RELATIVE_P99.value, ev, sev, held)
    return Judgement(Verdict.NORMAL, Reason.NORMAL.value, ev, sev)


def _evidence(metric: str, w: HistWindow, ref: Reference | None, s: WindowSummary) -> Evidence:
    """The numbers of a verdict, for people: interpolated quantiles (never judged)."""
    def us(q: float, win_bounds: tuple[float, ...], counts: tuple[int, ...], sum_s: float | None) -> float | None:
        v = bucket_quantile(win_bounds, counts, q, sum_s)
        return None if v is None else v * US_PER_S

    p50, p99 = us(0.5, w.bounds_s, w.counts, w.sum_s), us(0.99, w.bounds_s, w.counts, w.sum_s)
    peers_p50 = (None if ref is None else ref.bounds_s[ref.k50] * US_PER_S if ref.k50 is not None
                 else None if ref.mean_s is None else ref.mean_s * US_PER_S)
    return Evidence(signal=f"{metric}_hist", p50=p50, p99=p99,
                    ratio=None if not p50 or p99 is None else p99 / p50, samples=w.requests,
                    peers_p50=peers_p50, latency_p50_us=s.latency_p50_us,
                    latency_p99_us=s.latency_p99_us, hardware=s.hardware)


class OwnFallback(Protocol):
    """What judges a metric whose class has no reference (:class:`tailguard.core.judge.hist_own.OwnHist`)."""

    def judge(self, metric: str, w: HistWindow, s: WindowSummary) -> Judgement | None:
        """The window against the node's own history; None when that cannot be judged."""


class HistJudge:
    """The references of one model at one tick, built from its peers' windows."""

    def __init__(self, peers: Mapping[str, WindowSummary], st: DetectorSettings,
                 newcomers: Mapping[str, WindowSummary] | None = None,
                 own: OwnFallback | None = None, unresolved: Collection[str] = ()) -> None:
        """``peers``: the model's peers; ``newcomers``: the pairs awaiting admission or in a
        probe round, which join a class's reference only while it has fewer than
        ``min_peers`` peers (a cold start: new pairs are judged against each other);
        ``own``: judges a metric of a class with no reference against the node's own history;
        ``unresolved``: the metrics the model's buckets cannot resolve (hist_resolution), on
        which each node's window mean is judged too (:mod:`tailguard.core.judge.hist_mean`)."""
        self.st = st
        self.own = own
        # (metric, class) -> (bounds the class uses, reference)
        self._refs: dict[tuple[str, str], tuple[tuple[float, ...], Reference]] = {}
        self._means: dict[tuple[str, str], MeanRef] = {}     # (metric, class) -> unresolved: means
        by = _windows_by_class(peers)
        extra = _windows_by_class(newcomers or {})
        for key in by.keys() | extra.keys():
            wins = by.get(key, [])
            if len(wins) < st.min_peers:
                wins = wins + [w for w in extra.get(key, []) if w.requests >= st.min_samples]
            tally = Counter(w.bounds_s for w in wins)
            if not tally:
                continue
            bounds = max(sorted(tally), key=lambda b: tally[b])
            same = [w for w in wins if w.bounds_s == bounds]
            if len(same) < st.min_peers <= len(wins):   # mid-upgrade: the bounds all of them share
                bounds, same = on_shared_bounds(wins)
            if len(same) >= st.min_peers:
                ref = reference(same)
                if ref is not None:
                    self._refs[key] = (bounds, ref)
                if key[0] in unresolved and (m := MeanRef.of(same, st.min_peers)) is not None:
                    self._means[key] = m

    @classmethod
    def for_model(cls, peers: PeerSet, by_node: Mapping[str, WindowSummary], pairs: PairTable,
                  now_s: float, st: DetectorSettings, own: OwnFallback | None = None,
                  unresolved: Collection[str] = ()) -> HistJudge:
        newcomers = {node: s for node in pairs.in_order(pairs.rare)
                     if (s := by_node.get(node)) is not None and _in_round(pairs[node], now_s, st)}
        return cls(dict(zip(peers.nodes, peers.summaries, strict=True)), st, newcomers, own, unresolved)

    def unreferenced(self, s: WindowSummary, need: int) -> Evidence | None:
        """The evidence of ``s``'s first window (per-token first) of ``need`` requests on a
        metric whose class has no reference at all (fewer than ``min_peers`` windows of it:
        a small model or class); None when there is none."""
        cls, wins = hw_class(s.hardware), windows_of(s) or {}
        for metric in PREFERENCE:
            w = wins.get(metric)
            if w is not None and w.requests >= need and (metric, cls) not in self._refs:
                return _evidence(metric, w, None, s)
        return None

    @staticmethod
    def applies(summaries: Mapping[str, WindowSummary]) -> bool:
        return any(windows_of(s) is not None for s in summaries.values())

    def judge(self, s: WindowSummary, *, normal_reason: str = Reason.NORMAL.value,
              min_requests: int | None = None) -> Judgement:
        """A node's verdict: abnormal on any metric (per-token first), else normal on at least
        one judged metric, else no verdict."""
        wins = windows_of(s)
        if not wins:
            return health.NO_VERDICT
        need = self.st.min_samples if min_requests is None else min_requests
        cls = hw_class(s.hardware)
        normal: Judgement | None = None
        held: Judgement | None = None
        for metric in PREFERENCE:
            w = wins.get(metric)
            if w is None or w.requests < need:
                continue
            got = self._refs.get((metric, cls))
            if got is None:     # too few peers: the node's own history, if it has one
                own = None if self.own is None else self.own.judge(metric, w, s)
                if own is None:
                    continue
                j = own
            elif bool(w.bounds_s) != bool(got[0]):   # buckets on one side only: not comparable
                continue
            else:
                j = judge_metric(metric, w, got[1], s, self.st)
                mref = self._means.get((metric, cls)) if j.verdict is not Verdict.ABNORMAL else None
                if mref is not None and j.evidence is not None:
                    by_mean = mref.judge(metric, w, self.st, j.evidence)
                    if by_mean is not None and by_mean.verdict is Verdict.ABNORMAL:
                        j = by_mean
            if j.verdict is Verdict.ABNORMAL:
                return j
            if j.verdict is Verdict.NORMAL and normal is None:
                normal = j
            if j.verdict is Verdict.NONE and j.reason and held is None:
                held = j
        if held is not None:
            return held
        if normal is None:
            return health.NO_VERDICT
        return Judgement(Verdict.NORMAL, normal_reason, normal.evidence, normal.severity)

    def judge_peers(self, pairs: Mapping[str, PairState], ps: PeerSet, errs: Mapping[str, Judgement],
                    held_before: Mapping[str, float] | None = None,
                    ) -> tuple[dict[str, Judgement], dict[str, float], int]:
        """Every peer (the evaluator's ``_judge_peers`` for a histogram model): verdicts by node
        (failed requests and stalls as for sample pairs), the peers held this tick (a tail past
        its share, not yet significant: ``{node: severity}``), and how many are abnormal (the
        load-event count). Onset credit: a first abnormal latency window right after a held one
        counts that one too (with ``confirm_windows`` >= 3), as the sample path credits a window
        at 0.8 of its limit; ``held_before`` is the last tick's held peers."""
        out: dict[str, Judgement] = {}
        held: dict[str, float] = {}
        abnormal = 0
        before = held_before if self.st.confirm_windows >= 3 and held_before else {}
        for node, s in zip(ps.nodes, ps.summaries, strict=True):
            j = self.judge(s)
            if j.verdict is Verdict.NONE and j.reason:
                held[node] = j.severity
            if j.verdict is not Verdict.ABNORMAL and node in errs:
                j = errs[node]
            p = pairs[node]
            if j.verdict is Verdict.ABNORMAL:
                abnormal += 1
                if (node in before and p.abnormal_streak == 0
                        and j.reason in (Reason.RELATIVE_P50, Reason.RELATIVE_P99)):
                    j = dataclasses.replace(j, windows=2, detail=f"{j.detail}; the previous window counts"
                                            " too (its tail was past the limit, not yet significant)")
            if j.verdict is Verdict.ABNORMAL or p.state is not HealthState.HEALTHY or p.abnormal_streak:
                out[node] = j
        return out, held, abnormal

    def judge_rounds(self, pairs: PairTable, by_node: Mapping[str, WindowSummary],
                     errs: Mapping[str, Judgement], now_s: float, judgements: dict[str, Judgement]) -> None:
        """Admission and probe rounds of histogram pairs, by the same tests against the peers
        (their windows start at the cut stage 1 was given: warm-up's end, the round's start)."""
        st = self.st
        for node in pairs.in_order(pairs.rare):
            p = pairs[node]
            s = by_node.get(node)
            if s is None or not _in_round(p, now_s, st) or windows_of(s) is None:
                continue
            new = p.state is HealthState.WARMING
            need = st.min_samples if new else st.probe_min_samples
            reason = (Reason.ADMITTED if new else Reason.NORMAL).value
            j = errs.get(node) or self.judge(s, normal_reason=reason, min_requests=need)
            ev = self.unreferenced(s, need) if j.verdict is Verdict.NONE else None
            if ev is not None:
                # Nothing to compare with (no peers of its class, no history of its own): as the
                # sample path's absolute rules, a window that serves is normal.
                j = Judgement(Verdict.NORMAL, reason, ev, detail=(
                    f"fewer than {st.min_peers} peers of its class and no history of its own to"
                    " compare its buckets with: judged on its requests and failures only"))
            judgements[node] = j


def _in_round(p: PairState, now_s: float, st: DetectorSettings) -> bool:
    """Awaiting admission past warm-up, or quarantined with its probe round on."""
    if p.state is HealthState.WARMING:
        return admitting(p, now_s, st)
    return p.state is HealthState.QUARANTINED and (p.probe_after_ts is None or now_s >= p.probe_after_ts)


def _windows_by_class(summaries: Mapping[str, WindowSummary]) -> dict[tuple[str, str], list[HistWindow]]:
    by: dict[tuple[str, str], list[HistWindow]] = {}
    for s in summaries.values():
        for metric, w in (windows_of(s) or {}).items():
            by.setdefault((metric, hw_class(s.hardware)), []).append(w)
    return by
