"""The shift rule's severity, and the probe-round hold that re-admits by the same rule.

Owns :func:`shift_severity` (P50, P99 and fresh P50 all past ``shift_factor`` × the peers'
on a heavy-tailed model: the least of the three, over ``shift_factor``), used by
:func:`tailguard.core.judge.rules.judge` for routed pairs, and :func:`probe_shift_hold`,
used by its probe round: a quarantined pair whose shift severity is still within onset
credit of the limit is not re-admitted, so a node steadily past the limit stays out
instead of cycling (ejected on confirmed windows, back on one round's noise).

Guarantees: pure; the hold only ever turns a normal probe verdict into an abnormal one
(``relative_p50``), never the reverse; with ``shift_factor=0`` it does nothing.

Rationale: docs/rules.md (shift).
"""

from __future__ import annotations

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import Reason, WindowSummary
from tailguard.core.judge.health import Evidence, Judgement, Verdict
from tailguard.core.judge.peers import Limits, Norms


def shift_severity(sev_p50: float, sev_p99: float, sev_fresh: float, norms: Norms,
                   st: DetectorSettings, gate: float = 1.0) -> float:
    """The shift rule's severity from the P50, P99 and fresh-P50 severities (0 when the rule
    does not apply: no ``shift_factor``, a model not heavy-tailed — the peers' P99/P50 at
    most ``gate`` × ``ratio_threshold`` —, no P50 or P99 reference)."""
    if not (st.shift_factor and sev_p50 and sev_p99 and norms.fleet_ratio is not None
            and norms.fleet_ratio > gate * st.ratio_threshold):
        return 0.0
    # Each statistic as a multiple of its reference (severity × its factor).
    f50, f99 = st.relative_p50_factor, st.relative_p99_factor
    over = ((sev_p50 * f50, sev_p99 * f99, sev_fresh * f50) if sev_fresh
            else (sev_p50 * f50, sev_p99 * f99))
    return min(over) / st.shift_factor


def probe_shift_hold(s: WindowSummary, p50: float, p99: float, n: int, norms: Norms,
                     lim: Limits, st: DetectorSettings, onset: float,
                     tail_support: int) -> Judgement | None:
    """A probe round judged normal whose shift severity is still at least ``onset`` (the
    rules' onset-credit fraction), on a model whose P99/P50 is past that fraction of
    ``ratio_threshold``: abnormal (``relative_p50``), so the round fails.

    A routed window at that severity counts towards ejection (onset credit); re-admitting
    on it would let a node that stays just past the shift limit (1.6x slower on a model
    whose P99/P50 is ~3.2) flap: ejected on confirmed windows, back on one round's noise.
    Ejection and re-admission so judge a persistent shift alike (docs/rules.md, shift)."""
    fresh = s.fresh_p50
    sev_fresh = fresh / lim.dfresh if fresh is not None and lim.dfresh > 0 else 0.0
    sev_p50 = p50 / lim.d50 if lim.d50 > 0 else 0.0
    # A P99 of a few dozen probes is about their maximum: low and noisy, so the least of the
    # three would let the round through on it. Below the tail rules' support the P50s decide.
    sev_p99 = (p99 / lim.d99 if lim.d99 > 0 else 0.0) if n >= tail_support else (
        sev_p50 * st.relative_p50_factor / st.relative_p99_factor)
    # The heavy-tail gate with the same margin: a model whose P99/P50 is ~3.2 dips below 3
    # on some ticks, and one such tick must not let the node back.
    sev = shift_severity(sev_p50, sev_p99, sev_fresh, norms, st, onset)
    if sev < onset:
        return None
    ev = Evidence(signal=s.signal, p50=p50, p99=p99, ratio=p99 / p50, samples=n,
                  peers_p50=lim.ref, latency_p50_us=s.latency_p50_us,
                  latency_p99_us=s.latency_p99_us, hardware=s.hardware)
    return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, sev,
                     f"p50 {p50:.1f}, p99 {p99:.1f} still {sev * st.shift_factor:.2f} x peers' "
                     f"(at least {onset:g} of the shift limit "
                     f"{st.shift_factor:g} x) on a heavy-tailed model: not re-admitted")
