"""Table-driven tests of the per-model rules and fleet guards (tailguard.core.judge.evaluate)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState as H
from tailguard.core.contract.types import ModelTick, Reason, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.peers import median

# Windows hold the last tick interval only (age bound 30 s): consecutive windows share no
# samples, so each abnormal one is new evidence (see test_tail_verdict_on_an_overlapping_window_*).
S = DetectorSettings(max_sample_age_s=30.0)
T0 = 1000.0   # all nodes first seen at 0: warm-up (120 s) is over by T0


def summ(node: str, p50: float | None, ratio: float = 2.0, samples: int = 500, *,
         model: str = "m", hardware: str | None = None, first_seen: float = 0.0,
         probe_samples: int = 0, probe_p50: float | None = None,
         probe_ratio: float = 2.0) -> WindowSummary:
    p99 = None if p50 is None else p50 * ratio
    return WindowSummary(node_id=node, model=model, tick_ts=0.0, signal="latency", samples=samples,
                         p50=p50, p99=p99, latency_p50_us=p50, latency_p99_us=p99,
                         hardware=hardware, first_seen_ts=first_seen, probe_samples=probe_samples,
                         probe_p50=probe_p50,
                         probe_p99=None if probe_p50 is None else probe_p50 * probe_ratio)


Fleet = Mapping[str, tuple[float | None, float]]


def fleet(n: int, p50: float = 100.0, ratio: float = 2.0, **over: tuple[float | None, float]
          ) -> dict[str, tuple[float | None, float]]:
    f: dict[str, tuple[float | None, float]] = {f"n{i:02d}": (p50, ratio) for i in range(n)}
    f.update(over)
    return f


def run(ev: FleetEvaluator, ticks: int, spec: Fleet | Callable[[int], Fleet], *, t0: float = T0,
        samples: int = 500, hardware: Mapping[str, str] | None = None) -> list[ModelTick]:
    out = []
    for k in range(ticks):
        f = spec(k) if callable(spec) else spec
        sums = [summ(n, p50, r, samples, hardware=(hardware or {}).get(n)) for n, (p50, r) in f.items()]
        out.append(ev.evaluate("m", sums, t0 + k * S.tick_interval_s))
    return out


def states(ev: FleetEvaluator, model: str = "m") -> dict[str, H]:
    snap = ev.snapshot_model(model)
    return {n: H(p["state"]) for n, p in snap["pairs"].items()}


def test_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_first_tick_admits_a_fleet_whose_warm_up_is_over_on_its_evidence() -> None:
    ev = FleetEvaluator(S)
    tick = run(ev, 1, fleet(4))[0]
    # warm-up long over and 500 judged samples within the age bound after it: admitted at once
    assert [t.reason for t in tick.transitions] == [str(Reason.FIRST_SEEN)] * 4 + [str(Reason.ADMITTED)] * 4
    assert tick.routing == {"n00", "n01", "n02", "n03"}
    assert all(t.to_state is H.HEALTHY for t in tick.transitions[4:])


def test_first_tick_without_evidence_routes_nobody() -> None:
    ev = FleetEvaluator(S)
    tick = run(ev, 1, fleet(4), samples=S.min_samples - 1)[0]
    assert [t.reason for t in tick.transitions] == [str(Reason.FIRST_SEEN)] * 4
    assert tick.routing == frozenset() and not any(t.routed for t in tick.transitions)
    assert set(states(ev).values()) == {H.WARMING}
    assert tick.quarantine == {}          # not taken out, not probed: awaiting admission


def test_steady_fleet_emits_nothing_after_first_tick() -> None:
    ev = FleetEvaluator(S)
    ticks = run(ev, 20, fleet(6))
    assert all(not t.transitions for t in ticks[1:])
    assert all(not t.fleet_events for t in ticks)


def test_two_nodes_without_own_history_get_no_relative_p50_verdict() -> None:
    # Below min_peers the P50 reference is each node's own baseline (tailguard.core.judge.own_history),
    # which needs own_history.MIN_TICKS normal windows first: before that, no verdict.
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(2))
    ticks = run(ev, 2, fleet(2, n00=(300.0, 2.0)), t0=T0 + 30)
    assert [t for tick in ticks for t in tick.transitions] == []
    assert ticks[-1].routing == set(fleet(2))


@pytest.mark.parametrize(
    ("name", "n", "bad", "reason", "ejected"),
    [
        ("tail fault", 6, (100.0, 6.0), Reason.P99_P50_RATIO, True),
        ("tail below threshold", 6, (100.0, 2.9), None, False),
        ("uniform 3x slowdown", 6, (300.0, 2.0), Reason.RELATIVE_P50, True),
        ("1.9x slower: inside the factor", 6, (190.0, 2.0), None, False),
        ("2 nodes: absolute tail rule alone", 2, (100.0, 4.0), Reason.P99_P50_RATIO, True),
    ],
)
def test_single_node_rules(name: str, n: int, bad: tuple[float, float], reason: Reason | None,
                           ejected: bool) -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(n))
    ticks = run(ev, 4, fleet(n, n00=bad), t0=T0 + 30)
    trans = [t for tick in ticks for t in tick.transitions]
    if reason is None:
        assert trans == [], name
        assert ticks[-1].routing == set(fleet(n)), name
        return
    assert [(t.from_state, t.to_state) for t in trans] == [
        (H.HEALTHY, H.SUSPECT), (H.SUSPECT, H.UNHEALTHY), (H.UNHEALTHY, H.QUARANTINED)], name
    assert all(t.reason == str(reason) for t in trans[:2]), name
    assert trans[1].routed is False and trans[1].ts == T0 + 30 + 2 * 30
    assert ("n00" in ticks[-1].routing) is not ejected
    assert ticks[2].diagnostics and ticks[2].diagnostics[0].node_id == "n00"
    assert trans[1].p50 == bad[0] and trans[1].samples == 500
    if reason is Reason.RELATIVE_P50:
        assert trans[1].peers_p50 == 100.0


def test_heavy_tail_shared_by_the_fleet_flags_nobody() -> None:
    ev = FleetEvaluator(S)
    ticks = run(ev, 10, fleet(8, ratio=8.0))
    assert all(len(t.routing) == 8 for t in ticks)
    assert [tr for t in ticks[1:] for tr in t.transitions] == []


def test_heavy_tail_fleet_still_catches_a_worse_tail() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(8, ratio=5.0))
    ticks = run(ev, 3, fleet(8, ratio=5.0, n03=(100.0, 9.0)), t0=T0 + 30)
    assert "n03" not in ticks[-1].routing
    assert len(ticks[-1].routing) == 7


def test_insufficient_data_keeps_streak() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(5))

    def spec(k: int) -> Fleet:
        return fleet(5, n00=(100.0, 6.0))

    run(ev, 2, spec, t0=T0 + 30)
    assert states(ev)["n00"] is H.SUSPECT
    run(ev, 3, fleet(5, n00=(100.0, 6.0)), t0=T0 + 90, samples=50)   # too few: no verdict
    assert states(ev)["n00"] is H.SUSPECT
    assert ev.snapshot_model("m")["pairs"]["n00"]["abnormal_streak"] == 2
    tick = run(ev, 1, fleet(5, n00=(100.0, 6.0)), t0=T0 + 180)[0]
    assert "n00" not in tick.routing


def test_spike_shorter_than_confirm_windows_does_not_eject() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(5))

    def spec(k: int) -> Fleet:
        return fleet(5, n00=(100.0, 6.0)) if k % 3 != 2 else fleet(5)

    ticks = run(ev, 12, spec, t0=T0 + 30)
    assert all("n00" in t.routing for t in ticks)
    kinds = {(t.from_state, t.to_state) for tk in ticks for t in tk.transitions}
    assert kinds == {(H.HEALTHY, H.SUSPECT), (H.SUSPECT, H.HEALTHY)}


def test_hardware_classes_do_not_punish_the_slower_class() -> None:
    hw = {f"n{i:02d}": ("A100" if i < 5 else "A10") for i in range(9)}
    f = {n: ((100.0 if hw[n] == "A100" else 280.0), 2.0) for n in hw}
    ev = FleetEvaluator(S)
    ticks = run(ev, 8, f, hardware=hw)
    assert all(len(t.routing) == 9 for t in ticks)
    # …but an A10 far slower than the other A10s is caught
    f2 = dict(f, n07=(900.0, 2.0))
    ticks = run(ev, 3, f2, t0=T0 + 8 * 30, hardware=hw)
    assert ticks[-1].routing == set(hw) - {"n07"}
    assert any(t.reason == str(Reason.RELATIVE_P50) and t.peers_p50 == 280.0
               for tk in ticks for t in tk.transitions)


def test_small_hardware_class_is_judged_against_its_own_baseline() -> None:
    hw = {f"n{i:02d}": ("A100" if i < 6 else "A10") for i in range(8)}
    f = {n: ((100.0 if hw[n] == "A100" else 400.0), 2.0) for n in hw}
    ev = FleetEvaluator(S)
    ticks = run(ev, 6, f, hardware=hw)
    assert all(len(t.routing) == 8 for t in ticks)        # the slower class is not punished
    # the whole fleet doubles (a load peak that stays under the load-event bar for the A10s):
    # the A10s' reference moves with it
    both = {n: (2 * v[0], v[1]) for n, v in f.items()}
    ticks = run(ev, 4, both, t0=T0 + 180, hardware=hw)
    assert all(len(t.routing) == 8 for t in ticks)
    # one A10 3x slower than its own history (its class has 2 nodes: no class median)
    ticks = run(ev, 4, dict(both, n07=(2400.0, 2.0)), t0=T0 + 300, hardware=hw)
    assert ticks[-1].routing == set(hw) - {"n07"}
    out = next(t for tk in ticks for t in tk.transitions if not t.routed)
    assert out.reason == "relative_p50" and out.peers_p50 == pytest.approx(800.0, rel=0.1)


def test_small_hardware_class_without_a_baseline_is_not_judged_by_p50() -> None:
    hw = {f"n{i:02d}": ("A100" if i < 6 else "A10") for i in range(8)}
    f = {n: ((100.0 if hw[n] == "A100" else 400.0), 2.0) for n in hw}
    ev = FleetEvaluator(S)
    ticks = run(ev, 6, dict(f, n07=(1200.0, 2.0)), hardware=hw)   # slow from the start
    assert all(len(t.routing) == 8 for t in ticks)
    # its tail still counts
    ticks = run(ev, 3, dict(f, n07=(1200.0, 7.0)), t0=T0 + 180, hardware=hw)
    assert "n07" not in ticks[-1].routing


def test_ejection_cap_keeps_the_rest_routed_and_ejects_worst_first() -> None:
    ev = FleetEvaluator(S.replace(max_ejected_fraction=0.25))
    run(ev, 1, fleet(8))
    bad = {"n00": (100.0, 4.0), "n01": (100.0, 7.0), "n02": (100.0, 5.0)}
    ticks = run(ev, 4, fleet(8, **bad), t0=T0 + 30)
    last = ticks[-1]
    assert len(last.routing) == 6                  # floor(0.25 * 8) = 2 out
    assert "n01" not in last.routing and "n02" not in last.routing and "n00" in last.routing
    kept = [t for tk in ticks for t in tk.transitions if t.reason == str(Reason.EJECTION_CAP)]
    assert [(t.node_id, t.to_state, t.routed) for t in kept] == [("n00", H.UNHEALTHY, True)]
    assert states(ev)["n00"] is H.UNHEALTHY


def test_kept_node_is_ejected_when_room_appears() -> None:
    ev = FleetEvaluator(S.replace(max_ejected_fraction=0.125, backoff_initial_s=0.0))
    run(ev, 1, fleet(8))
    ticks = run(ev, 3, fleet(8, n00=(100.0, 9.0), n01=(100.0, 6.0)), t0=T0 + 30)
    assert "n00" not in ticks[-1].routing and "n01" in ticks[-1].routing
    # n00 recovers (probe traffic normal) → room for n01
    ticks = run(ev, 3, fleet(8, n01=(100.0, 6.0)), t0=T0 + 120)
    assert "n00" in ticks[-1].routing and "n01" not in ticks[-1].routing
    t01 = [t for tk in ticks for t in tk.transitions if t.node_id == "n01"]
    assert (t01[0].from_state, t01[0].to_state, t01[0].routed) == (H.UNHEALTHY, H.UNHEALTHY, False)


def test_never_the_last_routed_node() -> None:
    ev = FleetEvaluator(S.replace(max_ejected_fraction=1.0))
    run(ev, 1, fleet(1))
    ticks = run(ev, 5, fleet(1, n00=(100.0, 9.0)), t0=T0 + 30)
    assert all(t.routing == {"n00"} for t in ticks)


def test_load_event_ejects_nobody_and_is_reported_once() -> None:
    ev = FleetEvaluator(S)
    run(ev, 5, fleet(8))
    peak = fleet(8, p50=260.0, ratio=4.0)
    ticks = run(ev, 6, peak, t0=T0 + 150)
    assert all(len(t.routing) == 8 for t in ticks)
    kinds = [e.kind for t in ticks for e in t.fleet_events]
    assert kinds.count("load_event") == 1 and kinds.count("baseline_shift") == 1
    ev_ = next(e for t in ticks for e in t.fleet_events if e.kind == "load_event")
    assert ev_.judged_nodes == 8 and ev_.abnormal_nodes == 8 and ev_.ts == T0 + 150
    assert all(tr.to_state is not H.UNHEALTHY for t in ticks for tr in t.transitions)
    after = run(ev, 2, fleet(8), t0=T0 + 330)
    kinds = [e.kind for t in after for e in t.fleet_events]
    assert "load_event_end" in kinds and "baseline_shift_end" in kinds


def test_majority_abnormal_by_node_rules_is_a_load_event() -> None:
    ev = FleetEvaluator(S)
    run(ev, 3, fleet(6))
    ticks = run(ev, 5, fleet(6, n00=(100.0, 6.0), n01=(100.0, 6.0), n02=(100.0, 6.0)),
                t0=T0 + 90)
    assert all(len(t.routing) == 6 for t in ticks)
    assert [e.kind for t in ticks for e in t.fleet_events] == ["load_event"]


def test_lasting_shift_becomes_the_new_baseline() -> None:
    ev = FleetEvaluator(S)
    run(ev, 5, fleet(6))
    ticks = run(ev, 40, fleet(6, p50=300.0), t0=T0 + 150)
    kinds = [e.kind for t in ticks for e in t.fleet_events]
    assert kinds[:2] == ["load_event", "baseline_shift"] and "load_event_end" in kinds
    # once the baseline has followed, a single slow node is caught again
    later = run(ev, 4, fleet(6, p50=300.0, n00=(900.0, 2.0)), t0=T0 + 150 + 40 * 30)
    assert "n00" not in later[-1].routing


def test_warming_node_is_not_judged_and_joins_peers_after() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(5))
    s_new = summ("new", 800.0, 6.0, first_seen=T0 + 30)
    for k in range(4):     # 120 s of warm-up: not judged, not routed (admission by evidence)
        tick = ev.evaluate("m", [summ(f"n{i:02d}", 100.0) for i in range(5)] + [s_new],
                           T0 + 30 + 30 * k)
        assert "new" not in tick.routing and len(tick.routing) == 5
    assert states(ev)["new"] is H.WARMING
    # warm-up over: a window that may still hold warm-up samples (not cut yet) is no evidence
    tick = ev.evaluate("m", [summ(f"n{i:02d}", 100.0) for i in range(5)] + [summ("new", 100.0)],
                       T0 + 150)
    assert tick.transitions == () and "new" not in tick.routing
    assert ev.judge_since("m", T0 + 150) == {("new", "m"): T0 + 30 + 120}
    # the window store cut it at warm-up's end: a normal window admits it
    cut = summ("new", 100.0)._replace(extra={"judged_since": T0 + 150})
    tick = ev.evaluate("m", [summ(f"n{i:02d}", 100.0) for i in range(5)] + [cut], T0 + 180)
    assert [(t.node_id, t.reason, t.routed) for t in tick.transitions] == [
        ("new", str(Reason.ADMITTED), True)]
    assert "new" in tick.routing


def test_heartbeat_only_node_is_never_routed() -> None:
    ev = FleetEvaluator(S)
    for k in range(10):
        tick = ev.evaluate("m", [summ("idle", None, samples=0, first_seen=T0)], T0 + 30 * k)
        assert tick.routing == frozenset()
        assert tick.statuses[0].state is H.WARMING and not tick.statuses[0].routed


def test_recovery_after_probe_with_backoff() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(5))
    run(ev, 3, fleet(5, n00=(100.0, 6.0)), t0=T0 + 30)         # ejected at T0+90
    # the probe round begins when the back-off has passed (T0+120), not at ejection
    assert ev.judge_since("m", T0 + 100) == {("n00", "m"): T0 + 120}
    assert ev.judge_since("m", T0 + 120) == {("n00", "m"): T0 + 120}
    tick = run(ev, 1, fleet(5, n00=(100.0, 2.0)), t0=T0 + 120)[0]
    assert [t.to_state for t in tick.transitions] == [H.QUARANTINED]
    assert tick.quarantine == {"n00": T0 + 90 + 30}
    tick = run(ev, 1, fleet(5, n00=(100.0, 2.0)), t0=T0 + 150)[0]
    assert [(t.to_state, t.reason) for t in tick.transitions] == [(H.HEALTHY, "probe_passed")]
    assert "n00" in tick.routing
    # a second ejection doubles the back-off
    run(ev, 3, fleet(5, n00=(100.0, 6.0)), t0=T0 + 180)
    run(ev, 1, fleet(5, n00=(100.0, 6.0)), t0=T0 + 270)
    assert ev.pair("m", "n00").probe_after_ts == T0 + 240 + 60  # type: ignore[union-attr]


@pytest.mark.parametrize("nodes", [3, 4])
def test_in_a_small_fleet_a_node_slow_from_the_start_stays_out(nodes: int) -> None:
    # Refused at admission against the other new nodes (cold start); its probe rounds then
    # have fewer than min_peers routed peers: judged like admission, pooled with them, it
    # stays out (by the absolute ratio rule alone it was let back in, and flapped).
    ev = FleetEvaluator(S)
    ticks = run(ev, 40, fleet(nodes, n00=(300.0, 2.0)))
    trans = [(t.to_state, t.reason) for tk in ticks for t in tk.transitions if t.node_id == "n00"]
    assert any(st is H.UNHEALTHY for st, _ in trans), trans
    assert any(reason == "probe_failed" for _, reason in trans), trans
    assert all(st is not H.HEALTHY for st, _ in trans), trans
    assert all("n00" not in tk.routing for tk in ticks)
    assert ticks[-1].routing == {f"n{i:02d}" for i in range(1, nodes)}


def test_in_a_small_fleet_a_recovered_node_is_let_back_in() -> None:
    ev = FleetEvaluator(S)
    run(ev, 10, fleet(3, n00=(300.0, 2.0)))
    ticks = run(ev, 30, fleet(3), t0=T0 + 300)
    assert "n00" in ticks[-1].routing
    assert [t.reason for tk in ticks for t in tk.transitions if t.node_id == "n00"][-1] == "probe_passed"


def test_a_tick_without_enough_peers_does_not_end_a_relative_streak() -> None:
    # n00 is suspect by relative_p50; next tick two peers have too few samples to be peers
    # (a lull): no reference, so no verdict, and the streak goes on when they are back.
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(4))

    def tick(k: int, thin: bool) -> ModelTick:
        sums = [summ("n00", 300.0), summ("n01", 100.0),
                summ("n02", 100.0, samples=20 if thin else 500),
                summ("n03", 100.0, samples=20 if thin else 500)]
        return ev.evaluate("m", sums, T0 + 30.0 * k)

    first = tick(1, thin=False)
    assert [(t.node_id, t.to_state, t.reason) for t in first.transitions] == \
        [("n00", H.SUSPECT, "relative_p50")]
    lull = tick(2, thin=True)
    assert [t for t in lull.transitions if t.node_id == "n00"] == []
    assert ev.pair("m", "n00").abnormal_streak == 1  # type: ignore[union-attr]
    tick(3, thin=False)
    out = tick(4, thin=False)
    assert [(t.to_state, t.reason) for t in out.transitions if t.node_id == "n00"] == \
        [(H.UNHEALTHY, "relative_p50")]


def test_each_probe_round_is_judged_from_its_own_start() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(5))
    run(ev, 3, fleet(5, n00=(100.0, 6.0)), t0=T0 + 30)         # ejected at T0+90
    run(ev, 1, fleet(5, n00=(100.0, 6.0)), t0=T0 + 120)        # quarantined; round 1 starts now
    assert ev.judge_since("m", T0 + 120) == {("n00", "m"): T0 + 120}
    tick = run(ev, 1, fleet(5, n00=(100.0, 6.0)), t0=T0 + 150)[0]
    assert [t.reason for t in tick.transitions] == ["probe_failed"]
    # round 2 begins when its (doubled) back-off has passed, not when round 1 failed
    assert ev.judge_since("m", T0 + 150) == {("n00", "m"): T0 + 150 + 60}
    assert ev.judge_since("m", T0 + 240) == {("n00", "m"): T0 + 210}


def test_probe_round_uses_probe_samples_when_regular_ones_are_missing() -> None:
    ev = FleetEvaluator(S.replace(backoff_initial_s=0.0))
    run(ev, 1, fleet(5))
    run(ev, 4, fleet(5, n00=(100.0, 6.0)), t0=T0 + 30)
    assert states(ev)["n00"] is H.QUARANTINED
    base = [summ(f"n{i:02d}", 100.0) for i in range(1, 5)]
    tick = ev.evaluate("m", [*base, summ("n00", None, samples=0, probe_samples=10,
                                         probe_p50=100.0)], T0 + 150)
    assert tick.transitions == ()                                   # 10 < probe_min_samples
    tick = ev.evaluate("m", [*base, summ("n00", None, samples=0, probe_samples=30,
                                         probe_p50=500.0)], T0 + 180)
    assert [t.reason for t in tick.transitions] == ["probe_failed"]
    tick = ev.evaluate("m", [*base, summ("n00", None, samples=0, probe_samples=30,
                                         probe_p50=105.0)], T0 + 240)
    assert [t.reason for t in tick.transitions] == ["probe_passed"]


def test_failed_probe_rounds_retire() -> None:
    st = S.replace(backoff_initial_s=0.0, backoff_max_s=0.0, retire_after_failed_probes=2)
    ev = FleetEvaluator(st)
    run(ev, 1, fleet(5))
    ticks = run(ev, 8, fleet(5, n00=(100.0, 6.0)), t0=T0 + 30)
    reasons = [t.reason for tk in ticks for t in tk.transitions]
    assert reasons[-2:] == ["probe_failed", "too_many_probe_failures"]
    assert states(ev)["n00"] is H.RETIRED and "n00" not in ticks[-1].quarantine


def test_apply_diagnostics() -> None:
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(5))
    run(ev, 3, fleet(5, n00=(100.0, 6.0)), t0=T0 + 30)
    assert ev.apply_diagnostics("m", "n01", False, T0 + 100) == []           # routed: untouched
    assert ev.apply_diagnostics("m", "zz", False, T0 + 100) == []
    assert ev.apply_diagnostics("nope", "n00", False, T0 + 100) == []
    (t,) = ev.apply_diagnostics("m", "n00", False, T0 + 100)
    assert t.to_state is H.RETIRED and t.reason == "diagnostics_unrecoverable"


def test_snapshot_restore_gives_the_same_future() -> None:
    a = FleetEvaluator(S)
    run(a, 1, fleet(6))
    run(a, 2, fleet(6, n00=(100.0, 6.0)), t0=T0 + 30)
    b = FleetEvaluator(S)
    b.restore(a.snapshot())
    fa = run(a, 8, fleet(6, n00=(100.0, 6.0)), t0=T0 + 90)
    fb = run(b, 8, fleet(6, n00=(100.0, 6.0)), t0=T0 + 90)
    assert [t.transitions for t in fa] == [t.transitions for t in fb]
    assert a.snapshot() == b.snapshot()
    c = FleetEvaluator(S)
    c.restore_model("m", a.snapshot_model("m"))
    assert c.snapshot() == a.snapshot()
    with pytest.raises(ValueError, match="version"):
        c.restore({"version": 99})


def test_a_new_owner_from_a_stale_snapshot_repeats_changes_with_the_same_event_id() -> None:
    # Stage-2 handover: owner A published a tick's changes but its state write did not land;
    # owner B restores the snapshot before that tick and derives the same changes at its own
    # tick time. Consumers drop repeats by event_id, so each change keeps its id.
    slow = fleet(6, n00=(100.0, 6.0))
    a = FleetEvaluator(S)
    run(a, 1, fleet(6))
    seen: list[tuple[str, H, H]] = []
    for k in range(6):
        t = T0 + 30 * (k + 1)
        stale = a.snapshot_model("m")
        (ta,) = run(a, 1, slow, t0=t)
        b = FleetEvaluator(S)
        b.restore_model("m", stale)
        (tb,) = run(b, 1, slow, t0=t + 7.5)          # B ticks on its own clock
        change = [(x.node_id, x.from_state, x.to_state) for x in ta.transitions]
        assert change == [(x.node_id, x.from_state, x.to_state) for x in tb.transitions]
        assert [x.event_id for x in ta.transitions] == [x.event_id for x in tb.transitions]
        assert all(x.ts != y.ts for x, y in zip(ta.transitions, tb.transitions, strict=True))
        seen += change
    assert ("n00", H.HEALTHY, H.SUSPECT) in seen and ("n00", H.SUSPECT, H.UNHEALTHY) in seen


def test_models_are_independent() -> None:
    ev = FleetEvaluator(S)
    for k in range(5):
        ev.evaluate("llm", [summ(f"n{i}", 900.0 if (i == 0 and k) else 100.0, model="llm")
                            for i in range(4)], T0 + 30 * k)
        ev.evaluate("emb", [summ(f"n{i}", 5.0, model="emb") for i in range(4)], T0 + 30 * k)
    assert ev.models() == ["emb", "llm"]
    assert states(ev, "llm")["n0"] is H.QUARANTINED
    assert set(states(ev, "emb").values()) == {H.HEALTHY}


def test_relative_p99_catches_a_tail_far_above_the_peers_below_the_ratio_threshold() -> None:
    # a narrow signal (TPOT-like, healthy ratio 1.1): a node whose P99 is 2.5x its peers' is
    # abnormal although its ratio (2.75) stays below ratio_threshold (3.0)
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(6, ratio=1.1))
    ticks = run(ev, 3, fleet(6, ratio=1.1, n02=(100.0, 2.75)), t0=T0 + 30)
    trans = [t for tk in ticks for t in tk.transitions]
    assert [t.reason for t in trans] == ["relative_p99", "relative_p99"]
    assert "n02" not in ticks[-1].routing
    # …and 1.9x the peers' P99 is not
    ev = FleetEvaluator(S)
    ticks = run(ev, 5, fleet(6, ratio=1.1, n02=(100.0, 2.09)))
    assert all(len(t.routing) == 6 for t in ticks)


def test_a_new_signal_starts_a_new_baseline_without_a_fleet_event() -> None:
    ev = FleetEvaluator(S)
    for k in range(6):
        sig = "latency" if k < 3 else "normalized"
        p50 = 4e6 if k < 3 else 1.0
        tick = ev.evaluate("m", [WindowSummary(
            node_id=f"n{i}", model="m", tick_ts=0.0, signal=sig, samples=500, p50=p50, p99=p50 * 2,
            latency_p50_us=p50, latency_p99_us=p50 * 2, first_seen_ts=0.0) for i in range(5)],
                           T0 + 30 * k)
        assert tick.fleet_events == ()
    assert ev.snapshot_model("m")["baseline_signal"] == "normalized"


def test_routed_cutoffs_are_always_passed_and_only_unrouted_pairs_leave_the_fit() -> None:
    ev = FleetEvaluator(S)
    # the whole fleet first seen together: every warm-up cut-off is passed (the window store
    # keeps routed series in the fleet fit)
    ev.evaluate("m", [summ(f"n{i}", 100.0, first_seen=T0) for i in range(4)], T0)
    for k in range(1, 6):
        ev.evaluate("m", [summ(f"n{i}", 100.0, first_seen=T0) for i in range(4)], T0 + 30 * k)
    assert ev.judge_since("m", T0 + 150) == {(f"n{i}", "m"): T0 + 120 for i in range(4)}
    assert ev.out_of_fit("m") == set()
    # a cut-off the age bound already covers is dropped
    assert ev.judge_since("m", T0 + 120 + S.max_sample_age_s + 1) == {}


def test_readmitted_node_keeps_its_cutoff_among_warmup_cutoffs() -> None:
    ev = FleetEvaluator(DetectorSettings())                     # age bound 300 s: cut-offs last
    nodes = [f"n{i:02d}" for i in range(5)]
    # warm-up over; the window store has cut the windows at its end: admitted at once
    ev.evaluate("m", [summ(n, 100.0, first_seen=T0 - 130)._replace(extra={"judged_since": T0 - 10})
                      for n in nodes], T0)
    run(ev, 3, fleet(5, n00=(300.0, 2.0)), t0=T0 + 30)         # ejected at T0+90
    assert ev.out_of_fit("m") == {("n00", "m")}
    run(ev, 2, fleet(5), t0=T0 + 120)                           # re-admitted at T0+150
    assert ev.pair("m", "n00").routed                           # type: ignore[union-attr]
    assert ev.out_of_fit("m") == set()
    cut = ev.judge_since("m", T0 + 153)
    assert cut[("n00", "m")] == T0 + 120                        # the round that passed
    assert cut[("n01", "m")] == T0 - 10                         # warm-up cut-offs too


# ---- onset credit ---------------------------------------------------------------------------

def _onset(ev: FleetEvaluator, first: float, then: float, ticks: int = 3) -> list[ModelTick]:
    """Tick 0: n02 at ``first`` x its peers' P50; ticks 1..ticks-1: at ``then`` x."""
    run(ev, 1, fleet(6))
    return run(ev, ticks, lambda k: fleet(6, n02=(100.0 * (first if k == 0 else then), 2.0)),
               t0=T0 + 30)


@pytest.mark.parametrize(
    ("first", "out_at_tick", "why"),
    [
        (1.7, 2, "window at 0.85 of the limit, then two abnormal ones: out after the third window"),
        (1.55, None, "0.78 of the limit is no onset: three abnormal windows are still needed"),
        (1.0, None, "a normal window earns no credit"),
    ])
def test_onset_credit_counts_an_elevated_window_before_an_abnormal_streak(
        first: float, out_at_tick: int | None, why: str) -> None:
    ticks = _onset(FleetEvaluator(S), first, 2.5)
    out = [k for k, t in enumerate(ticks) if "n02" not in t.routing]
    assert (out[0] if out else None) == out_at_tick, why
    if out_at_tick is not None:
        (suspect,) = [t for t in ticks[1].transitions if t.to_state is H.SUSPECT]
        assert suspect.reason == Reason.RELATIVE_P50
        assert suspect.detail is not None and "previous window counts too" in suspect.detail


def test_onset_credit_needs_abnormal_windows_and_a_long_enough_confirmation() -> None:
    # a node steadily at 1.8x its peers (elevated, never abnormal) is never even suspect
    ticks = _onset(FleetEvaluator(S), 1.8, 1.8, ticks=10)
    assert all(not t.transitions for t in ticks)
    # with confirm_windows=2 no credit is given: two abnormal windows still needed
    st = S.replace(confirm_windows=2)
    ev = FleetEvaluator(st)
    run(ev, 1, fleet(6))
    ticks = [ev.evaluate("m", [summ(n, p, r) for n, (p, r) in
                               fleet(6, n02=(100.0 * (1.7 if k == 0 else 2.5), 2.0)).items()],
                         T0 + 30 * (k + 1)) for k in range(3)]
    assert ["n02" in t.routing for t in ticks] == [True, True, False]
    # a credited onset survives snapshot → restore between the two ticks
    ev = FleetEvaluator(S)
    run(ev, 1, fleet(6))
    run(ev, 1, fleet(6, n02=(170.0, 2.0)), t0=T0 + 30)
    ev2 = FleetEvaluator(S)
    ev2.restore(ev.snapshot())
    assert ev2.snapshot() == ev.snapshot()
    ticks = run(ev2, 2, fleet(6, n02=(250.0, 2.0)), t0=T0 + 60)
    assert "n02" not in ticks[-1].routing


# ---- fresh P50 (the samples since the previous tick) -----------------------------------------

FreshFleet = Mapping[str, tuple[float, float | None]]      # node -> (window P50, fresh P50)


def run_fresh(ev: FleetEvaluator, ticks: int, spec: Callable[[int], FreshFleet], *,
              t0: float = T0 + 30, fresh_samples: int = 300) -> list[ModelTick]:
    out = []
    for k in range(ticks):
        sums = [summ(n, p50)._replace(fresh_p50=fresh, fresh_samples=fresh_samples if fresh else 0)
                for n, (p50, fresh) in spec(k).items()]
        out.append(ev.evaluate("m", sums, t0 + k * S.tick_interval_s))
    return out


def _steady(n: int = 6, **over: tuple[float, float | None]) -> dict[str, tuple[float, float | None]]:
    f: dict[str, tuple[float, float | None]] = {f"n{i:02d}": (100.0, 100.0) for i in range(n)}
    f.update(over)
    return f


def test_fresh_p50_earns_onset_credit_and_is_a_p50_verdict() -> None:
    # A slowed node whose window still holds older samples: window 1.3x, 1.9x, 2.3x its peers
    # while the P50 of its samples since the previous tick is already 1.7x, 2.5x, 2.6x. The
    # window alone gives an elevated window (1.9x) and one abnormal one: still routed. The
    # fresh P50 earns the credit at the first tick and is abnormal at the second.
    steps = [(130.0, 170.0), (190.0, 250.0), (230.0, 260.0)]
    ev = FleetEvaluator(S)
    run_fresh(ev, 1, lambda k: _steady())
    ticks = run_fresh(ev, 3, lambda k: _steady(n02=steps[k]), t0=T0 + 60)
    assert ["n02" in t.routing for t in ticks] == [True, True, False]
    (suspect,) = ticks[1].transitions
    assert (suspect.to_state, suspect.reason) == (H.SUSPECT, str(Reason.RELATIVE_P50))
    assert suspect.detail is not None
    assert "p50 of the last 30 s 250.0 (300 samples) > 2 x peers' 100.0" in suspect.detail
    assert "previous window counts too" in suspect.detail
    # The event carries the numbers that decided: the fresh P50 and its reference.
    event = suspect.to_event()
    assert (event["signal_fresh_p50"], event["peers_fresh_p50"]) == (250.0, 100.0)
    assert event["signal_p50"] == 190.0 and event["peers_p50"] == 100.0
    # the same windows without fresh P50s: not out after three ticks
    ev = FleetEvaluator(S)
    run_fresh(ev, 1, lambda k: _steady())
    ticks = run_fresh(ev, 3, lambda k: _steady(n02=(steps[k][0], None)), t0=T0 + 60)
    assert all("n02" in t.routing for t in ticks)
    events = [t.to_event() for tk in ticks for t in tk.transitions]
    assert events and all(e["signal_fresh_p50"] is None and e["peers_fresh_p50"] is None
                          for e in events)


def test_fresh_p50_is_judged_against_the_peers_fresh_p50s() -> None:
    # every node's newest samples are 2.5x its window (the whole fleet slowed at once):
    # against the peers' fresh P50s nobody stands out — no verdict, no load event
    ev = FleetEvaluator(S)
    run_fresh(ev, 1, lambda k: _steady())
    ticks = run_fresh(ev, 4, lambda k: {f"n{i:02d}": (100.0, 250.0) for i in range(6)}, t0=T0 + 60)
    assert all(not t.transitions and not t.fleet_events for t in ticks)
    # one node 2.5x its peers' fresh P50s (all fresh P50s 1.2x the windows): abnormal
    ticks = run_fresh(ev, 3, lambda k: {**{f"n{i:02d}": (100.0, 120.0) for i in range(6)},
                                        "n04": (100.0, 300.0)}, t0=T0 + 180)
    assert "n04" not in ticks[-1].routing
    assert all(t.reason == str(Reason.RELATIVE_P50) for tk in ticks for t in tk.transitions[:2])


def test_fresh_p50_needs_min_peers_with_one() -> None:
    # only two nodes (below min_peers=3) have enough fresh samples for a fresh P50
    ev = FleetEvaluator(S)
    run_fresh(ev, 1, lambda k: _steady())

    def spec(k: int) -> FreshFleet:
        return {**{f"n{i:02d}": (100.0, None) for i in range(6)}, "n00": (100.0, 100.0),
                "n01": (100.0, 400.0)}

    ticks = run_fresh(ev, 5, spec, t0=T0 + 60)
    assert all(not t.transitions for t in ticks)


def test_one_fresh_excursion_does_not_eject() -> None:
    # a burst of slow requests lifts one tick's fresh P50 (2.5x), then it is normal again:
    # suspect, then healthy; never out (confirmation still needs consecutive windows)
    ev = FleetEvaluator(S)
    run_fresh(ev, 1, lambda k: _steady())
    ticks = run_fresh(ev, 12, lambda k: _steady(n03=(100.0, 250.0 if k % 3 == 0 else 100.0)),
                      t0=T0 + 60)
    assert all("n03" in t.routing for t in ticks)
    kinds = {(t.from_state, t.to_state) for tk in ticks for t in tk.transitions}
    assert kinds == {(H.HEALTHY, H.SUSPECT), (H.SUSPECT, H.HEALTHY)}


# ---- noisy tails: support, new evidence, the peers' spread ----------------------------------

def test_tail_rules_need_a_p99_that_rests_on_five_samples() -> None:
    # 499 samples: the P99 rests on fewer than 5 slower samples; the tail is not judged (nor the
    # tail against peers' P99), the P50 rule still is
    for bad, samples, out in [((100.0, 6.0), 499, False), ((100.0, 6.0), 500, True),
                              ((300.0, 2.0), 499, True), ((100.0, 4.5), 499, False)]:
        ev = FleetEvaluator(S)
        run(ev, 1, fleet(6), samples=samples)
        ticks = run(ev, 3, fleet(6, n00=bad), t0=T0 + 30, samples=samples)
        assert ("n00" not in ticks[-1].routing) is out, (bad, samples)
    # a window_size below 500 caps the requirement: a full window is judged
    st = S.replace(window_size=200)
    ev = FleetEvaluator(st)
    run(ev, 1, fleet(6), samples=200)
    ticks = run(ev, 3, fleet(6, n00=(100.0, 6.0)), t0=T0 + 30, samples=200)
    assert "n00" not in ticks[-1].routing


@pytest.mark.parametrize(("bad", "out_after_s"), [
    ((100.0, 6.0), 300.0),    # tail: windows 150 s apart (half of a 300-s window is new)
    ((300.0, 2.0), 60.0),     # P50: its median moves with most of the window; every tick counts
])
def test_tail_verdict_on_an_overlapping_window_holds_the_streak(
        bad: tuple[float, float], out_after_s: float) -> None:
    # full 1000-sample windows under a 300-s age bound with no rate measured: a window spans
    # up to 300 s, so the next 30-s tick shares 90 % of it — its few slowest samples too
    st = DetectorSettings()
    ev = FleetEvaluator(st)
    run(ev, 1, fleet(6), samples=1000)
    ticks = run(ev, 12, fleet(6, n00=bad), t0=T0 + 30, samples=1000)
    out = [T0 + 30 + 30 * k for k, t in enumerate(ticks) if "n00" not in t.routing]
    assert out and out[0] - (T0 + 30) == out_after_s
    suspect = [t for k in ticks for t in k.transitions if t.to_state is H.SUSPECT]
    assert len(suspect) == 1                       # held windows neither reset nor re-open it
    # the same with a measured rate of 20/s (a window not full: 600 samples since a 30-s
    # cut-off): a full window then spans 50 s, each 30-s tick is 60 % new, every tick counts
    ev = FleetEvaluator(st)
    ev.evaluate("m", [summ(n, 100.0, 2.0, 1000, first_seen=0.0) for n in fleet(6)], T0)
    first = [summ(n, p, r, 600)._replace(extra={"judged_since": T0}) for n, (p, r)
             in fleet(6, n00=(100.0, 6.0)).items()]
    ev.evaluate("m", first, T0 + 30)
    ticks = run(ev, 2, fleet(6, n00=(100.0, 6.0)), t0=T0 + 60, samples=1000)
    assert "n00" not in ticks[-1].routing


def test_held_streak_survives_snapshot_and_restore() -> None:
    st = DetectorSettings()
    ev = FleetEvaluator(st)
    run(ev, 1, fleet(6), samples=1000)
    run(ev, 3, fleet(6, n00=(100.0, 6.0)), t0=T0 + 30, samples=1000)
    ev2 = FleetEvaluator(st)
    ev2.restore(ev.snapshot())
    a = run(ev, 8, fleet(6, n00=(100.0, 6.0)), t0=T0 + 120, samples=1000)
    b = run(ev2, 8, fleet(6, n00=(100.0, 6.0)), t0=T0 + 120, samples=1000)
    assert [t.routing for t in a] == [t.routing for t in b]
    assert "n00" not in a[-1].routing


def test_tail_limit_follows_the_peers_spread() -> None:
    # 40 peers whose ratios spread widely (log SD ~0.25 around 8): a node at 1.8x the median
    # ratio is inside their noise; with a tight spread the same node stands out
    rng = [8.0 * math.exp(0.25 * z) for z in np.random.default_rng(1).standard_normal(39)]
    wide = {f"n{i:02d}": (100.0, r) for i, r in enumerate(rng, start=1)}
    tight = {f"n{i:02d}": (100.0, 8.0 * (1 + 0.01 * (i % 3))) for i in range(1, 40)}
    bad = (100.0, 1.8 * median([r for _, r in wide.values()]))
    for peers, out in [(wide, False), (tight, True)]:
        ev = FleetEvaluator(S)
        run(ev, 1, {**peers, "n00": (100.0, 8.0)})
        ticks = run(ev, 3, {**peers, "n00": bad}, t0=T0 + 30)
        assert ("n00" not in ticks[-1].routing) is out


def _shifted(n03: tuple[float, float, float], fleet_ratio: float) -> list[WindowSummary]:
    """Eight nodes at P50 100, P99 100 x ``fleet_ratio`` and fresh P50 100; n03's three
    statistics scaled by ``n03`` (P50, P99, fresh P50 factors)."""
    out = []
    for i in range(8):
        k50, k99, kf = n03 if i == 3 else (1.0, 1.0, 1.0)
        p50, p99 = 100.0 * k50, 100.0 * fleet_ratio * k99
        out.append(WindowSummary(node_id=f"n{i:02d}", model="m", tick_ts=0.0, signal="latency",
                                 samples=1000, p50=p50, p99=p99, latency_p50_us=p50,
                                 latency_p99_us=p99, first_seen_ts=0.0, fresh_samples=600,
                                 fresh_p50=100.0 * kf))
    return out


@pytest.mark.parametrize(("n03", "fleet_ratio", "shift_factor", "out"), [
    # heavy-tailed model (raw LLM latency): 1.6x P50, 1.8x P99, 1.7x fresh: all > 1.5x
    ((1.6, 1.8, 1.7), 8.0, 1.5, True),
    # the same node on a model of similar-size requests: the original rules only (< 2x)
    ((1.6, 1.8, 1.7), 2.0, 1.5, False),
    # one of the three statistics within 1.5x: no shift
    ((1.6, 1.4, 1.7), 8.0, 1.5, False),
    ((1.6, 1.8, 1.4), 8.0, 1.5, False),
    # the rule switched off
    ((1.6, 1.8, 1.7), 8.0, 0.0, False),
])
def test_shift_on_a_heavy_tailed_model(n03: tuple[float, float, float], fleet_ratio: float,
                                       shift_factor: float, out: bool) -> None:
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=30.0, shift_factor=shift_factor))
    ev.evaluate("m", _shifted((1.0, 1.0, 1.0), fleet_ratio), T0)
    ticks = [ev.evaluate("m", _shifted(n03, fleet_ratio), T0 + 30.0 * k) for k in (1, 2, 3)]
    assert ("n03" not in ticks[-1].routing) is out
    trans = [t for tk in ticks for t in tk.transitions]
    if out:
        assert [(t.from_state, t.to_state, t.reason) for t in trans[:2]] == [
            (H.HEALTHY, H.SUSPECT, "relative_p50"), (H.SUSPECT, H.UNHEALTHY, "relative_p50")]
        assert "heavy-tailed" in (trans[0].detail or "") and "1.5 x peers'" in (trans[0].detail or "")
    else:
        assert trans == []


@pytest.mark.parametrize(("settings", "flagged"), [
    ({}, True),
    ({"relative_p99_factor": 3.0}, False),        # 2.5x the peers' P99 is within 3x
    ({"relative_p50_factor": 3.0}, True),         # the P50 factor does not govern the P99 rule
])
def test_relative_p99_factor_governs_the_p99_rule_alone(settings: dict[str, float],
                                                         flagged: bool) -> None:
    ev = FleetEvaluator(S.replace(**settings))
    run(ev, 1, fleet(6, ratio=1.1))
    ticks = run(ev, 3, fleet(6, ratio=1.1, n02=(100.0, 2.75)), t0=T0 + 30)
    reasons = [t.reason for tk in ticks for t in tk.transitions]
    assert reasons == (["relative_p99", "relative_p99"] if flagged else [])
    if flagged:
        factor = settings.get("relative_p99_factor", 2.0)
        assert ticks[0].transitions[0].detail == f"p99 275.0 > {factor:g} x peers' 110.0"


def _with_failures(k: int, shares: Mapping[str, float], n: int = 6, per_tick: int = 600,
                   judged: Mapping[str, int] | None = None) -> list[WindowSummary]:
    """Tick ``k`` of ``n`` nodes that each take ``per_tick`` requests a tick; node ``x`` fails
    ``shares[x]`` of them (cumulative counters, as stage 1 sends them)."""
    out = []
    for i in range(n):
        node = f"n{i:02d}"
        failed_per_tick = round(shares.get(node, 0.0) * per_tick)
        s = summ(node, 100.0, samples=(judged or {}).get(node, 500))
        out.append(s._replace(requests_total=per_tick * k, failed_total=failed_per_tick * k))
    return out


def _error_run(shares: Mapping[str, float], ticks: int = 4, judged: Mapping[str, int] | None = None,
               **settings: float) -> list[ModelTick]:
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=30.0, **settings))  # type: ignore[arg-type]
    return [ev.evaluate("m", _with_failures(k, shares, judged=judged), T0 + 30.0 * k)
            for k in range(ticks)]


def _stall_run(per_tick: int, hung_from: int, back_at: int | None = None, ticks: int = 14,
               idle: tuple[str, ...] = ("n03",), dead: bool = False,
               **settings: float) -> list[ModelTick]:
    """6 nodes taking ``per_tick`` requests a tick; the ``idle`` ones complete none from tick
    ``hung_from`` (until ``back_at``) while their heartbeats go on (``dead``: they stop)."""
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=30.0, **settings))  # type: ignore[arg-type]
    done = dict.fromkeys((f"n{i:02d}" for i in range(6)), 0)
    out = []
    for k in range(ticks):
        sums = []
        for node in done:
            hung = node in idle and k >= hung_from and (back_at is None or k < back_at)
            done[node] += 0 if hung else per_tick
            # a hung node's window empties (age bound 30 s: one tick); its heartbeats go on
            sums.append(summ(node, None, samples=0) if hung and k > hung_from else summ(node, 100.0))
            seen = T0 + 30.0 * (hung_from - 1 if hung and dead else k) - 1.0
            sums[-1] = sums[-1]._replace(requests_total=done[node], last_seen_ts=seen)
        out.append(ev.evaluate("m", sums, T0 + 30.0 * k))
    return out


def test_a_hung_node_whose_heartbeats_go_on_leaves_as_stalled_and_stays_out_while_hung() -> None:
    ticks = _stall_run(per_tick=300, hung_from=3)
    trans = [(t.to_state, t.reason) for tk in ticks for t in tk.transitions if t.node_id == "n03"]
    assert trans[2:5] == [(H.SUSPECT, "stalled"), (H.UNHEALTHY, "stalled"),
                          (H.QUARANTINED, "quarantine")], trans
    out_at = next(i for i, tk in enumerate(ticks) if "n03" not in tk.routing)
    assert out_at == 3 + S.confirm_windows - 1
    assert all("n03" not in tk.routing for tk in ticks[out_at:])
    first = next(t for tk in ticks for t in tk.transitions if t.reason == "stalled")
    assert first.detail is not None and "no request completed in the last 30 s" in first.detail
    assert not [t for tk in ticks[1:] for t in tk.transitions if t.node_id != "n03"]


def test_a_stalled_node_that_serves_again_is_let_back_in() -> None:
    ticks = _stall_run(per_tick=300, hung_from=3, back_at=7, ticks=20)
    assert "n03" not in ticks[6].routing and "n03" in ticks[-1].routing


@pytest.mark.parametrize(("per_tick", "idle", "why"), [
    (10, ("n03",), "peers serve fewer than stall_peer_requests a tick"),
    (300, ("n00", "n01", "n02", "n03"), "most of the fleet idle: no reference"),
])
def test_idle_is_not_stalled_without_busy_peers(per_tick: int, idle: tuple[str, ...], why: str) -> None:
    ticks = _stall_run(per_tick=per_tick, hung_from=3, idle=idle)
    assert not [t for tk in ticks for t in tk.transitions if t.reason == "stalled"], why


def test_with_short_ticks_a_stall_needs_10_s_without_a_request() -> None:
    # 2-s ticks: an emitter's batch can miss a tick; 3 idle ticks (6 s) are no stall, and a
    # stall is judged over the last 10 s (5 ticks).
    st = DetectorSettings(tick_interval_s=2.0, max_sample_age_s=30.0, warmup_s=0.0)
    ev = FleetEvaluator(st)
    done = dict.fromkeys((f"n{i:02d}" for i in range(6)), 0)

    def tick(k: int, idle: bool) -> ModelTick:
        sums = []
        for node in done:
            done[node] += 0 if idle and node == "n03" else 60
            sums.append(summ(node, 100.0)._replace(requests_total=done[node],
                                                    last_seen_ts=T0 + 2.0 * k - 0.5))
        return ev.evaluate("m", sums, T0 + 2.0 * k)

    ticks = [tick(k, idle=3 <= k < 6) for k in range(12)]
    assert not [t for tk in ticks for t in tk.transitions if t.reason == "stalled"]
    later = [tick(k, idle=k >= 14) for k in range(12, 24)]
    stalled = [t for tk in later for t in tk.transitions if t.reason == "stalled"]
    assert stalled and stalled[0].ts == T0 + 2.0 * 18, stalled
    assert stalled[0].detail is not None and "in the last 10 s" in stalled[0].detail


def test_a_dead_node_is_not_stalled_it_goes_silent() -> None:
    ticks = _stall_run(per_tick=300, hung_from=3, dead=True)
    reasons = [t.reason for tk in ticks for t in tk.transitions if t.node_id == "n03"]
    assert "stalled" not in reasons and "silent" in reasons, reasons


def test_the_stall_rule_can_be_turned_off() -> None:
    ticks = _stall_run(per_tick=300, hung_from=3, stall_peer_requests=0)
    assert all("n03" in tk.routing for tk in ticks)


def test_a_node_failing_a_third_of_its_requests_leaves_by_error_rate() -> None:
    ticks = _error_run({"n03": 0.3, "n01": 0.01})
    assert "n03" not in ticks[3].routing and len(ticks[3].routing) == 5
    trans = [t for tk in ticks[1:] for t in tk.transitions if t.node_id == "n03"]
    assert [(t.to_state, t.reason) for t in trans][:2] == [(H.SUSPECT, "error_rate"),
                                                           (H.UNHEALTHY, "error_rate")]
    assert trans[0].detail == ("180 of 600 requests since the last tick failed "
                               "(30.0% > 10% and > 2 x peers' 0.0%)")
    assert not [t for t in ticks[0].transitions if t.reason == "error_rate"]  # no counts before


def test_a_node_that_only_fails_leaves_though_it_has_no_latency_to_judge() -> None:
    ticks = _error_run({"n03": 1.0}, judged={"n03": 0})
    assert "n03" not in ticks[3].routing


@pytest.mark.parametrize(("shares", "settings"), [
    ({"n03": 0.08}, {}),                                  # below max_error_share
    ({"n03": 0.3}, {"max_error_share": 0.0}),             # the rule off
    ({"n03": 0.3}, {"max_error_share": 0.5}),             # a looser limit
    ({f"n{i:02d}": 0.12 for i in range(6)} | {"n03": 0.2}, {}),   # not 2x the peers' share
])
def test_error_share_within_the_limits_keeps_the_node(shares: dict[str, float],
                                                      settings: dict[str, float]) -> None:
    ticks = _error_run(shares, **settings)
    assert all(len(t.routing) == 6 for t in ticks)
    assert not [t for tk in ticks for t in tk.transitions if t.reason == "error_rate"]


@pytest.mark.parametrize(("settings", "leaves"), [
    ({}, True),                                    # 30% > 2 x the peers' 12%
    ({"error_share_peer_factor": 3.0}, False),     # not 3 x
    ({"relative_p50_factor": 3.0}, True),          # the P50 factor does not govern error shares
])
def test_error_share_peer_factor_governs_the_error_rule_alone(settings: dict[str, float],
                                                                leaves: bool) -> None:
    ticks = _error_run({f"n{i:02d}": 0.12 for i in range(6)} | {"n03": 0.3}, **settings)
    assert ("n03" not in ticks[3].routing) is leaves
    details = [t.detail for tk in ticks for t in tk.transitions if t.reason == "error_rate"]
    if leaves:
        factor = settings.get("error_share_peer_factor", 2.0)
        assert details[0] == ("180 of 600 requests since the last tick failed "
                              f"(30.0% > 10% and > {factor:g} x peers' 12.0%)")
    else:
        assert details == []


def test_at_a_low_rate_requests_are_pooled_over_ticks_until_min_samples_are_in() -> None:
    # 60 requests a tick (2 req/s) is below min_samples (100): the rule used to be off there.
    # Pooled over two ticks, a node failing 30 % still leaves, by error_rate.
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=300.0))
    ticks = [ev.evaluate("m", _with_failures(k, {"n03": 0.3}, per_tick=60), T0 + 30.0 * k)
             for k in range(8)]
    assert "n03" not in ticks[-1].routing and len(ticks[-1].routing) == 5
    trans = [t for tk in ticks for t in tk.transitions if t.node_id == "n03"]
    assert (H.UNHEALTHY, "error_rate") in [(t.to_state, t.reason) for t in trans]
    first = next(t for t in trans if t.reason == "error_rate")
    assert first.detail is not None
    assert first.detail.startswith("36 of 120 requests since the last 2 ticks failed (30.0%")
    # healthy nodes at the same rate are left alone
    assert not [t for tk in ticks for t in tk.transitions if t.reason == "error_rate"
                and t.node_id != "n03"]


def test_pooling_reaches_back_no_further_than_max_sample_age_s() -> None:
    # 10 requests a tick: 100 need 10 ticks, max_sample_age_s keeps 5: never judged
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=150.0))
    ticks = [ev.evaluate("m", _with_failures(k, {"n03": 0.5}, per_tick=10), T0 + 30.0 * k)
             for k in range(14)]
    assert not [t for tk in ticks for t in tk.transitions if t.reason == "error_rate"]


def test_a_node_still_failing_on_probe_traffic_is_not_let_back_in() -> None:
    # Out for failing 30 %; quarantined it gets only probes (30 a tick, below min_samples)
    # and still fails 30 % of them: every probe round fails, by error_rate.
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=300.0, backoff_initial_s=60.0))
    counts = {f"n{i:02d}": (0, 0) for i in range(6)}
    trans = []
    for k in range(40):
        per_tick = {node: 30 if node == "n03" and k >= 4 else 600 for node in counts}
        sums = []
        for node, (req, fail) in counts.items():
            req += per_tick[node]
            fail += round((0.3 if node == "n03" else 0.0) * per_tick[node])
            counts[node] = (req, fail)
            s = _with_failures(1, {}, per_tick=0)[int(node[1:])]
            sums.append(s._replace(requests_total=req, failed_total=fail))
        trans += [(t.to_state, t.reason) for t in ev.evaluate("m", sums, T0 + 30.0 * k).transitions
                  if t.node_id == "n03"]
    assert (H.QUARANTINED, "probe_failed") in trans
    assert (H.HEALTHY, "probe_passed") not in trans


def _recovery_on_probe_traffic(ev: FleetEvaluator) -> list[tuple[H, str, float]]:
    """n03 fails 30 % of 600 requests a tick until it is out, then recovers (0 failures) and
    gets 30 probe requests a tick: its (state, reason, ts) transitions."""
    counts = {f"n{i:02d}": (0, 0) for i in range(6)}
    trans: list[tuple[H, str, float]] = []
    out_at = None
    for k in range(40):
        now = T0 + 30.0 * k
        sums = []
        for node, (req, fail) in counts.items():
            n = 30 if node == "n03" and out_at is not None else 600
            req += n
            fail += round(0.3 * n) if node == "n03" and out_at is None else 0
            counts[node] = (req, fail)
            s = _with_failures(1, {}, per_tick=0)[int(node[1:])]
            sums.append(s._replace(requests_total=req, failed_total=fail))
        for t in ev.evaluate("m", sums, now).transitions:
            if t.node_id == "n03":
                trans.append((t.to_state, t.reason, t.ts))
                if t.to_state is H.UNHEALTHY and out_at is None:
                    out_at = now
    return trans


def test_a_recovered_node_on_probe_traffic_is_not_held_by_its_failures_before_ejection() -> None:
    # Probe rounds are judged on requests since the round began: pooling 30 probes a tick up
    # to min_samples must not reach back to the failures that got the node ejected.
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=300.0, backoff_initial_s=60.0))
    trans = _recovery_on_probe_traffic(ev)
    states = [(st, reason) for st, reason, _ in trans]
    assert (H.UNHEALTHY, "error_rate") in states
    assert (H.HEALTHY, "probe_passed") in states
    assert (H.QUARANTINED, "probe_failed") not in states, trans


def test_stored_error_counters_of_the_older_form_still_restore() -> None:
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=300.0))
    for k in range(3):
        ev.evaluate("m", _with_failures(k, {}, per_tick=60), T0 + 30.0 * k)
    snap = ev.snapshot_model("m")
    assert [len(v) for v in snap["counts"].values()] == [6] * 6      # three ticks kept
    old = dict(snap, counts={n: v[-2:] for n, v in snap["counts"].items()})
    again = FleetEvaluator(DetectorSettings(max_sample_age_s=300.0))
    again.restore_model("m", old)
    assert again.snapshot_model("m")["counts"] == old["counts"]
    with pytest.raises(ValueError, match="malformed"):
        FleetEvaluator(DetectorSettings()).restore_model("m", dict(snap, counts={"n00": [1, 2, 3]}))


def test_a_fleet_failing_at_once_ejects_nobody_and_is_reported() -> None:
    # A bad deploy or a broken upstream: every node fails about as often. Not a node fault,
    # but an operator must hear of it: one error_storm fleet event, then its end.
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=30.0))
    storm = {f"n{i:02d}": 0.3 + 0.1 * (i == 3) for i in range(6)}
    ticks = [ev.evaluate("m", _with_failures(k, storm), T0 + 30.0 * k) for k in range(4)]
    # then the failures stop: the counters grow by requests only
    calm = [[s._replace(failed_total=ticks_s.failed_total) for s, ticks_s in
             zip(_with_failures(k, {}), _with_failures(3, storm), strict=True)] for k in (4, 5)]
    ticks += [ev.evaluate("m", sums, T0 + 30.0 * k) for k, sums in zip((4, 5), calm, strict=True)]
    assert all(len(t.routing) == 6 for t in ticks)
    assert not [t for tk in ticks for t in tk.transitions if t.reason == "error_rate"]
    kinds = [(round(e.ts - T0), e.kind, e.abnormal_nodes, e.judged_nodes)
             for t in ticks for e in t.fleet_events]
    assert kinds == [(30, "error_storm", 6, 6), (120, "error_storm_end", 0, 6)]
    first = next(e for t in ticks for e in t.fleet_events)
    assert first.detail == ("6 of 6 nodes failed more than 10% of their requests since the "
                            "last tick (median share 30.0%): nobody is ejected for it")


def test_error_counters_that_go_back_give_no_verdict() -> None:
    # A new stage 1 (restart) starts its counters at zero: no share that tick, no false verdict.
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=30.0))
    ev.evaluate("m", _with_failures(5, {"n03": 0.3}), T0)
    tick = ev.evaluate("m", _with_failures(1, {"n03": 0.3}), T0 + 30.0)
    assert not [t for t in tick.transitions if t.reason == "error_rate"]
    tick = ev.evaluate("m", _with_failures(2, {"n03": 0.3}), T0 + 60.0)
    assert [t.reason for t in tick.transitions] == ["error_rate"]
