"""Routing weights (tailguard.core.judge.weights): the target, its confirmation, the guards, and the
evaluator's tick around them."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings, SettingError
from tailguard.core.contract.types import ModelTick, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.peers import PeerSet, norms_of
from tailguard.core.judge.weights import (
    UP_STEP,
    NodeWeight,
    WeightState,
    guard,
    noise_band,
    step,
    target_weight,
    weigh_model,
)

S = DetectorSettings(max_sample_age_s=30.0)
T0 = 1000.0


def summ(node: str, p50: float, ratio: float = 2.0, samples: int = 500, *,
         hardware: str | None = None) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=0.0, signal="latency",
                         samples=samples, p50=p50, p99=p50 * ratio, latency_p50_us=p50,
                         latency_p99_us=p50 * ratio, hardware=hardware, first_seen_ts=0.0)


def peer_set(p50s: Mapping[str, float], ratio: float = 2.0, samples: int = 500) -> PeerSet:
    sums = [summ(n, v, ratio, samples) for n, v in p50s.items()]
    return PeerSet(list(p50s), sums, list(p50s.values()), [ratio] * len(sums), [], [])


def fleet(n: int = 8, **slow: float) -> dict[str, float]:
    f = {f"n{i}": 100.0 for i in range(n)}
    f.update({k: 100.0 * v for k, v in slow.items()})
    return f


def ticks(p50s: Mapping[str, float], n: int, st: DetectorSettings = S,
          state: WeightState | None = None, *, hold: bool = False,
          routed: frozenset[str] | None = None) -> list[tuple[WeightState, dict[str, float]]]:
    ps = peer_set(p50s)
    norms = norms_of(ps, {}, {}, st).window
    ws = state or WeightState()
    out = []
    for k in range(n):
        wt = weigh_model("m", ws, ps, norms, routed if routed is not None else frozenset(p50s),
                         T0 + k * 30.0, st, hold=hold)
        ws = wt.state
        out.append((ws, dict(wt.weights)))
    return out


def test_a_node_1_6x_slower_is_weighted_down_after_confirm_windows() -> None:
    seen = [w for _, w in ticks(fleet(n3=1.6), 4)]
    assert seen[0] == {} and seen[1] == {}            # two windows agree: not yet
    w = seen[2]["n3"]
    assert set(seen[2]) == {"n3"} and 0.3 <= w <= 0.5     # (1.1 / 1.6)² = 0.47 on the grid
    assert seen[3] == seen[2]                          # and stays there


def test_1_3x_is_weighted_down_less_than_1_6x() -> None:
    w13 = ticks(fleet(n3=1.3), 3)[-1][1]["n3"]
    w16 = ticks(fleet(n3=1.6), 3)[-1][1]["n3"]
    assert w16 < w13 < 0.95


def test_a_node_within_the_noise_of_its_peers_keeps_weight_1() -> None:
    assert ticks(fleet(n3=1.08), 5)[-1][1] == {}
    assert target_weight(108.0, 100.0, math.exp(math.log(1.1)), 0.1) == 1.0


def test_weights_are_bounded_by_min_weight() -> None:
    st = S.replace(min_weight=0.4)
    assert ticks(fleet(n3=1.95), 3, st)[-1][1]["n3"] == 0.4
    assert ticks(fleet(n3=1.95), 3)[-1][1]["n3"] == 0.3  # (1.1/1.95)² = 0.318 → 0.3


def test_the_weight_moves_down_only_when_every_recent_window_agrees() -> None:
    nw = NodeWeight()
    for target in (0.5, 1.0, 0.5, 0.5):              # the 1.0 breaks the agreement
        nw = step(nw, target, 3)
    assert nw.weight == 1.0
    nw = step(nw, 0.4, 3)                              # 0.5, 0.5, 0.4: all below
    assert nw.weight == 0.5                            # to the highest of them


def test_the_weight_moves_back_up_in_steps() -> None:
    nw = NodeWeight(0.3, (0.3, 0.3, 0.3))
    seen = []
    for _ in range(12):
        nw = step(nw, 1.0, 3)
        seen.append(nw.weight)
    assert seen[:2] == [0.3, 0.3]                      # confirmed after three windows
    assert seen[2] == pytest.approx(0.3 + UP_STEP)
    assert all(b - a <= UP_STEP + 1e-9 for a, b in itertools.pairwise(seen))
    assert seen[-1] == 1.0


def test_a_recovered_node_returns_to_1_and_leaves_no_state() -> None:
    run = ticks(fleet(n3=1.6), 3)
    state = run[-1][0]
    after = ticks(fleet(), 15, state=state)
    assert after[-1][1] == {} and after[-1][0].nodes == {}


def test_a_load_event_changes_no_weight() -> None:
    state = ticks(fleet(n3=1.6), 3)[-1][0]
    held = ticks({n: 2.5 * v for n, v in fleet().items()}, 5, state=state, hold=True)
    assert all(w == state.out for _, w in held) and held[-1][0] == state
    # The whole fleet slower together: relative to its peers nobody moved.
    assert ticks({n: 2.5 * v for n, v in fleet().items()}, 5)[-1][1] == {}


def test_the_total_weight_guard_raises_weights_together() -> None:
    slow = {f"n{i}": 1.9 for i in range(3)}           # 3 of 8 at min: total 5 + 3 x 0.3
    st = S.replace(min_total_weight_share=0.8)
    ws = ticks(fleet(**slow), 3, st)[-1][1]
    assert set(ws) == {"n0", "n1", "n2"}
    assert 5 + sum(ws.values()) >= 0.8 * 8 - 1e-9
    assert len(set(ws.values())) == 1                 # the same share of each reduction kept
    assert guard({"a": 0.5}, 8, 0.75) == {"a": 0.5}  # within the share: unchanged
    g = guard({"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1}, 4, 0.75)
    assert sum(g.values()) >= 3.0 - 1e-9 and all(w < 1.0 for w in g.values())


def test_only_routed_nodes_have_a_weight() -> None:
    f = fleet(n3=1.6)
    routed = frozenset(f) - {"n3"}                     # ejected, quarantined, warming, gone
    assert ticks(f, 4, routed=routed)[-1][1] == {}
    state = ticks(f, 3)[-1][0]
    assert "n3" in state.out
    out = ticks(f, 1, state=state, routed=routed)[-1]
    assert out[1] == {} and out[0].nodes == {}         # it comes back at 1.0


def test_a_healthy_fleet_never_goes_below_0_95() -> None:
    # Each window's P50 from 1000 lognormal samples (sigma 0.5; the simulator's), 12 nodes,
    # some a little faster or slower (the scenarios' spread), over 400 ticks.
    rng = np.random.default_rng(7)
    speed = 1.0 + rng.uniform(-0.05, 0.05, 12)
    ws = WeightState()
    lowest = 1.0
    for k in range(400):
        p50s = {f"n{i}": float(np.median(rng.lognormal(math.log(100 * speed[i]), 0.5, 1000)))
                for i in range(12)}
        ps = peer_set(p50s, ratio=math.exp(2.326 * 0.5), samples=1000)
        wt = weigh_model("m", ws, ps, norms_of(ps, {}, {}, S).window, frozenset(p50s),
                         T0 + 30 * k, S)
        ws = wt.state
        lowest = min(lowest, *wt.weights.values(), 1.0)
    assert lowest >= 0.95


def test_few_samples_widen_the_band() -> None:
    # LLM latency without token counts: P99/P50 of 10; 100 samples leave the median unsure.
    assert noise_band(0.0, 10.0, 100) > 1.5 > noise_band(0.0, 10.0, 100_000)
    assert noise_band(0.0, 1.0, 10) == pytest.approx(1.1)


def test_settings_are_validated() -> None:
    with pytest.raises(SettingError, match="weights"):
        DetectorSettings(weights="on")
    with pytest.raises(SettingError, match="min_weight"):
        DetectorSettings(min_weight=0.0)
    with pytest.raises(SettingError, match="min_total_weight_share"):
        DetectorSettings(min_total_weight_share=1.5)


# ---- the evaluator's tick --------------------------------------------------------------------
def run(ev: FleetEvaluator, n: int, spec: Mapping[str, float], t0: float = T0) -> list[ModelTick]:
    return [ev.evaluate("m", [summ(node, v) for node, v in spec.items()], t0 + 30 * k)
            for k in range(n)]


def test_the_evaluator_publishes_weights_changes_and_statuses() -> None:
    ev = FleetEvaluator(S)
    out = run(ev, 5, fleet(n3=1.6))
    w = out[-1].weights
    assert set(w) == {"n3"}
    assert all(t.routing == frozenset(fleet()) for t in out)        # weighted, not ejected
    changes = [c for t in out for c in t.weight_changes]
    assert len(changes) == 1 and changes[0].node_id == "n3" and changes[0].weight == w["n3"]
    assert changes[0].previous_weight == 1.0 and changes[0].reason == "slower_than_peers"
    ev0 = changes[0].evidence
    assert ev0 is not None and ev0.slower == pytest.approx(1.6)
    event = changes[0].to_event()
    assert event["type"] == "weight" and event["evidence"]["slower"] == pytest.approx(1.6)
    st = {s.node_id: s for s in out[-1].statuses}
    assert st["n3"].weight == w["n3"] and "1.60x" in (st["n3"].weight_detail or "")
    assert st["n0"].weight == 1.0


def test_weights_survive_a_snapshot() -> None:
    ev = FleetEvaluator(S)
    run(ev, 4, fleet(n3=1.6))
    ev2 = FleetEvaluator(S)
    ev2.restore(ev.snapshot())
    a = run(ev, 6, fleet(), t0=T0 + 200)
    b = run(ev2, 6, fleet(), t0=T0 + 200)
    assert [t.weights for t in a] == [t.weights for t in b]
    assert a[2].weights["n3"] > a[0].weights["n3"]                # recovering in steps


def test_weights_off_computes_none() -> None:
    ev = FleetEvaluator(S.replace(weights="off"))
    out = run(ev, 5, fleet(n3=1.6))
    assert all(t.weights == {} and t.weight_changes == () for t in out)
    assert all(s.weight is None for s in out[-1].statuses)


def test_a_confirmed_abnormal_node_is_still_ejected() -> None:
    ev = FleetEvaluator(S)
    out = run(ev, 5, fleet(n3=3.0))
    assert "n3" not in out[-1].routing and "n3" not in out[-1].weights


@pytest.mark.parametrize("factor", [1.3, 1.6])
def test_a_steadily_slow_node_does_not_flap(factor: float) -> None:
    # Window P50s from 1000 lognormal samples each (sigma 0.5), one node `factor` slower, for
    # 300 ticks: it is weighted down once (one or two confirmed moves) and then stays put.
    rng = np.random.default_rng(11)
    ws = WeightState()
    seen = []
    for k in range(300):
        p50s = {f"n{i}": float(np.median(rng.lognormal(math.log(100 * (factor if i == 3 else 1)),
                                                        0.5, 1000))) for i in range(8)}
        ps = peer_set(p50s, ratio=math.exp(2.326 * 0.5), samples=1000)
        wt = weigh_model("m", ws, ps, norms_of(ps, {}, {}, S).window, frozenset(p50s),
                         T0 + 30 * k, S)
        ws = wt.state
        seen.append(wt.weights.get("n3", 1.0))
        assert set(wt.weights) <= {"n3"}
    moves = sum(1 for a, b in itertools.pairwise(seen) if a != b)
    assert seen[-1] < 0.95 and moves <= 4, (moves, sorted(set(seen)))
