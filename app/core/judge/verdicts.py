"""Stage 2's verdicts of one model's pairs at one tick: the rules applied pair by pair.

Owns what :class:`~tailguard.core.judge.evaluate.FleetEvaluator` asks of every pair once the
peers and their references are known: each peer judged by the rules
(:mod:`tailguard.core.judge.rules`; below ``min_peers`` against its own history,
:mod:`tailguard.core.judge.own_history`), a hardware class too quiet to judge by its own
P50 judged against the baseline ratio, the new-evidence hold and the onset credit
(:func:`_hold_or_credit`), routed pairs too thin to be peers but failing fast, and the probe
rounds of quarantined pairs and the admission of new ones
(:mod:`tailguard.core.judge.admission`). The result is a :class:`Verdicts`.

Guarantees: pure and deterministic (pairs in node order); it reads the model's state and
writes only the verdicts, the rates and the own baselines the rules keep there.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import (
    HealthState,
    Reason,
    WindowSummary,
)
from tailguard.core.judge import health
from tailguard.core.judge.admission import AdmissionNorms, admitting, judge_admission
from tailguard.core.judge.baseline import baseline_limits
from tailguard.core.judge.health import Judgement, PairState, Verdict
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.own_history import judge_own
from tailguard.core.judge.peers import (
    Limits,
    Norms,
    PeerNorms,
    PeerRow,
    PeerSet,
    hw_class,
    limits,
)
from tailguard.core.judge.request_rules import ErrorReport
from tailguard.core.judge.rules import (
    NEW_EVIDENCE_FRACTION,
    fresh_tail_judged,
    judge,
    judge_fresh_tail,
    judge_probe,
    new_fraction,
    p50_over,
    quiet_below,
    record_rates,
    tail_support_samples,
)

# Verdicts against the peers' reference: without min_peers peers they cannot be judged.
PEER_REASONS = frozenset({Reason.RELATIVE_P50.value, Reason.RELATIVE_P99.value})


@dataclasses.dataclass(slots=True)
class Verdicts:
    """The rules' output at one tick: verdicts by node, the pairs whose relative severity
    earns onset credit next tick, and how many peers are abnormal (by the rules or
    against the slow baseline: the load-event count)."""

    judgements: dict[str, Judgement]
    elevated: dict[str, float]
    abnormal: int


def judge_peers(st: DetectorSettings, ms: ModelState, ps: PeerSet, pn: PeerNorms, errors: ErrorReport,
                 now_s: float, own_p50: Mapping[str, float] | None) -> Verdicts:
    """Every peer by the rules (below min_peers: its own history; error rate when the
    latency rules find nothing), with the new-evidence hold and onset credit applied.

    A peer that :func:`~tailguard.core.judge.rules.quiet_below` clears (its class's largest values,
    else its own) with no fresh-tail count the rule can judge
    (:func:`~tailguard.core.judge.rules.fresh_tail_judged`; with ``min_peers`` peers) and no
    failed requests to judge is normal
    with no severity, whatever ``judge`` would add: only its sample rate is recorded;
    the others go through every rule (:func:`_judge_peer`)."""
    norms, fresh = pn.window, pn.fresh
    out = Verdicts({}, {}, 0)
    base_p50, base_ratio = baseline_limits(ms, st)
    errs = errors.judgements
    judgements = out.judgements
    normal = health.NORMAL
    if own_p50 is None and len(pn.class_p50) == 1 and pn.top:    # one class, top known
        ((c, top),) = pn.top.items()
        lim = limits(norms, fresh, ps.summaries[0].hardware, st)
        if quiet_below(*top, norms, lim, st):
            _judge_quiet_class(st, ms, ps, pn, lim, top[:2], errs, now_s,
                                    base_p50.get(c, math.inf), base_ratio, out)
            return out
    # Per hardware value: its class's limits, whether all its class is quiet, the slow
    # baseline's P50 limit.
    by_hw: dict[str | None, tuple[Limits, bool, float]] = {}
    unsettled = set(ps.unsettled)
    quiet: list[PeerRow] = []
    abnormal = 0
    for peer in ps.rows():
        node, s, p50, ratio = peer
        hw = by_hw.get(s.hardware)
        if hw is None:
            c = hw_class(s.hardware)
            lim = limits(norms, fresh, s.hardware, st)
            c_top = pn.top.get(c)
            hw = by_hw[s.hardware] = (lim, c_top is not None
                                      and quiet_below(*c_top, norms, lim, st),
                                      base_p50.get(c, math.inf))
        lim, all_quiet, base_p50_c = hw
        if (own_p50 is not None or node in errs
                or (s.fresh_over and (not norms.enough_peers or fresh_tail_judged(s)))
                or not (all_quiet or quiet_below(p50, ratio, p50 * ratio, s.fresh_p50, norms,
                                                 lim, st))):
            abnormal += _judge_peer(st, ms, peer, norms, fresh, lim, errs, now_s, own_p50,
                                         base_p50_c, base_ratio, out)
            continue
        quiet.append(peer)
        if node in unsettled:
            judgements[node] = normal
        # Abnormal against the slow baseline: counts towards a load event only.
        if ratio > base_ratio or p50 > base_p50_c:
            abnormal += 1
    record_rates(ms.rate_per_s, (p[:2] for p in quiet), now_s, st)
    out.abnormal = abnormal
    return out


def _judge_quiet_class(st: DetectorSettings, ms: ModelState, ps: PeerSet, pn: PeerNorms, lim: Limits,
                       top: tuple[float, float], errs: Mapping[str, Judgement], now_s: float,
                       base_p50: float, base_ratio: float, out: Verdicts) -> None:
    """:meth:`_judge_peers` for one class whose largest values are quiet: every peer is
    normal by the latency rules; only those with a fresh-tail count the rule can judge or
    failed requests have more to judge. ``top``: the class's largest P50 and P99/P50."""
    nodes, sums = ps.nodes, ps.summaries
    # A fresh-tail count the rule cannot judge (most counts) leaves the pair quiet.
    more = ({nodes[i] for i in ps.fresh_over_at if fresh_tail_judged(sums[i])}
            if pn.window.enough_peers else {nodes[i] for i in ps.fresh_over_at})
    if errs:
        more.update(n for n in nodes if n in errs)
    quiet: list[bool] = []
    if more:
        # The few with more to judge, in peer order; the rest by a mask (no row made).
        quiet = [n not in more for n in nodes]
        for peer in itertools.compress(ps.rows(), map(operator.not_, quiet)):
            out.abnormal += _judge_peer(st, ms, peer, pn.window, pn.fresh, lim, errs,
                                        now_s, None, base_p50, base_ratio, out)
        record_rates(ms.rate_per_s, zip(itertools.compress(ps.nodes, quiet),
                                        itertools.compress(ps.summaries, quiet), strict=True),
                     now_s, st)
    else:
        record_rates(ms.rate_per_s, zip(ps.nodes, ps.summaries, strict=True), now_s,
                     st)
    normal = health.NORMAL
    for node in ps.unsettled:
        if node not in more:
            out.judgements[node] = normal
    top_p50, top_ratio = top
    if top_ratio > base_ratio or top_p50 > base_p50:
        # Abnormal against the slow baseline: counts towards a load event only.
        rows = itertools.compress(ps.rows(), quiet) if more else ps.rows()
        out.abnormal += sum(1 for _, _, p50, ratio in rows
                            if ratio > base_ratio or p50 > base_p50)


def _judge_peer(st: DetectorSettings, ms: ModelState, peer: PeerRow, norms: Norms, fresh: Norms | None,
                lim: Limits, errs: Mapping[str, Judgement], now_s: float,
                own_p50: Mapping[str, float] | None, base_p50: float, base_ratio: float,
                out: Verdicts) -> int:
    """One peer by every rule into ``out``; 1 when it counts towards a load event."""
    node, s, p50, ratio = peer
    j = judge(s, p50, ratio, s.samples, norms, st, tail=s.samples >= tail_support_samples(st),
              fresh=fresh, lim=lim)
    if own_p50 is not None and j.verdict is not Verdict.ABNORMAL:
        j = judge_own(ms.own, s, p50, ratio, own_p50, st.relative_p50_factor) or j
    fresh_tail = (judge_fresh_tail(s, st, None if fresh is None else fresh.p50_ref(s.hardware))
                  if s.fresh_over else None)
    if fresh_tail is not None and j.verdict is not Verdict.ABNORMAL:
        j = fresh_tail
    fraction = new_fraction(ms.rate_per_s, ms.advanced_ts, node, s, now_s, st)
    if j.verdict is not Verdict.ABNORMAL and node in errs:
        j = errs[node]   # failed requests since the last tick: new each tick
    p = ms.pairs[node]
    if (j.verdict is Verdict.NORMAL and p.abnormal_streak and not norms.enough_peers
            and p.fault in PEER_REASONS):
        # The rule that raised the streak has no reference this tick (too few peers):
        # insufficient data, not a normal window (it would end the streak).
        j = health.NO_VERDICT
    if j.verdict is Verdict.ABNORMAL:
        if j.reason not in (Reason.ERROR_RATE, Reason.STALLED):
            # Fresh-sample and own-history verdicts are new evidence each tick: no hold.
            fresh_evidence = own_p50 is not None or fresh_tail is not None
            credit = st.confirm_windows >= 3
            j = _hold_or_credit(j, p, fresh_evidence or p50_over(s, p50, lim),
                                     fraction, node in ms.advanced_ts,
                                     ms.elevated.get(node) if credit else None)
        out.judgements[node] = j
        return 1
    if j.severity:
        out.elevated[node] = j.severity
    if p.state is not HealthState.HEALTHY or p.abnormal_streak:
        out.judgements[node] = j
    # Abnormal against the slow baseline: counts towards a load event only.
    return 1 if ratio > base_ratio or p50 > base_p50 else 0


def _hold_or_credit(j: Judgement, p: PairState, p50_verdict: bool, fraction: float,
                    advanced: bool, elevated: float | None) -> Judgement:
    """An abnormal latency verdict, held when it is a tail verdict (``p50_verdict`` false)
    on a window mostly counted already, or credited with the previous window at the
    onset of a slow-down."""
    if (p.abnormal_streak and advanced and fraction < NEW_EVIDENCE_FRACTION
            and not p50_verdict):
        # Its few slowest samples are likely the ones already counted: hold, no more.
        return dataclasses.replace(
            j, verdict=Verdict.NONE, detail=f"{j.detail}; only {fraction:.0%} of the "
            "window is new since the last counted one: held, not counted")
    if elevated is not None and p.abnormal_streak == 0:
        return dataclasses.replace(j, windows=2, detail=(
            f"{j.detail}; the previous window counts too (it was at "
            f"{elevated:.2f} of the limit: the onset of a slow-down)"))
    return j


def judge_thin_failing(ms: ModelState, peers: PeerSet, errors: ErrorReport,
                        verdicts: Verdicts) -> None:
    """A routed pair with too few judged samples to be a peer may still be failing fast
    (not counted towards a load event, whose denominator is the peers; the ejection cap
    still bounds how many leave)."""
    judged = set(peers.nodes)
    for node, j in errors.judgements.items():
        p = ms.pairs[node]
        if node not in judged and p.routed and p.state is not HealthState.WARMING:
            verdicts.judgements[node] = j


def judge_probes(st: DetectorSettings, ms: ModelState, by_node: dict[str, WindowSummary], norms: Norms,
                  errors: ErrorReport, now_s: float, judgements: dict[str, Judgement],
                  own_p50: Mapping[str, float] | None, signal: str | None,
                  adm_norms: AdmissionNorms, fresh: Norms | None = None) -> None:
    """Quarantined pairs whose back-off has passed: judge the probe round (below
    min_peers, also against the pair's own history; in the peers' units only; ``fresh``:
    the peers' fresh P50 references, for the fresh P50 rule). New
    pairs past warm-up: judge their admission (:mod:`tailguard.core.judge.admission`)."""
    pairs = ms.pairs
    for node in pairs.in_order(pairs.rare):   # healthy routed pairs are neither
        p = pairs[node]
        new = p.state is HealthState.WARMING and admitting(p, now_s, st)
        if new or (p.state is HealthState.QUARANTINED and (p.probe_after_ts is None
                                                           or now_s >= p.probe_after_ts)):
            qs = by_node.get(node)
            if qs is None:
                continue
            if (not new and signal is not None and qs.signal != signal
                    and node not in errors.judgements):
                continue
            # Below min_peers a probe round is judged as admission is (admission_norms).
            cold = not norms.enough_peers and adm_norms.signal in (None, qs.signal)
            j = errors.judgements.get(node) or (
                judge_admission(p, qs, adm_norms, now_s, st) if new
                else judge_probe(qs, adm_norms.norms if cold else norms, st,
                                 None if cold else fresh))
            ev = j.evidence
            if (own_p50 is not None and j.verdict is Verdict.NORMAL and ev is not None
                    and ev.p50 is not None and ev.ratio is not None):
                j = judge_own(ms.own, qs, ev.p50, ev.ratio, {**own_p50, node: ev.p50},
                              st.relative_p50_factor) or j
            judgements[node] = j
