"""Scenario traces through the replay code path, each with its expected outcome (issue 3).

Targets asserted here (event time, not wall clock): a node whose P99 or P50
degrades 3x or more at >= 20 req/s is out of routing within 120 s of onset
with default settings; no healthy node is ever taken out.
"""

from __future__ import annotations

import itertools

import pytest
from scenario_traces import T0, Mod, Node, Outcome, Scenario, run

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState

ONSET = 400.0
DETECT_WITHIN_S = 120.0
DEFAULT = DetectorSettings()


def fleet(n: int, **kw: object) -> list[Node]:
    return [Node(f"gpu-{i:02d}", **kw) for i in range(n)]  # type: ignore[arg-type]


def with_mod(nodes: list[Node], node_id: str, *mods: Mod) -> list[Node]:
    return [Node(**{**n.__dict__, "mods": n.mods + mods}) if n.node_id == node_id else n
            for n in nodes]


def assert_only_ejected(out: Outcome, expected: set[tuple[str, str]]) -> None:
    assert out.ejected_pairs() == expected, out.ejections()


def assert_detected_in_time(out: Outcome, node_id: str, model: str = "llm",
                            onset_s: float = ONSET) -> float:
    ts = out.first_out_ts(node_id, model)
    assert ts is not None, f"{node_id} never ejected"
    delay = ts - (T0 + onset_s)
    assert 0 < delay <= DETECT_WITHIN_S, delay
    return delay


def test_steady_fleet_ejects_nobody_and_is_quiet() -> None:
    out = run(Scenario("steady", fleet(8), duration_s=1200, seed=1))
    assert_only_ejected(out, set())
    reasons = {t["reason"] for t in out.transitions}
    assert reasons == {"first_seen", "admitted"}
    assert out.fleet == []
    assert out.stats.bad == {}


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_tail_fault_is_out_within_120s(seed: int) -> None:
    nodes = with_mod(fleet(8), "gpu-03", Mod("tail", ONSET + seed * 7.3, factor=6.0, fraction=0.03))
    out = run(Scenario("tail", nodes, duration_s=900, seed=seed))
    assert_only_ejected(out, {("gpu-03", "llm")})
    assert_detected_in_time(out, "gpu-03", onset_s=ONSET + seed * 7.3)
    first = out.ejections()[0]
    assert first["reason"] == "p99_p50_ratio" and first["ratio"] > 3.0


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_uniform_3x_slowdown_is_out_within_120s(seed: int) -> None:
    onset = ONSET + seed * 4.1
    nodes = with_mod(fleet(8), "gpu-05", Mod("slow", onset, factor=3.0))
    out = run(Scenario("slow", nodes, duration_s=900, seed=seed))
    assert_only_ejected(out, {("gpu-05", "llm")})
    assert_detected_in_time(out, "gpu-05", onset_s=onset)
    assert out.ejections()[0]["reason"] == "relative_p50"
    assert out.ejections()[0]["peers_p50"] == pytest.approx(100_000, rel=0.1)


def test_batch_form_detects_the_same_fault() -> None:
    nodes = with_mod(fleet(6), "gpu-01", Mod("slow", ONSET, factor=3.0))
    out = run(Scenario("slow-batch", nodes, duration_s=800, seed=8, batch_every_s=1.0))
    assert_only_ejected(out, {("gpu-01", "llm")})
    assert_detected_in_time(out, "gpu-01")


@pytest.mark.parametrize("rate_rps", [20.0, 5.0])
def test_warming_node_joining_is_not_ejected(rate_rps: float) -> None:
    # 10x slower at first, normal after 60 s; at 5 req/s its window still holds warm-up
    # samples when warm-up ends, which are never judged
    joiner = Node("gpu-new", start_s=400.0, rate_rps=rate_rps,
                  mods=(Mod("warm", 400.0, 460.0, factor=10.0),))
    out = run(Scenario("warmup", [*fleet(6), joiner], duration_s=1000, seed=9))
    assert_only_ejected(out, set())
    new = [t for t in out.transitions if t["node_id"] == "gpu-new"]
    assert [(t["from"], t["to"]) for t in new] == [("unknown", "warming"), ("warming", "healthy")]
    # admission by evidence: out of routing until its first judged window after warm-up
    assert [(t["routed"], t["reason"]) for t in new] == [(False, "first_seen"), (True, "admitted")]
    assert new[1]["ts"] >= T0 + 400 + 120


def test_joining_node_that_stays_slow_is_caught_after_warmup() -> None:
    joiner = Node("gpu-new", start_s=400.0, mods=(Mod("slow", 400.0, factor=4.0),))
    out = run(Scenario("bad-joiner", [*fleet(6), joiner], duration_s=1000, seed=10))
    assert_only_ejected(out, {("gpu-new", "llm")})
    ts = out.first_out_ts("gpu-new")
    assert ts is not None and ts >= T0 + 400 + 120      # not during warm-up


def test_fleet_wide_traffic_peak_is_a_load_event() -> None:
    peak = (Mod("slow", 500.0, 800.0, factor=2.5), Mod("tail", 500.0, 800.0, factor=4.0,
                                                          fraction=0.05))
    out = run(Scenario("peak", fleet(10, mods=peak), duration_s=1200, seed=11))
    assert_only_ejected(out, set())
    kinds = [e["kind"] for e in out.fleet]
    assert kinds.count("load_event") == 1 and "load_event_end" in kinds
    assert "baseline_shift" in kinds
    start = next(e for e in out.fleet if e["kind"] == "load_event")
    assert T0 + 500 < start["ts"] <= T0 + 500 + 90
    assert start["abnormal_nodes"] * 2 >= start["judged_nodes"]


def test_heterogeneous_pool_keeps_the_slower_class_and_catches_a_slow_a10() -> None:
    a100 = [Node(f"a100-{i}", hardware="A100", p50_us=100_000.0) for i in range(6)]
    a10 = [Node(f"a10-{i}", hardware="A10", p50_us=260_000.0) for i in range(4)]
    healthy = run(Scenario("hetero", [*a100, *a10], duration_s=900, seed=12))
    assert_only_ejected(healthy, set())
    bad = [Node(**{**n.__dict__, "mods": (Mod("slow", ONSET, factor=3.0),)})
           if n.node_id == "a10-2" else n for n in a10]
    out = run(Scenario("hetero-bad", [*a100, *bad], duration_s=900, seed=12))
    assert_only_ejected(out, {("a10-2", "llm")})
    assert_detected_in_time(out, "a10-2")
    ej = out.ejections()[0]
    assert ej["hardware"] == "A10" and ej["peers_p50"] == pytest.approx(260_000, rel=0.15)


def test_multi_model_node_only_the_degraded_pair_is_ejected() -> None:
    nodes: list[Node] = []
    for i in range(5):
        slow = (Mod("slow", ONSET, factor=3.0),) if i == 2 else ()
        nodes.append(Node(f"gpu-{i}", model="llm", p50_us=1_500_000.0, rate_rps=20.0, mods=slow))
        nodes.append(Node(f"gpu-{i}", model="embed", p50_us=5_000.0, rate_rps=40.0))
    out = run(Scenario("multi-model", nodes, duration_s=900, seed=13))
    assert_only_ejected(out, {("gpu-2", "llm")})
    assert_detected_in_time(out, "gpu-2")
    routing = out.detector.routing()
    assert "gpu-2" in routing["embed"] and "gpu-2" not in routing["llm"]


def test_intermittent_short_spikes_do_not_eject() -> None:
    spikes = tuple(Mod("slow", s, s + 6.0, factor=6.0) for s in range(300, 1500, 150))
    nodes = with_mod(fleet(6), "gpu-01", *spikes)
    out = run(Scenario("spikes", nodes, duration_s=1500, seed=14))
    assert_only_ejected(out, set())
    assert any(t["to"] == "suspect" for t in out.transitions)   # seen, but never confirmed


def test_low_traffic_gives_no_verdict_and_old_samples_age_out() -> None:
    quiet = fleet(5, rate_rps=0.2)
    slow_quiet = Node("gpu-slow", rate_rps=0.2, mods=(Mod("slow", 0.0, factor=4.0),))
    # busy for 5 minutes, then a trickle: the busy samples age out, no verdict on stale data
    drop = Node("gpu-drop", end_s=300.0)
    trickle = Node("gpu-drop", start_s=300.0, rate_rps=0.1)
    out = run(Scenario("low", [*quiet, slow_quiet, drop, trickle], duration_s=1500, seed=15))
    assert_only_ejected(out, set())
    assert {t["reason"] for t in out.transitions} == {"first_seen", "admitted"}
    status = {s.node_id: s for s in out.detector.statuses()}
    assert status["gpu-drop"].samples < 100 and status["gpu-drop"].state is HealthState.HEALTHY
    assert status["gpu-slow"].samples < 100


def test_fault_then_recovery_with_backoff() -> None:
    nodes = with_mod(fleet(6), "gpu-04", Mod("slow", ONSET, 800.0, factor=4.0))
    out = run(Scenario("recovery", nodes, duration_s=1500, seed=16))
    assert_only_ejected(out, {("gpu-04", "llm")})
    assert_detected_in_time(out, "gpu-04")
    mine = [t for t in out.transitions if t["node_id"] == "gpu-04" and t["ts"] > T0 + ONSET]
    seq = [(t["from"], t["to"], t["reason"]) for t in mine]
    assert seq[0][1] == "suspect" and seq[-1] == ("quarantined", "healthy", "probe_passed")
    back = next(t for t in mine if t["reason"] == "probe_passed")
    assert back["ts"] > T0 + 800 and back["routed"] is True
    fails = [t["ts"] for t in mine if t["reason"] == "probe_failed"]
    assert len(fails) >= 2
    gaps = [b - a for a, b in itertools.pairwise(fails)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]          # the back-off grows
    assert "gpu-04" in out.detector.routing()["llm"]


def test_quarantined_node_recovers_on_probe_traffic_only() -> None:
    # after ejection the LB sends nothing; synthetic probes (probe: true) at 1 in 20
    mods = (Mod("slow", ONSET, 700.0, factor=4.0), Mod("probe", 560.0, factor=1.0, fraction=0.05))
    nodes = with_mod(fleet(6), "gpu-02", *mods)
    out = run(Scenario("probe-only", nodes, duration_s=1400, seed=17))
    assert_only_ejected(out, {("gpu-02", "llm")})
    assert_detected_in_time(out, "gpu-02")
    back = [t for t in out.transitions if t["node_id"] == "gpu-02" and t["reason"] == "probe_passed"]
    assert back and back[0]["ts"] > T0 + 700


@pytest.mark.parametrize(("cap", "expected_out"), [(0.5, 4), (0.25, 3)])
def test_rack_failure_is_ejected_up_to_the_cap(cap: float, expected_out: int) -> None:
    nodes = fleet(12)
    for i in range(4):       # rack r1 = gpu-00..03
        nodes = with_mod(nodes, f"gpu-{i:02d}", Mod("slow", ONSET, factor=3.0))
    out = run(Scenario("rack", nodes, duration_s=900, seed=18,
                       settings={"max_ejected_fraction": cap}))
    rack = {(f"gpu-{i:02d}", "llm") for i in range(4)}
    assert out.ejected_pairs() <= rack and len(out.ejected_pairs()) == expected_out
    assert out.max_out("llm") == expected_out
    kept = [t for t in out.transitions if t["reason"] == "ejection_cap"]
    assert len(kept) == 4 - expected_out and all(t["routed"] for t in kept)
    for node, _ in out.ejected_pairs():
        assert_detected_in_time(out, node)


def test_same_trace_same_output_and_bad_lines_counted() -> None:
    nodes = with_mod(fleet(5), "gpu-01", Mod("slow", ONSET, factor=3.0))
    sc = Scenario("determinism", nodes, duration_s=700, seed=19)
    a, b = run(sc), run(sc)
    assert a.records == b.records and a.records
    lines = sc.lines()
    lines[100:100] = [b"not json", b'{"node_id": "x", "model": "m", "latency_us": -1, "ts": 1}', b""]
    out: list[str] = []
    from tailguard.core.replay.replay import replay

    _, stats = replay(lines, sc.detector_settings(), out.append)
    assert stats.bad == {"bad_json": 1, "bad_latency": 1}
    assert [ln for ln, _, _ in stats.first_bad] == [101, 102]
    assert [r for r in out] == [__import__("json").dumps(r) for r in a.records]


def test_bad_deploy_is_reported_and_later_faults_are_still_caught() -> None:
    # every node 3x slower from 300 s on (a bad deploy), one node 3x slower again at 1200 s
    deploy = (Mod("slow", 300.0, factor=3.0),)
    nodes = with_mod(fleet(8, mods=deploy), "gpu-06", Mod("slow", 1200.0, factor=3.0))
    out = run(Scenario("deploy", nodes, duration_s=1500, seed=20))
    kinds = [e["kind"] for e in out.fleet]
    assert kinds.count("baseline_shift") == 1 and kinds.count("load_event") == 1
    assert "load_event_end" in kinds          # the baseline follows a lasting shift
    assert_only_ejected(out, {("gpu-06", "llm")})
    assert_detected_in_time(out, "gpu-06", onset_s=1200.0)


def test_small_hardware_class_node_is_caught_against_its_own_baseline() -> None:
    a100 = [Node(f"a100-{i}", hardware="A100", p50_us=100_000.0) for i in range(6)]
    a10 = [Node("a10-0", hardware="A10", p50_us=260_000.0),
           Node("a10-1", hardware="A10", p50_us=260_000.0, mods=(Mod("slow", 600.0, factor=3.0),))]
    out = run(Scenario("small-class", [*a100, *a10], duration_s=1000, seed=21))
    assert_only_ejected(out, {("a10-1", "llm")})
    assert_detected_in_time(out, "a10-1", onset_s=600.0)
    healthy = run(Scenario("small-class-ok", [*a100, a10[0]], duration_s=1000, seed=21))
    assert_only_ejected(healthy, set())


def test_node_recovered_at_ejection_is_readmitted_after_the_first_backoff() -> None:
    # Requests in flight at ejection (and sent before the LB learns of it) complete slow after
    # it; the node itself recovered at ejection and gets probe traffic from then on. The first
    # probe round starts when the back-off has passed, so those stragglers do not fail it.
    fault = Mod("slow", ONSET, factor=4.0)
    nodes = with_mod(fleet(6), "gpu-05", fault)        # the last node: its mods draw last
    first = run(Scenario("eject", nodes, duration_s=700, seed=21))
    out_ts = first.first_out_ts("gpu-05")
    assert out_ts is not None
    eject_s = out_ts - T0
    stragglers_s = 3.0                                   # 60 slow samples at 20 req/s
    nodes = with_mod(fleet(6), "gpu-05", Mod("slow", ONSET, eject_s + stragglers_s, factor=4.0),
                     Mod("probe", eject_s + stragglers_s, fraction=0.1))
    out = run(Scenario("eject-recovered", nodes, duration_s=eject_s + 300, seed=21))
    assert out.first_out_ts("gpu-05") == out_ts
    mine = [t for t in out.transitions if t["node_id"] == "gpu-05" and t["ts"] > out_ts]
    assert [t["reason"] for t in mine] == ["quarantine", "probe_passed"], mine
    backoff = DEFAULT.backoff_initial_s
    assert mine[-1]["ts"] <= out_ts + backoff + DEFAULT.tick_interval_s   # not the second back-off


def test_readmitted_node_is_not_judged_again_on_its_old_slow_samples() -> None:
    # 1-s ticks; the fleet started together, so every node still holds its warm-up cut-off when
    # gpu-05 is re-admitted. Its window still holds its slow samples from before ejection
    # (quarantine brought only probe traffic); it must be judged on the passing round only.
    one_s = {"tick_interval_s": 1.0}
    nodes = with_mod(fleet(6), "gpu-05", Mod("slow", 150.0, factor=4.0))
    # both runs span the same 400 s: the same draws up to the ejection (a trace's arrivals
    # depend on its duration)
    first = run(Scenario("eject", nodes, duration_s=400, seed=22, settings=one_s))
    out_ts = first.first_out_ts("gpu-05", "llm")
    assert out_ts is not None
    eject_s = out_ts - T0
    nodes = with_mod(fleet(6), "gpu-05", Mod("slow", 150.0, eject_s + 1.0, factor=4.0),
                     Mod("probe", eject_s + 1.0, eject_s + 90.0, fraction=0.1))
    assert eject_s + 150 <= 400
    out = run(Scenario("readmitted", nodes, duration_s=400, seed=22, settings=one_s))
    assert out.first_out_ts("gpu-05") == out_ts
    mine = [t for t in out.transitions if t["node_id"] == "gpu-05" and t["ts"] > out_ts]
    assert [t["reason"] for t in mine] == ["quarantine", "probe_passed"], mine
    assert "gpu-05" in out.detector.routing()["llm"]
