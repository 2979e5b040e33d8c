"""Admission by evidence: the verdict that lets a new (node, model) pair into routing.

A pair tailguard has never routed (``PairState.admitted`` false: first seen, or a retired node
back as a new instance) is ``warming`` and out of routing. Once its warm-up is over it is
judged here at every tick, like a probe round: on its judged samples since warm-up ended
(the window store cuts the rest, see :func:`tailguard.core.judge.health.judge_since`), by the same rules
against the current peers, of which it is not one. :func:`judge_admission` gives no verdict
below ``min_samples`` such samples, nor on a window that may still hold warm-up samples
(neither cut by the store at warm-up's end nor bounded by ``max_sample_age_s`` after it).
While the model has fewer than ``min_peers`` peers (a cold start: a new model, or a worker
that lost its state; a small fleet) the pairs awaiting admission and those in a probe round
are judged against each other and the peers together (:func:`admission_norms`), so a fleet
whose healthy tail is heavy is not refused by the absolute ratio rule, and a slow node is
not let back in by it. The state machine (:mod:`tailguard.core.judge.health`) admits
the pair on a normal verdict and the fleet guard refuses it after ``confirm_windows``
abnormal ones; until then it counts in no guard and is in no peer set.

Guarantees: pure (no clock, no I/O); a pair without ``min_samples`` judged samples after its
warm-up is never admitted, so an id that sent one event never enters a routing set.
Rationale: docs/rules.md (Admission).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, Reason, WindowSummary
from tailguard.core.judge import health
from tailguard.core.judge.health import Judgement, PairState
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.peers import Norms, Peer, window_norms
from tailguard.core.judge.rules import judge, judged_since, normal_with_evidence, tail_support_samples


def admitting(p: PairState, now_s: float, st: DetectorSettings) -> bool:
    """A pair awaiting admission whose warm-up is over: to be judged this tick."""
    return (p.state is HealthState.WARMING and not p.admitted
            and now_s >= health.warmup_end(p, st))


def probing(p: PairState, s: WindowSummary, now_s: float, st: DetectorSettings) -> bool:
    """A quarantined pair whose probe round is on and holds ``probe_min_samples`` judged
    samples (:func:`tailguard.core.judge.rules.judge_probe` judges it)."""
    return (p.state is HealthState.QUARANTINED
            and (p.probe_after_ts is None or now_s >= p.probe_after_ts)
            and s.samples >= st.probe_min_samples and s.p50 is not None and s.p50 > 0)


def _judgeable(p: PairState, s: WindowSummary, now_s: float, st: DetectorSettings) -> bool:
    """At least ``min_samples`` judged samples, none of them from warm-up."""
    if s.samples < st.min_samples or s.p50 is None or s.p99 is None or s.p50 <= 0:
        return False
    if st.warmup_s > 0:
        # The oldest sample the window may hold: its cut-off, or the age bound.
        since = judged_since(s)
        lo = now_s - st.max_sample_age_s
        if since is not None and since > lo:
            lo = since
        if lo < health.warmup_end(p, st) - 1e-6:
            return False
    return True


@dataclass(frozen=True, slots=True)
class AdmissionNorms:
    """What admission judges against this tick: ``norms``, in the units of ``signal`` (a
    window in other units is judged by the absolute rules alone, as with no peers)."""

    norms: Norms
    signal: str | None


def admission_norms(ms: ModelState, peers: Sequence[Peer], by_node: Mapping[str, WindowSummary],
                    norms: Norms, signal: str | None, now_s: float,
                    st: DetectorSettings) -> AdmissionNorms:
    """The references admission and probe rounds judge against: the peers' (``norms``), or
    below ``min_peers`` peers those of the peers, the judgeable new pairs and the pairs in a
    judgeable probe round together (in the peers' signal, or without peers the one most
    new pairs carry): a node refused or ejected in a small fleet is not let back in by the
    absolute rules alone."""
    if norms.enough_peers:
        return AdmissionNorms(norms, signal)
    pairs = ms.pairs
    extra = [Peer(node, s, s.p50, s.p99 / s.p50) for node in pairs.in_order(pairs.rare)
             if (s := by_node.get(node)) is not None and s.p50 is not None and s.p99 is not None
             and ((admitting(p := pairs[node], now_s, st) and _judgeable(p, s, now_s, st))
                  or probing(p, s, now_s, st))]
    if signal is None and extra:
        tally = Counter(x.summary.signal for x in extra)
        signal = max(sorted(tally), key=lambda k: tally[k])
    extra = [x for x in extra if x.summary.signal == signal]
    if not extra:
        return AdmissionNorms(norms, signal)
    return AdmissionNorms(window_norms([*peers, *extra], ms.baseline_p50, ms.baseline_ticks, st),
                          signal)


def judge_admission(p: PairState, s: WindowSummary, ref: AdmissionNorms, now_s: float,
                    st: DetectorSettings) -> Judgement:
    """The verdict on ``s``, the window of pair ``p`` awaiting admission (see module docstring)."""
    if not _judgeable(p, s, now_s, st):
        return health.NO_VERDICT
    assert s.p50 is not None and s.p99 is not None
    p50, p99, n = s.p50, s.p99, s.samples
    norms = (ref.norms if ref.signal is None or s.signal == ref.signal
             else Norms(False, None, {}, False, st.ratio_threshold))
    # Tail rules only on a window whose P99 rests on enough samples, as for the peers.
    j = judge(s, p50, p99 / p50, n, norms, st, p99, tail=n >= tail_support_samples(st))
    return normal_with_evidence(j, s, p50, p99, n, norms, Reason.ADMITTED.value)
