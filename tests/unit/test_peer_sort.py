"""``norms_of`` sorts a model's columns with numpy (``peer_sort``): the floats Python's
``sorted`` gives, also for a product that overflows, ratios of both zeros and fresh P50s
missing or not finite."""

from __future__ import annotations

import sys

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.health import PairState
from tailguard.core.judge.peers import (
    PeerNorms,
    fresh_norms,
    gather_peers,
    median_sorted,
    norms_of,
    window_norms,
)

S = DetectorSettings()


def _s(i: int, p50: float, p99: float, fresh_p50: float | None = None) -> WindowSummary:
    return WindowSummary(node_id=f"n{i}", model="m", tick_ts=0.0, signal="latency", samples=1000,
                         p50=p50, p99=p99, latency_p50_us=p50, latency_p99_us=p99,
                         first_seen_ts=0.0, fresh_p50=fresh_p50, fresh_samples=500)


def _both(sums: list[WindowSummary], st: DetectorSettings = S) -> PeerNorms:
    """norms_of over ``sums``, checked against window_norms and fresh_norms (sorted by Python)."""
    pairs = {s.node_id: PairState(s.node_id, "m", HealthState.HEALTHY, 0.0, 0.0, "normal", True)
             for s in sums}
    ps = gather_peers({s.node_id: s for s in sums}, pairs, st.min_samples)
    pn = norms_of(ps, {}, {}, st)
    assert repr(pn.window) == repr(window_norms(list(ps), {}, {}, st))
    assert repr(pn.fresh) == repr(fresh_norms(list(ps), {}, {}, st))
    return pn


def test_a_product_past_the_largest_float_is_inf_without_a_warning() -> None:
    big = sys.float_info.max
    assert 3.0 * (big / 3.0) == float("inf")
    pn = _both([_s(0, 3.0, big), *(_s(i, 100.0 + i, 250.0, 100.0) for i in range(1, 6))])
    assert pn.top[""][2] == float("inf")


def test_ratios_of_both_zeros_keep_sorteds_order() -> None:
    # (numpy orders 0.0 and -0.0 as it likes from 17 values on)
    few = S.replace(min_peers=50)
    for n in (3, 20, 21, 40):
        p99s = [(0.0, -0.0, -0.0)[i % 3] for i in range(n)]
        pn = _both([_s(i, 100.0, p99) for i, p99 in enumerate(p99s)], few)
        ratios = sorted(p99 / 100.0 for p99 in p99s)
        assert repr(pn.ratio) == repr(median_sorted(ratios))
        assert repr(pn.top[""][1:3]) == repr((ratios[-1], max(p99s)))
    # zeros below the middle: the tail limit is the bound (no log of a zero ratio)
    pn = _both([*(_s(i, 100.0, (0.0, -0.0)[i % 2]) for i in range(10)),
                *(_s(i, 100.0, 200.0) for i in range(10, 30))])
    assert pn.ratio == 2.0 and pn.window.fleet_p99 == 200.0


def test_fresh_p50s_missing_or_not_finite_are_sorted_as_before() -> None:
    peers = [_s(i, 100.0 + i, 300.0, 90.0 + 3 * i) for i in range(7)]
    pn = _both([*peers, _s(8, 120.0, 300.0), _s(9, 130.0, 300.0)])
    assert pn.fresh is not None and pn.fresh.fleet_p50 == 99.0
    assert pn.top[""][3] == 108.0
    pn = _both([*peers, _s(8, 120.0, 300.0, float("inf"))])
    assert pn.top == {}
    pn = _both([*peers, _s(8, 120.0, 300.0, -1.0), _s(9, 130.0, 300.0, 0.0)])
    assert pn.top[""][3] == 108.0
