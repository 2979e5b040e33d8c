"""Hypothesis invariants of the routing weights (tailguard.core.judge.weights), over random
fleets and tick sequences:

* every weight is on the grid, in [min_weight, 0.9] (1.0 is no entry), and only routed nodes
  have one;
* the routed nodes' total weight is at least min_total_weight_share of their number;
* the whole fleet slower (or faster) by one factor gives the same weights;
* relabelling nodes changes nothing but the labels;
* a uniform fleet weights nobody.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.peers import PeerSet, norms_of
from tailguard.core.judge.weights import WEIGHT_STEP, WeightState, weigh_model

S = DetectorSettings(min_total_weight_share=0.8, confirm_windows=2)
T0 = 1_000_000.0

slowness = st.sampled_from([1.0, 1.0, 1.0, 1.05, 1.2, 1.4, 1.6, 1.9, 3.0])
fleets = st.lists(st.lists(slowness, min_size=3, max_size=12), min_size=1, max_size=8).filter(
    lambda ticks: len({len(t) for t in ticks}) == 1)


def run(ticks: list[list[float]], scale: float = 1.0,
        names: list[str] | None = None) -> list[dict[str, float]]:
    n = len(ticks[0])
    names = names or [f"n{i}" for i in range(n)]
    ws = WeightState()
    out = []
    for k, factors in enumerate(ticks):
        p50s = {names[i]: 1000.0 * scale * f for i, f in enumerate(factors)}
        sums = [WindowSummary(node_id=node, model="m", tick_ts=0.0, signal="latency", samples=500,
                              p50=v, p99=2 * v, latency_p50_us=v, latency_p99_us=2 * v)
                for node, v in p50s.items()]
        ps = PeerSet(list(p50s), sums, list(p50s.values()), [2.0] * n, [], [])
        routed = frozenset(names[i] for i in range(n) if factors[i] < 3.0)   # the 3x: ejected
        wt = weigh_model("m", ws, ps, norms_of(ps, {}, {}, S).window, routed, T0 + 30 * k, S)
        ws = wt.state
        out.append(dict(wt.weights))
    return out


def check_bounds(weights: Mapping[str, float], routed: int) -> None:
    for w in weights.values():
        assert S.min_weight <= w <= 0.9 + 1e-9
        assert abs(w / WEIGHT_STEP - round(w / WEIGHT_STEP)) < 1e-6
    assert routed - sum(1.0 - w for w in weights.values()) >= S.min_total_weight_share * routed - 1e-9


@settings(max_examples=150, deadline=None)
@given(fleets)
def test_weights_stay_in_bounds_and_the_guard_holds(ticks: list[list[float]]) -> None:
    for factors, weights in zip(ticks, run(ticks), strict=True):
        routed = {f"n{i}" for i, f in enumerate(factors) if f < 3.0}
        assert set(weights) <= routed
        check_bounds(weights, len(routed))


@settings(max_examples=100, deadline=None)
@given(fleets, st.sampled_from([0.5, 2.5, 7.0]))
def test_the_whole_fleet_slower_together_changes_no_weight(ticks: list[list[float]],
                                                           scale: float) -> None:
    assert run(ticks, scale) == run(ticks)


@settings(max_examples=100, deadline=None)
@given(fleets, st.randoms(use_true_random=False))
def test_relabelling_nodes_changes_nothing_but_the_labels(ticks: list[list[float]],
                                                          rnd: object) -> None:
    n = len(ticks[0])
    names = [f"x{i}" for i in range(n)]
    rnd.shuffle(names)  # type: ignore[attr-defined]
    plain = run(ticks)
    renamed = run(ticks, names=names)
    back = {f"n{i}": names[i] for i in range(n)}
    assert [{back[k]: v for k, v in w.items()} for w in plain] == renamed


@given(st.integers(3, 40), st.integers(1, 6))
def test_a_uniform_fleet_weights_nobody(n: int, ticks: int) -> None:
    assert run([[1.0] * n] * ticks) == [{}] * ticks
