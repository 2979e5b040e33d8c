"""The tail limit with its shortcut (tail_noise.noise_below) equals the full computation.

The reference is the computation before the shortcut (kept here): every log ratio, their
median, the median of the absolute deviations, ``max(ratio_threshold, fleet_ratio_factor x
median, exp(mid + K x 1.4826 x MAD))``. Drawn: spreads from a tight fleet to heavy tails, with
ties and outliers, and bounds set right at, just below and just above the exact noise limit
(where a proof with too little margin would give the bound instead of the noise limit).
"""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.judge.peers import TAIL_NOISE_K, median_sorted, tail_limit_sorted
from tailguard.core.judge.tail_noise import noise_below


def reference(ratios: list[float], median_ratio: float, s: DetectorSettings) -> float:
    return max(s.ratio_threshold, s.fleet_ratio_factor * median_ratio, noise_of(ratios))


def noise_of(ratios: list[float]) -> float:
    """The exact noise limit alone."""
    logs = sorted(math.log(r) for r in ratios)
    mid = median_sorted(logs)
    mad = median_sorted(sorted(abs(x - mid) for x in logs))
    return math.exp(mid + TAIL_NOISE_K * 1.4826 * mad)


spreads = st.sampled_from([0.001, 0.02, 0.1, 0.3, 1.0, 2.5])
ratio_lists = st.builds(
    lambda centre, spread, zs, outliers: sorted(
        [centre * math.exp(spread * z) for z in zs] + outliers),
    st.floats(1.01, 40.0), spreads,
    st.lists(st.floats(-3.0, 3.0), min_size=1, max_size=120),
    st.lists(st.sampled_from([1.0001, 50.0, 400.0]), max_size=5))


@settings(max_examples=400, deadline=None)
@given(ratio_lists, st.floats(1.0, 3.0), st.floats(1.0001, 12.0))
@example([2.0, 2.0, 2.0, 2.0], 1.5, 3.0)           # no spread: the bound by any proof
@example([1.5, 2.0, 9.0], 1.0, 3.0)
def test_the_limit_equals_the_full_computation(ratios: list[float], factor: float,
                                               threshold: float) -> None:
    s = DetectorSettings(ratio_threshold=threshold, fleet_ratio_factor=factor)
    m = median_sorted(ratios)
    assert tail_limit_sorted(ratios, m, s) == reference(ratios, m, s)


@settings(max_examples=300, deadline=None)
@given(ratio_lists, st.sampled_from([-1e-6, -1e-12, -1e-15, 0.0, 1e-15, 1e-12, 1e-9, 1e-6]))
def test_a_bound_at_the_noise_limit_is_never_proved_above_it(ratios: list[float],
                                                             rel: float) -> None:
    noise = noise_of(ratios)
    bound = noise * (1.0 + rel)
    if not 1.0 < bound <= 1000.0:
        return
    s = DetectorSettings(ratio_threshold=bound, fleet_ratio_factor=1.0)
    m = median_sorted(ratios)
    if noise_below(ratios, TAIL_NOISE_K * 1.4826, bound):
        assert noise < bound
    assert tail_limit_sorted(ratios, m, s) == reference(ratios, m, s)


def test_the_proof_holds_for_a_quiet_fleet_and_not_past_its_noise() -> None:
    # 100 ratios around 2.0, spread 2 % (a healthy fleet's windows): the noise limit is well
    # below the bound 3.0, and the proof says so; a bound below the noise limit: no proof.
    ratios = sorted(2.0 * math.exp(0.02 * ((i * 37) % 101 - 50) / 50) for i in range(100))
    noise = noise_of(ratios)
    assert noise < 2.5
    assert noise_below(ratios, TAIL_NOISE_K * 1.4826, 3.0)
    assert not noise_below(ratios, TAIL_NOISE_K * 1.4826, noise)
    assert not noise_below(ratios, TAIL_NOISE_K * 1.4826, noise * 0.999)
    assert not noise_below([*ratios[:-1], math.inf], TAIL_NOISE_K * 1.4826, 3.0)
