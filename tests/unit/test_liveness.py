"""Stage 2 on a changing fleet (tailguard.core.judge.liveness through FleetEvaluator): gone, returned,
restarted, telemetry lost, forgotten, bounded state, tiny models judged by their own history,
and peers from workers that chose different signals."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState as H
from tailguard.core.contract.types import ModelTick, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator

S = DetectorSettings(max_sample_age_s=30.0)   # consecutive windows share no sample
T0 = 1000.0
TICK = S.tick_interval_s


def summ(node: str, p50: float = 100.0, *, seen: float, ratio: float = 2.0, samples: int = 500,
         instance_ts: float | None = None, resumed_ts: float | None = None) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=0.0, signal="latency", samples=samples,
                         p50=p50, p99=p50 * ratio, latency_p50_us=p50, latency_p99_us=p50 * ratio,
                         first_seen_ts=0.0, last_seen_ts=seen, instance_ts=instance_ts,
                         resumed_ts=resumed_ts)


def tick(ev: FleetEvaluator, k: int, nodes: Mapping[str, float], *, stop_at: Mapping[str, float] = {},
         **extra: Mapping[str, float]) -> ModelTick:
    """Tick ``k``: each node reports at the tick with P50 ``nodes[n]``, unless it stopped at
    ``stop_at[n]`` (its summaries then keep that last-seen time, as stage 1's do)."""
    now = T0 + k * TICK
    sums = [summ(n, p50, seen=min(now, stop_at.get(n, now)),
                 **{key: v[n] for key, v in extra.items() if n in v})  # type: ignore[arg-type]
            for n, p50 in nodes.items()]
    return ev.evaluate("m", sums, now)


def states(ev: FleetEvaluator) -> dict[str, H]:
    return {n: H(p["state"]) for n, p in ev.snapshot_model("m")["pairs"].items()}


def reasons(ticks: Iterable[ModelTick]) -> list[tuple[str, str, str]]:
    return [(t.node_id, str(t.to_state), t.reason) for mt in ticks for t in mt.transitions]


def fleet(n: int, p50: float = 100.0) -> dict[str, float]:
    return {f"n{i}": p50 for i in range(n)}


def test_a_node_silent_for_silent_after_s_is_gone_within_one_tick_and_no_ejection() -> None:
    ev = FleetEvaluator(S)
    stop = {"n4": T0 + 2 * TICK, "n5": T0 + 2 * TICK}
    out = [tick(ev, k, fleet(6), stop_at=stop) for k in range(12)]
    gone_at = {t.node_id: t.ts for mt in out for t in mt.transitions if t.reason == "silent"}
    assert set(gone_at) == {"n4", "n5"}
    for node, ts in gone_at.items():
        assert S.silent_after_s < ts - stop[node] <= S.silent_after_s + TICK
    assert out[-1].routing == frozenset({"n0", "n1", "n2", "n3"})
    assert "n4" not in out[-1].quarantine and not any(mt.diagnostics for mt in out)
    assert states(ev)["n4"] is H.GONE


def test_gone_nodes_count_in_no_guard_so_a_survivor_can_still_be_ejected() -> None:
    # 6 nodes, 3 scaled away; 2 of the 6 count as out only if gone ones did (cap 3 of 6 live).
    ev = FleetEvaluator(S)
    stop = {f"n{i}": T0 for i in (3, 4, 5)}
    for k in range(8):
        tick(ev, k, fleet(6), stop_at=stop)
    slow = {**fleet(6), "n0": 300.0}
    out = [tick(ev, k, slow, stop_at=stop) for k in range(8, 14)]
    assert ("n0", "unhealthy", "relative_p50") in reasons(out)
    assert out[-1].routing == frozenset({"n1", "n2"})


def test_the_cap_is_a_share_of_live_nodes() -> None:
    # 8 live of 16 known, max_ejected_fraction 0.25: cap floor(0.25 x 8) = 2 (not 4, and gone
    # nodes do not fill it); three slow survivors: the two worst leave, the third is kept in.
    st = DetectorSettings(max_sample_age_s=30.0, max_ejected_fraction=0.25)
    ev = FleetEvaluator(st)
    stop = {f"n{i}": T0 for i in range(8, 16)}
    for k in range(8):
        tick(ev, k, fleet(16), stop_at=stop)
    assert sum(1 for s in states(ev).values() if s is H.GONE) == 8
    slow = {**fleet(16), "n0": 400.0, "n1": 350.0, "n2": 300.0}
    for k in range(8, 16):
        mt = tick(ev, k, slow, stop_at=stop)
    assert mt.routing == frozenset({f"n{i}" for i in range(2, 8)})
    assert states(ev)["n2"] is H.UNHEALTHY


def test_a_gone_node_that_reports_again_warms_up_routed_and_a_quarantined_one_is_probed() -> None:
    ev = FleetEvaluator(S)
    stop = {"n5": T0 + TICK}
    for k in range(10):
        tick(ev, k, fleet(6), stop_at=stop)
    assert states(ev)["n5"] is H.GONE
    mt = tick(ev, 10, fleet(6))                      # n5 reports again
    assert ("n5", "warming", "returned") in reasons([mt]) and "n5" in mt.routing
    # A node taken out, then silent, comes back quarantined: silence never re-admits.
    ev2 = FleetEvaluator(S)
    for k in range(6):
        tick(ev2, k, fleet(6))
    slow = {**fleet(6), "n0": 400.0}
    k = 6
    while states(ev2)["n0"] not in (H.UNHEALTHY, H.QUARANTINED) or "n0" in tick(ev2, k, slow).routing:
        k += 1
        tick(ev2, k, slow)
        assert k < 20
    quiet = {"n0": T0 + k * TICK}
    for j in range(k + 1, k + 8):
        tick(ev2, j, slow, stop_at=quiet)
    assert states(ev2)["n0"] is H.GONE
    mt = tick(ev2, k + 8, slow)
    assert ("n0", "quarantined", "returned") in reasons([mt]) and "n0" not in mt.routing


def test_most_nodes_silent_at_once_is_telemetry_loss_routing_unchanged() -> None:
    ev = FleetEvaluator(S)
    stop = {n: T0 + 3 * TICK for n in fleet(6)}
    out = [tick(ev, k, fleet(6), stop_at=stop) for k in range(12)]
    kinds = [e.kind for mt in out for e in mt.fleet_events]
    assert kinds == ["telemetry_lost"]
    assert out[-1].routing == frozenset(fleet(6)) and "silent" not in {r for _, _, r in reasons(out)}
    back = tick(ev, 12, fleet(6))
    assert [e.kind for e in back.fleet_events] == ["telemetry_restored"]
    assert not any(t.reason == "restarted" for t in back.transitions)


def _changes(ticks: Iterable[ModelTick]) -> list[tuple[str, str, str]]:
    """The transitions after the fleet's own entry (first_seen, admitted)."""
    return [r for r in reasons(ticks) if r[2] not in ("first_seen", "admitted")]


def test_a_fleet_that_stops_together_is_telemetry_loss_whichever_side_of_a_tick_it_stops() -> None:
    # Three nodes' last events fall just before the tick that finds them silent for
    # silent_after_s, the other three's a second later: one outage, nobody gone.
    ev = FleetEvaluator(S)
    cut = T0 + 3 * TICK
    stop = {n: cut + (-0.5 if i < 3 else 0.5) for i, n in enumerate(fleet(6))}
    out = [tick(ev, k, fleet(6), stop_at=stop) for k in range(12)]
    assert [e.kind for mt in out for e in mt.fleet_events] == ["telemetry_lost"]
    assert not _changes(out)
    assert out[-1].routing == frozenset(fleet(6))


def test_after_a_telemetry_loss_nodes_that_resume_a_tick_late_are_neither_gone_nor_restarted() -> None:
    ev = FleetEvaluator(S)
    stop = {n: T0 + 3 * TICK for n in fleet(6)}
    out = [tick(ev, k, fleet(6), stop_at=stop) for k in range(12)]
    early = {"n0", "n1", "n2"}
    now = T0 + 12 * TICK
    out.append(tick(ev, 12, fleet(6), stop_at={n: t for n, t in stop.items() if n not in early},
                    resumed_ts={n: now - 5.0 for n in early}))
    late = set(fleet(6)) - early
    out.append(tick(ev, 13, fleet(6), resumed_ts={n: now + TICK - 5.0 for n in late}))
    assert [e.kind for mt in out for e in mt.fleet_events] == ["telemetry_lost", "telemetry_restored"]
    assert not _changes(out)                     # no one gone, returned or restarted
    assert out[-1].routing == frozenset(fleet(6))


def test_one_death_beside_a_live_fleet_is_no_telemetry_loss() -> None:
    # The control: the rest keep reporting, so the dead node goes as soon as it is silent.
    ev = FleetEvaluator(S)
    out = [tick(ev, k, fleet(6), stop_at={"n0": T0 + 3 * TICK}) for k in range(9)]
    assert ("n0", "gone", "silent") in reasons(out) and not [e for mt in out for e in mt.fleet_events]


def test_one_node_model_never_loses_its_only_node_to_silence() -> None:
    ev = FleetEvaluator(S)
    out = [tick(ev, k, {"solo": 100.0}, stop_at={"solo": T0}) for k in range(12)]
    assert all(mt.routing == frozenset({"solo"}) for mt in out)


def test_a_new_instance_or_a_resumed_gap_restarts_warm_up_and_a_shared_gap_does_not() -> None:
    ev = FleetEvaluator(S)
    for k in range(6):
        tick(ev, k, fleet(6))
    t_inst = T0 + 5.5 * TICK
    mt = tick(ev, 6, fleet(6), instance_ts={"n1": t_inst}, resumed_ts={"n2": t_inst})
    got = {(n, s, r) for n, s, r in reasons([mt])}
    assert got == {("n1", "warming", "restarted"), ("n2", "warming", "restarted")}
    assert ev.judge_since("m", t_inst + S.warmup_s)[("n1", "m")] == t_inst + S.warmup_s
    # The same restart is not acted on twice.
    assert not tick(ev, 7, fleet(6), instance_ts={"n1": t_inst}).transitions
    # Most nodes resuming after a gap in one tick: the pipeline's gap, nobody restarts.
    shared = {n: T0 + 7.5 * TICK for n in fleet(6)}
    assert not [t for t in tick(ev, 8, fleet(6), resumed_ts=shared).transitions if t.reason == "restarted"]


def test_a_node_that_keeps_restarting_slow_is_judged_after_its_third_restart() -> None:
    # n1 restarts (a new instance) every 4 ticks and is 3x slower: each restart used to put
    # it back to warming, routed and never judged, for as long as the crashloop lasted.
    ev = FleetEvaluator(S)
    for k in range(6):
        tick(ev, k, fleet(6))
    slow = fleet(6) | {"n1": 300.0}
    out = []
    for k in range(6, 40):
        restart = T0 + (k - 0.5) * TICK if k % 4 == 2 else None
        out.append(tick(ev, k, slow, instance_ts={"n1": restart} if restart else {}))
    n1 = [(s, r) for n, s, r in reasons(out) if n == "n1"]
    assert n1.count(("warming", "restarted")) == 3        # the first three warm up
    assert ("unhealthy", "relative_p50") in n1 and "n1" not in out[-1].routing
    crash = [t for mt in out for t in mt.transitions if t.reason == "restarted"][-1]
    assert "further restarts are judged" in (crash.detail or "")


def test_restarts_further_apart_each_warm_up() -> None:
    # the control: a restart every 12 ticks (360 s) is three within 900 s at most
    ev = FleetEvaluator(S)
    out = [tick(ev, k, fleet(6), instance_ts={"n1": T0 + (k - 0.5) * TICK} if k % 12 == 6 else {})
           for k in range(80)]
    assert [r for n, _, r in reasons(out) if n == "n1"].count("restarted") == 7   # k = 6, 18, … 78


def test_warm_up_after_a_restart_is_never_held_against_the_node() -> None:
    ev = FleetEvaluator(S)
    for k in range(6):
        tick(ev, k, fleet(6))
    t_back = T0 + 6 * TICK
    for k in range(6, 12):           # 6x slower while warming, back to normal after
        p50 = 600.0 if k < 10 else 100.0
        mt = tick(ev, k, {**fleet(6), "n3": p50}, instance_ts={"n3": t_back})
        assert "n3" in mt.routing
    assert states(ev)["n3"] in (H.WARMING, H.HEALTHY)


def test_gone_pairs_are_forgotten_and_state_stays_bounded_with_10000_ids_churned() -> None:
    st = DetectorSettings(max_sample_age_s=30.0, forget_after_s=300.0)
    ev = FleetEvaluator(st)
    core = fleet(4)
    sizes = []
    for k in range(250):                  # 40 short-lived ids per tick: 10,000 in all
        now = T0 + k * TICK
        born = {f"e{k}-{i}": 100.0 for i in range(40)}
        sums = [summ(n, p, seen=now) for n, p in {**core, **born}.items()]
        # ids born earlier keep their last-seen time (stage 1 forgot them or still holds them)
        sums += [summ(f"e{j}-{i}", 100.0, seen=T0 + j * TICK) for j in range(max(0, k - 3), k)
                 for i in range(40)]
        ev.evaluate("m", sums, now)
        sizes.append(len(json.dumps(ev.snapshot_model("m"))))
    pairs = ev.snapshot_model("m")["pairs"]
    horizon_ticks = (st.silent_after_s + st.forget_after_s) / TICK + 2
    assert len(pairs) <= 4 + 40 * horizon_ticks
    assert max(sizes[150:]) <= 1.2 * max(sizes[100:150])   # flat once the first ids are forgotten
    assert max(sizes) < 1_000_000                           # one changelog value under Kafka's 1 MB


def test_two_node_model_one_slows_3x_it_leaves_both_slow_nobody_does() -> None:
    for both, expect_out in ((False, {"n0"}), (True, set())):
        ev = FleetEvaluator(S)
        for k in range(10):
            tick(ev, k, fleet(2))
        slow = {"n0": 300.0, "n1": 300.0 if both else 100.0}
        out = [tick(ev, k, slow) for k in range(10, 16)]
        taken = {t.node_id for mt in out for t in mt.transitions if not t.routed}
        assert taken == expect_out, (both, reasons(out))
        if expect_out:
            first = next(t for mt in out for t in mt.transitions if not t.routed)
            assert first.ts - (T0 + 10 * TICK) <= 180 and "own baseline" in (
                next(t for mt in out for t in mt.transitions if t.to_state is H.SUSPECT).detail or "")


def test_waiting_on_time_while_a_pair_may_still_fall_silent() -> None:
    ev = FleetEvaluator(S)
    for k in range(6):
        tick(ev, k, fleet(3))
    now = T0 + 5 * TICK
    assert ev.waiting_on_time(now + 10)
    st0 = DetectorSettings(max_sample_age_s=30.0, silent_after_s=0.0)
    ev0 = FleetEvaluator(st0)
    for k in range(6):
        ev0.evaluate("m", [summ(n, seen=T0 + k * TICK) for n in fleet(3)], T0 + k * TICK)
    assert not ev0.waiting_on_time(now + 10)


def test_while_telemetry_is_lost_time_still_matters_until_the_silent_can_be_forgotten() -> None:
    # A replay skips the ticks where nothing can change; silent nodes kept routed by a
    # telemetry loss still go at forget_after_s, so those ticks must not be skipped.
    ev = FleetEvaluator(S)
    stop = {n: T0 + 3 * TICK for n in fleet(6)}
    out = [tick(ev, k, fleet(6), stop_at=stop) for k in range(12)]
    assert [e.kind for mt in out for e in mt.fleet_events] == ["telemetry_lost"]
    assert ev.waiting_on_time(T0 + 3 * TICK + S.forget_after_s - 1.0)
    assert not ev.waiting_on_time(T0 + 3 * TICK + S.forget_after_s + 1.0)


def test_a_retired_node_back_as_a_new_instance_starts_over_its_old_process_does_not() -> None:
    ev = FleetEvaluator(S)
    for k in range(6):
        tick(ev, k, fleet(6))
    slow = {**fleet(6), "n0": 400.0}
    k = 6
    while "n0" in tick(ev, k, slow).routing:
        k += 1
        assert k < 20
    retired_at = T0 + k * TICK
    ev.apply_diagnostics("m", "n0", False, retired_at)
    assert states(ev)["n0"] is H.RETIRED
    # the old process still reports after a gap: retired it stays
    mt = tick(ev, k + 1, fleet(6), resumed_ts={"n0": retired_at + 10})
    assert states(ev)["n0"] is H.RETIRED and "n0" not in mt.routing
    # a new process under the same id (a replaced pod): a new node, warming, and like any new
    # node not routed until admitted by its evidence
    mt = tick(ev, k + 2, fleet(6), instance_ts={"n0": retired_at + 40})
    assert ("n0", "warming", "restarted") in reasons([mt]) and "n0" not in mt.routing
    assert ev.snapshot_model("m")["pairs"]["n0"]["ejections"] == 0
    assert ev.snapshot_model("m")["pairs"]["n0"]["admitted"] is False


def test_peers_in_other_units_are_never_compared() -> None:
    # Two stage-1 workers chose different signals for one model: 5 nodes in tpot (µs/token,
    # ~30), 2 in latency (µs, ~100,000). The latency ones are not judged against tpot peers.
    ev = FleetEvaluator(S)
    for k in range(8):
        now = T0 + k * TICK
        sums = [summ(f"t{i}", 30.0, seen=now)._replace(signal="tpot") for i in range(5)]
        sums += [summ(f"l{i}", 100_000.0, seen=now) for i in range(2)]
        mt = ev.evaluate("m", sums, now)
    assert mt.routing == frozenset({"t0", "t1", "t2", "t3", "t4", "l0", "l1"})
    assert not [t for t in mt.transitions if t.to_state is H.SUSPECT]
    # A tpot node 3x slower than its tpot peers is still caught.
    for k in range(8, 14):
        now = T0 + k * TICK
        sums = [summ(f"t{i}", 90.0 if i == 0 else 30.0, seen=now)._replace(signal="tpot") for i in range(5)]
        sums += [summ(f"l{i}", 100_000.0, seen=now) for i in range(2)]
        mt = ev.evaluate("m", sums, now)
    assert "t0" not in mt.routing and {"l0", "l1"} <= mt.routing
