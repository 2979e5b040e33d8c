"""The per-pair rules of stage 2: one window summary → one :class:`Judgement`.

Owns the verdicts a pair earns against its model's references (see
:mod:`tailguard.core.judge.peers`): tail (``p99_p50_ratio``), relative P50 of the window
and of its fresh samples, relative P99, shift (``relative_p50`` on a
heavy-tailed model) and the probe round of a quarantined pair (the request-count rules,
error rate and stall, are :mod:`tailguard.core.judge.request_rules`). Also the new-evidence
fraction that keeps a tail verdict on a mostly re-seen window from advancing
a streak, and the onset-credit and support constants the evaluator applies.

Guarantees: each rule applies only when its reference exists (no peers, no
verdict by that rule); an abnormal verdict names the most telling rule as
its reason and carries the largest severity; a normal verdict carries a
severity only from :data:`ONSET_CREDIT_FRACTION` of the limit up (onset
credit). Pure: the only state touched is the per-pair counters, sample rates
and streak clocks passed in.

Rationale: docs/rules.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, MutableMapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import Reason, WindowSummary
from tailguard.core.judge import health
from tailguard.core.judge.health import Evidence, Judgement, Verdict
from tailguard.core.judge.peers import Limits, Norms, limits
from tailguard.core.judge.shift import probe_shift_hold, shift_severity

# Onset credit: a window whose relative severity reached this fraction of the limit counts
# towards confirmation when the next window is abnormal.
ONSET_CREDIT_FRACTION = 0.8
# Tail rules (p99_p50_ratio, relative_p99) judge a routed pair only when its P99 rests on at
# least this many samples above it: samples >= TAIL_SUPPORT / (1 - 0.99) (capped at window_size).
TAIL_SUPPORT = 5
# A tail verdict advances an abnormal streak only when at least this fraction of its window is
# newer than the window that last advanced it (see new_fraction).
NEW_EVIDENCE_FRACTION = 0.5
# Low-rate tails (judge_fresh_tail): stage 1 counts a tick's fresh samples above the peers' P99
# × FRESH_TAIL_MARGIN; at least FRESH_TAIL_MIN_SAMPLES of them, a share of at least
# FRESH_TAIL_SHARE, and a binomial tail below FRESH_TAIL_P at the healthy share FRESH_TAIL_P0.
FRESH_TAIL_MARGIN = 1.5
FRESH_TAIL_MIN_SAMPLES = 60
FRESH_TAIL_SHARE = 0.04
FRESH_TAIL_P0 = 0.01
FRESH_TAIL_P = 1e-4
# A fresh P50 of fewer than min_samples samples (a quieter node, or one whose events arrive late)
# is past its limit only by FRESH_FEW_Z standard errors of its log median more: sqrt(pi/2) x
# sigma / sqrt(n), sigma from the window's P99/P50 as if lognormal (Z_99: its 99th percentile).
FRESH_FEW_Z = 2.0
_Z_99 = 2.3263478740408408
_MEDIAN_SE = math.sqrt(math.pi / 2)


def fresh_margin(s: WindowSummary, st: DetectorSettings) -> float:
    """1.0, or for a fresh P50 of fewer than ``min_samples`` samples the factor its limit is
    raised by (:data:`FRESH_FEW_Z`)."""
    n = s.fresh_samples
    if n >= st.min_samples:
        return 1.0
    ratio = s.ratio
    sigma = math.log(ratio) / _Z_99 if ratio is not None and ratio > 1.0 else 0.0
    return math.exp(FRESH_FEW_Z * _MEDIAN_SE * sigma / math.sqrt(max(n, 1)))


def tail_support_samples(st: DetectorSettings) -> int:
    """Judged samples a window needs before the tail rules judge it."""
    return min(st.window_size, math.ceil(TAIL_SUPPORT / 0.01))


def judged_since(s: WindowSummary) -> float | None:
    """The cut-off the window store applied to this window (None: the window was not cut)."""
    since = s.extra.get("judged_since") if s.extra else None
    return None if since is None else float(since)


def p50_over(s: WindowSummary, p50: float, lim: Limits) -> bool:
    """P50 (of the window or of its fresh samples) beyond the relative limit."""
    fresh = s.fresh_p50
    return (lim.d50 > 0 and p50 > lim.d50) or (
        fresh is not None and lim.dfresh > 0 and fresh > lim.dfresh)


def judge(s: WindowSummary, p50: float, ratio: float, samples: int, norms: Norms,
          st: DetectorSettings, p99: float | None = None, *, tail: bool = True,
          fresh: Norms | None = None, lim: Limits | None = None) -> Judgement:
    """One pair's verdict. ``lim``: its class's :class:`Limits` for this tick (computed
    from ``norms``/``fresh`` when not given)."""
    if lim is None:
        lim = limits(norms, fresh, s.hardware, st)
    f50, f99 = st.relative_p50_factor, st.relative_p99_factor
    sev_tail = ratio / norms.tail_limit if tail else 0.0
    sev_p50 = p50 / lim.d50 if lim.d50 > 0 else 0.0
    # Fresh P50: after an onset it moves a tick before the window's P50 (whose older samples
    # hold it back).
    fresh_p50 = s.fresh_p50
    sev_fresh = fresh_p50 / lim.dfresh if fresh_p50 is not None and lim.dfresh > 0 else 0.0
    margin = fresh_margin(s, st) if sev_fresh else 1.0
    sev_fresh /= margin
    # Relative tail: catches a degrading node while its window still mixes old and new
    # samples, on signals whose healthy spread is far below ratio_threshold (TPOT).
    sev_p99 = p50 * ratio / lim.d99 if tail and lim.d99 > 0 else 0.0
    # Shift: request sizes dilute a per-token slowdown in raw latency; three statistics
    # agreeing is not noise.
    sev_shift = shift_severity(sev_p50, sev_p99, sev_fresh, norms, st) if tail else 0.0
    if (sev_tail <= 1.0 and sev_p50 <= 1.0 and sev_p99 <= 1.0 and sev_fresh <= 1.0
            and sev_shift <= 1.0):
        rel = max(sev_p50, sev_p99, sev_fresh, sev_shift)
        if rel < ONSET_CREDIT_FRACTION:
            return health.NORMAL
        return Judgement(Verdict.NORMAL, Reason.NORMAL.value, severity=rel)
    ref = lim.ref
    ev = Evidence(signal=s.signal, p50=p50, p99=p99 if p99 is not None else s.p99, ratio=ratio,
                  samples=samples, peers_p50=ref, latency_p50_us=s.latency_p50_us,
                  latency_p99_us=s.latency_p99_us, hardware=s.hardware,
                  fresh_p50=fresh_p50 if sev_fresh else None,
                  peers_fresh_p50=lim.fresh_ref if sev_fresh else None)
    # The reason names the most telling rule (a whole-node slowdown is relative_p50 even
    # though its P99 moved as much); the severity that orders ejections is the largest.
    sev = max(sev_tail, sev_p50, sev_p99, sev_fresh, sev_shift)
    if sev_tail > 1.0 and sev_tail >= max(sev_p50, sev_fresh):
        return Judgement(Verdict.ABNORMAL, Reason.P99_P50_RATIO.value, ev, sev,
                         f"p99/p50 {ratio:.2f} > limit {norms.tail_limit:.2f}")
    if sev_p50 > 1.0:
        return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, sev,
                         f"p50 {p50:.1f} > {f50:g} x peers' {ref:.1f}")
    if sev_fresh > 1.0:
        few = f" x {margin:.2f} (few samples)" if margin > 1.0 else ""
        return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, sev,
                         f"p50 of the last {st.tick_interval_s:g} s {fresh_p50:.1f} "
                         f"({s.fresh_samples} samples) > {f50:g} x peers' "
                         f"{lim.fresh_ref:.1f}{few}")
    if sev_p99 > 1.0:
        return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P99.value, ev, sev,
                         f"p99 {p50 * ratio:.1f} > {f99:g} x peers' {lim.ref99:.1f}")
    fresh_part = (f", p50 of the last {st.tick_interval_s:g} s {fresh_p50:.1f}"
                  if sev_fresh and fresh_p50 is not None else "")
    return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, sev,
                     f"p50 {p50:.1f}, p99 {p50 * ratio:.1f}{fresh_part} all > "
                     f"{st.shift_factor:g} x peers' on a heavy-tailed model (peers' "
                     f"p99/p50 {norms.fleet_ratio:.1f} > {st.ratio_threshold:g})")


def quiet_below(p50: float, ratio: float, p99: float, fresh_p50: float | None, norms: Norms,
                lim: Limits, st: DetectorSettings) -> bool:
    """True only when :func:`judge` gives :data:`health.NORMAL` (normal, no onset severity)
    to every pair of ``lim``'s class whose P50, P99/P50, P50 x P99/P50 (``p99``) and fresh
    P50 are at most these, tail judged or not.

    ``judge``'s severities in the same operations: each is a value divided (or multiplied)
    by a positive number, which keeps the order, so the class's largest values bound every
    pair's; called with one pair's own values it is that pair's check. A NaN is never quiet.
    """
    onset = ONSET_CREDIT_FRACTION
    d50, d99, dfresh = lim.d50, lim.d99, lim.dfresh
    sev_p50 = p50 / d50 if d50 > 0 else 0.0
    sev_p99 = p99 / d99 if d99 > 0 else 0.0
    sev_fresh = fresh_p50 / dfresh if fresh_p50 is not None and dfresh > 0 else 0.0
    if not (ratio / norms.tail_limit <= 1.0 and sev_p50 < onset and sev_p99 < onset
            and sev_fresh < onset):
        return False
    if st.shift_factor and norms.fleet_ratio is not None and norms.fleet_ratio > st.ratio_threshold:
        # judge's shift severity is the least of (at least) these two, over shift_factor.
        return (min(sev_p50 * st.relative_p50_factor, sev_p99 * st.relative_p99_factor)
                / st.shift_factor < onset)
    return True


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p) (exact; n is a tick's fresh samples, a few hundred)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    q = 1.0 - p
    term = math.comb(n, k) * p ** k * q ** (n - k)
    total = 0.0
    for i in range(k, n + 1):
        total += term
        if term < total * 1e-12:
            break
        term *= (n - i) / (i + 1) * p / q
    return min(1.0, total)


def fresh_tail_judged(s: WindowSummary) -> bool:
    """False when :func:`judge_fresh_tail` gives no verdict on ``s`` whatever the peers: no
    fresh-tail count, fewer than FRESH_TAIL_MIN_SAMPLES fresh samples, or a count below
    FRESH_TAIL_SHARE of them (most counts: a few fresh samples above the threshold)."""
    k, n = s.fresh_over, s.fresh_samples
    return not (k is None or n < FRESH_TAIL_MIN_SAMPLES or k < FRESH_TAIL_SHARE * n)


def judge_fresh_tail(s: WindowSummary, st: DetectorSettings,
                     peers_p50: float | None = None) -> Judgement | None:
    """A low-rate node's tail, judged on each tick's fresh samples (disjoint evidence).

    ``s.fresh_over`` of its ``s.fresh_samples`` lay above the model's threshold (the peers'
    P99 × FRESH_TAIL_MARGIN, from the previous tick). Abnormal (``relative_p99``) when that
    share is at least FRESH_TAIL_SHARE and a count that high has probability below
    FRESH_TAIL_P for a node whose share is the peers' (at most 1 % above their P99).
    Not judged when the node's fresh P50 is FRESH_TAIL_MARGIN × ``peers_p50`` or more: a
    body that much slower puts that share above the threshold by itself (a node 1.8x
    slower throughout), and the P50 rules own it."""
    k, n = s.fresh_over, s.fresh_samples
    if k is None or not fresh_tail_judged(s):
        return None
    f50 = s.fresh_p50
    if peers_p50 is not None and f50 is not None and f50 >= FRESH_TAIL_MARGIN * peers_p50:
        return None
    p_value = binomial_sf(k, n, FRESH_TAIL_P0)
    if p_value >= FRESH_TAIL_P:
        return None
    ratio = s.ratio
    ev = Evidence(signal=s.signal, p50=s.p50, p99=s.p99, ratio=ratio, samples=s.samples,
                  latency_p50_us=s.latency_p50_us, latency_p99_us=s.latency_p99_us,
                  hardware=s.hardware)
    return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P99.value, ev, (k / n) / FRESH_TAIL_SHARE,
                     f"{k} of {n} requests since the last tick above {FRESH_TAIL_MARGIN:g} x the "
                     f"peers' P99 ({k / n:.1%}; p = {p_value:.1e} for a healthy node)")


def judge_probe(s: WindowSummary, norms: Norms, st: DetectorSettings,
                fresh: Norms | None = None) -> Judgement:
    """A quarantined pair's probe round: its samples since the round began, by the same
    rules against the current peers, the fresh-tail rule included (no verdict below
    ``probe_min_samples``), and the fresh P50 rule when ``fresh`` (the peers' fresh P50
    references) is given, so a round is not passed against window P50s that still hold a
    fleet-wide peak's samples (why: docs/rules.md, probes)."""
    need = st.probe_min_samples
    lim = limits(norms, fresh, s.hardware, st)
    if s.samples >= need and s.p50 is not None and s.p99 is not None and s.p50 > 0:
        p50, p99, n = s.p50, s.p99, s.samples
        j = judge(s, p50, p99 / p50, n, norms, st, p99, lim=lim)
        # A node ejected on its fresh tail stays out while that tail lasts (no bounce).
        tail = (judge_fresh_tail(s, st, norms.p50_ref(s.hardware))
                if s.fresh_over and j.verdict is Verdict.NORMAL else None)
        hold = (probe_shift_hold(s, p50, p99, n, norms, lim, st, ONSET_CREDIT_FRACTION,
                                 tail_support_samples(st))
                if j.verdict is Verdict.NORMAL else None)
        return tail or hold or normal_with_evidence(j, s, p50, p99, n, norms, Reason.NORMAL.value)
    elif (judged_since(s) is None and s.probe_samples >= need
          and s.probe_p50 is not None and s.probe_p99 is not None and s.probe_p50 > 0):
        # Only for a window cut by no one (stage 1 did not know the round yet): a cut
        # window's judged samples already hold every probe since the round began, while
        # probe_* span the whole age bound — probes from before the round (from while the
        # node was still slow) would fail a round that has no sample of its own yet.
        p50, p99, n = s.probe_p50, s.probe_p99, s.probe_samples
    else:
        return health.NO_VERDICT
    j = judge(s, p50, p99 / p50, n, norms, st, p99, lim=lim)
    hold = (probe_shift_hold(s, p50, p99, n, norms, lim, st, ONSET_CREDIT_FRACTION,
                             tail_support_samples(st))
            if j.verdict is Verdict.NORMAL else None)
    return hold or normal_with_evidence(j, s, p50, p99, n, norms, Reason.NORMAL.value)


def normal_with_evidence(j: Judgement, s: WindowSummary, p50: float, p99: float, n: int,
                         norms: Norms, reason: str) -> Judgement:
    """``j``, or when it is normal, a normal verdict with ``reason`` that carries its numbers."""
    if j.verdict is not Verdict.NORMAL:
        return j
    ev = Evidence(signal=s.signal, p50=p50, p99=p99, ratio=p99 / p50, samples=n,
                  peers_p50=norms.p50_ref(s.hardware), latency_p50_us=s.latency_p50_us,
                  latency_p99_us=s.latency_p99_us, hardware=s.hardware)
    return Judgement(Verdict.NORMAL, reason, ev)


def window_bound_s(s: WindowSummary, now_s: float, st: DetectorSettings) -> float:
    """How far back the window's judged samples may reach at ``now_s``: to the latest of
    the age bound, the pair's ``judged_since`` cut-off and its first sample."""
    lo = now_s - st.max_sample_age_s
    since = judged_since(s)
    if since is not None and since > lo:
        lo = since
    first = s.first_seen_ts
    if first is not None and first > lo:
        lo = first
    return now_s - lo


def new_fraction(rate_per_s: MutableMapping[str, float], advanced_ts: Mapping[str, float],
                 node: str, s: WindowSummary, now_s: float, st: DetectorSettings) -> float:
    """The fraction of this window's judged samples newer than the window that last
    advanced the pair's abnormal streak (1.0 when none did); records the pair's sample rate
    in ``rate_per_s``.

    The window holds the newest ``window_size`` judged samples no older than its time bound
    ``lo`` (age bound, cut-off, first sample): it spans ``min(now_s - lo, window_size /
    rate)``. The rate is at least ``samples / (now_s - lo)``, exactly that when the window
    is at most half full; fuller (maybe full), the highest rate measured since is kept. A
    rate that falls while windows stay over half full is over-estimated: more of the window
    counts as new (the check loosens, never delays more). Arrivals are taken as even.
    """
    bound_s = window_bound_s(s, now_s, st)
    samples = s.samples
    if bound_s <= 0 or samples <= 0:
        return 1.0
    rate = samples / bound_s               # at least: every judged sample is within the bound
    window = st.window_size
    if 2 * samples > window:
        # Maybe full (a full ring can count fewer judged samples: failed, probes): the rate
        # is at least this; keep the higher rate measured before.
        before = rate_per_s.get(node, 0.0)
        if before > rate:
            rate = before
    rate_per_s[node] = rate
    last = advanced_ts.get(node)
    if last is None:
        return 1.0
    span_s = min(bound_s, window / rate)
    return min(1.0, (now_s - last) / span_s)


def record_rates(rate_per_s: MutableMapping[str, float],
                 windows: Iterable[tuple[str, WindowSummary]], now_s: float,
                 st: DetectorSettings) -> None:
    """Record the sample rate of each ``(node, summary)`` in ``rate_per_s`` as
    :func:`new_fraction` does (the same arithmetic), for pairs whose new-evidence fraction
    is not needed this tick."""
    lo0 = now_s - st.max_sample_age_s
    bound0_s = now_s - lo0                 # a window bounded by the age bound alone (most)
    half = st.window_size / 2              # 2 x samples > window_size, for an int window_size
    get = rate_per_s.get
    common = bound0_s > 0 and half >= 0
    for node, s in windows:
        first = s.first_seen_ts
        samples = s.samples
        # Most windows are bounded by the age bound alone: no extras (judged_since), first seen
        # before it.
        if s.extra or (first is not None and first > lo0):
            bound_s = window_bound_s(s, now_s, st)
        elif common and samples > half:     # (most: over half full, so samples > 0)
            rate = samples / bound0_s
            if not get(node, 0.0) >= rate:
                rate_per_s[node] = rate
            continue
        else:
            bound_s = bound0_s
        if bound_s <= 0 or samples <= 0:
            continue
        rate = samples / bound_s
        if samples > half and get(node, 0.0) >= rate:
            continue                       # the rate kept is the one recorded (or equal)
        rate_per_s[node] = rate
