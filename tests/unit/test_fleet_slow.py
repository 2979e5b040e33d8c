"""A fleet that slows down together is announced (tailguard.core.fleet_slow via FleetEvaluator):
every live node of a model far slower than its own baseline opens one ``fleet_slow`` event
with the numbers, and its return closes it with ``fleet_slow_end``."""

from __future__ import annotations

from collections.abc import Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import FleetEvent, ModelTick, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.model_state import ModelState

S = DetectorSettings(max_sample_age_s=30.0)
T0 = 1000.0


def summ(node: str, p50: float) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=0.0, signal="latency", samples=500,
                         p50=p50, p99=2 * p50, latency_p50_us=p50, latency_p99_us=2 * p50,
                         hardware=None, first_seen_ts=0.0)


def run(ev: FleetEvaluator, ticks: int, p50s: Mapping[str, float], t0: float) -> list[ModelTick]:
    return [ev.evaluate("m", [summ(n, p) for n, p in p50s.items()], t0 + k * S.tick_interval_s)
            for k in range(ticks)]


def fleet_events(ticks: list[ModelTick], kind: str) -> list[FleetEvent]:
    return [e for t in ticks for e in t.fleet_events if e.kind == kind]


def test_two_nodes_ten_times_slower_together_open_one_fleet_event_with_the_numbers() -> None:
    ev = FleetEvaluator(S)
    t = T0
    before = run(ev, 10, {"a": 100.0, "b": 100.0}, t)
    t += 10 * 30
    # a slows alone: taken out (against its own baseline moved as b moved), no fleet event
    alone = run(ev, 6, {"a": 1000.0, "b": 100.0}, t)
    t += 6 * 30
    assert "a" not in alone[-1].routing
    # then b slows too: every live node is 10x its own baseline
    both = run(ev, 12, {"a": 1000.0, "b": 1000.0}, t)
    t += 12 * 30
    assert not fleet_events(before + alone, "fleet_slow")
    (opened,) = fleet_events(both, "fleet_slow")
    assert opened.judged_nodes == 2 and opened.abnormal_nodes == 2
    assert opened.fleet_p50 == 1000.0
    assert opened.baseline_p50 is not None and 95.0 < opened.baseline_p50 < 105.0
    assert opened.detail is not None and "x10" in opened.detail and "2 of 2" in opened.detail
    # the choice (docs/rules.md): a quarantined node no slower than its peers is let back in
    assert both[-1].routing == {"a", "b"}
    assert not fleet_events(both, "fleet_slow_end")      # still slow: the episode stays open
    # the fleet recovers: one closing event
    after = run(ev, 4, {"a": 100.0, "b": 100.0}, t)
    (closed,) = fleet_events(after, "fleet_slow_end")
    assert closed.fleet_p50 == 100.0
    assert not fleet_events(after, "fleet_slow")


def test_a_lasting_slowdown_stays_one_episode_while_the_baselines_follow() -> None:
    ev = FleetEvaluator(S)
    run(ev, 10, {"a": 100.0, "b": 100.0, "c": 100.0}, T0)
    slow = run(ev, 120, {"a": 400.0, "b": 400.0, "c": 400.0}, T0 + 300)   # one hour slow
    assert len(fleet_events(slow, "fleet_slow")) == 1
    assert not fleet_events(slow, "fleet_slow_end")


def test_one_slow_node_among_normal_ones_is_no_fleet_event() -> None:
    ev = FleetEvaluator(S)
    run(ev, 10, {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0}, T0)
    ticks = run(ev, 10, {"a": 1000.0, "b": 100.0, "c": 100.0, "d": 100.0}, T0 + 300)
    assert not fleet_events(ticks, "fleet_slow")


def test_an_open_episode_survives_a_snapshot() -> None:
    ev = FleetEvaluator(S)
    run(ev, 10, {"a": 100.0, "b": 100.0}, T0)
    assert fleet_events(run(ev, 3, {"a": 1000.0, "b": 1000.0}, T0 + 300), "fleet_slow")
    snap = ev.snapshot_model("m")
    assert ModelState.from_dict(snap).to_dict() == snap
    ev2 = FleetEvaluator(S)
    ev2.restore_model("m", snap)
    again = run(ev2, 3, {"a": 1000.0, "b": 1000.0}, T0 + 390)
    assert not fleet_events(again, "fleet_slow")           # the same episode, not a new one
    assert fleet_events(run(ev2, 2, {"a": 100.0, "b": 100.0}, T0 + 480), "fleet_slow_end")
