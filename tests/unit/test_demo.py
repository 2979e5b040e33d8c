"""The demo's pure parts: the plan, cutting a run into phases, the report (no processes, no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard import demo
from tailguard.sim.scenario import loads as load_scenario

PLAN = demo.Plan(onset_s=60.0, degraded_s=30.0, backoff_initial_s=20.0, interval_s=2.5)


def interval(t1_s: float, p99_ms: float, *, p50_ms: float = 180.0, n: int = 400) -> demo.Interval:
    return demo.Interval(t1_s - 2.5, t1_s, n, 0, p50_ms, p99_ms, {})


def change(t_s: float, node: str, frm: str, to: str, routed: bool, reason: str) -> demo.HealthChange:
    return demo.HealthChange(t_s, node, frm, to, routed, reason, 540.0, 900.0, 1.7, 180.0, None)


def observations(p99_at: dict[str, float], changes: list[demo.HealthChange]) -> demo.Observations:
    """Intervals every 2.5 s up to 160 s; the P99 of each phase from ``p99_at``."""
    ivs = []
    for k in range(1, 65):
        t1 = 2.5 * k
        if t1 <= 60:
            p99 = p99_at["healthy"]
        elif t1 <= 82.5:
            p99 = p99_at["degraded"]
        elif t1 <= 131:
            p99 = p99_at["removed"]
        else:
            p99 = p99_at["back"]
        ivs.append(interval(t1, p99))
    return demo.Observations(intervals=ivs, changes=changes, load_start_s=0.0)


STORY_CHANGES = [
    change(70.0, "gpu-node-05", "healthy", "suspect", True, "relative_p50"),
    change(80.0, "gpu-node-05", "suspect", "unhealthy", False, "relative_p50"),
    change(85.0, "gpu-node-05", "unhealthy", "quarantined", False, "quarantine"),
    change(102.0, "gpu-node-05", "quarantined", "quarantined", False, "probe_failed"),
    change(130.0, "gpu-node-05", "quarantined", "healthy", True, "probe_passed"),
]


def test_phases_are_cut_at_the_slow_nodes_health_changes() -> None:
    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, STORY_CHANGES)
    s = demo.analyze(PLAN, obs, 160.0)
    assert (s.suspect_s, s.removed_s, s.readmitted_s, s.reejected_s) == (70.0, 80.0, 130.0, None)
    assert s.healthy.p99_ms == 370 and s.healthy.t0_s == 5.0       # first 2 intervals skipped
    assert s.degraded.p99_ms == 820 and s.degraded.t1_s == 81.0    # + 1 s for the proxy to learn
    # the node recovered (t=90) before its probes began (t=100): probe traffic is fine to count
    assert s.removed.p99_ms == 380 and (s.removed.t0_s, s.removed.t1_s) == (81.0, 130.0)
    assert s.readmitted.p99_ms == 372 and s.readmitted.t0_s == 131.0
    assert s.weak_link_factor == pytest.approx(820 / 370)
    assert s.cured_factor == pytest.approx(380 / 370)
    assert s.complete
    report = demo.render_report(s)
    assert "P99    820 ms" in report and "= 2.22x healthy" in report
    assert "left the routing set at t=80.0s, 20.0 s after it slowed down" in report
    assert "re-admitted: at t=130.0s" in report and "result: ok" in report
    assert "tailguard explain" not in report and "status page" not in report
    obs.explain, obs.page_url = "gpu-node-05 / llama: quarantined\n  tick 80: p50 3x", "http://127.0.0.1:1/tailguard/"
    report = demo.render_report(demo.analyze(PLAN, obs, 160.0))
    assert "`tailguard explain gpu-node-05` when it was out:\n    gpu-node-05 / llama: quarantined" in report
    assert "status page (served by the worker while it ran): http://127.0.0.1:1/tailguard/" in report


@pytest.mark.parametrize(("p99_removed", "complete"), [(370 * 1.19, True), (370 * 1.21, False), (370 * 0.79, False)])
def test_complete_needs_the_p99_back_within_20_percent(p99_removed: float, complete: bool) -> None:
    obs = observations({"healthy": 370, "degraded": 820, "removed": p99_removed, "back": 372}, STORY_CHANGES)
    assert demo.analyze(PLAN, obs, 160.0).complete is complete


def test_no_removal_no_readmission_or_a_second_removal_is_incomplete() -> None:
    obs = observations({"healthy": 370, "degraded": 820, "removed": 820, "back": 820}, STORY_CHANGES[:1])
    s = demo.analyze(PLAN, obs, 160.0)
    assert s.removed_s is None and s.removed.p99_ms is None and not s.complete
    assert "was NOT removed" in demo.render_report(s)
    assert s.degraded.t1_s == 160.0

    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, STORY_CHANGES[:3])
    s = demo.analyze(PLAN, obs, 160.0)
    assert s.removed_s == 80.0 and s.readmitted_s is None and not s.complete
    assert "re-admitted: NO" in demo.render_report(s)

    again = [*STORY_CHANGES, change(133.0, "gpu-node-05", "suspect", "unhealthy", False, "p99_p50_ratio")]
    s = demo.analyze(PLAN, observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, again),
                     160.0)
    assert s.reejected_s == 133.0 and s.readmitted.t1_s == 133.0 and not s.complete


def test_other_nodes_leaving_routing_make_the_story_incomplete() -> None:
    other = change(75.0, "gpu-node-02", "suspect", "unhealthy", False, "p99_p50_ratio")
    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, [*STORY_CHANGES, other])
    s = demo.analyze(PLAN, obs, 160.0)
    assert s.others_removed == ("gpu-node-02",) and not s.complete


def test_probe_traffic_to_a_still_slow_node_is_not_counted_as_removed() -> None:
    plan = demo.Plan(onset_s=60.0, degraded_s=None, backoff_initial_s=20.0, interval_s=2.5)
    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 600}, STORY_CHANGES[:3])
    s = demo.analyze(plan, obs, 160.0)
    assert (s.removed.t0_s, s.removed.t1_s) == (81.0, 100.0)   # probes from removal + back-off


def test_plan_scenario_is_valid_and_matches_the_timeline() -> None:
    for plan in (demo.DEMO_PLAN, demo.TEST_PLAN):
        sc = load_scenario(plan.scenario_toml())
        assert [n.node_id for n in sc.nodes] == list(plan.node_ids)
        fault, *graded = sc.faults
        assert fault.nodes == (plan.slow_node,) and fault.kind == "slowdown" and fault.factor == plan.slowdown
        assert (fault.onset_s, fault.end_s) == (plan.onset_s, plan.end_s)
        if plan.graded_node is None:
            assert graded == []
        else:
            (g,) = graded
            assert g.nodes == (plan.graded_node,) and g.kind == "slowdown" and g.factor == plan.graded_slowdown
            assert (g.onset_s, g.end_s) == (plan.graded_onset_s, None)
    assert demo.DEMO_PLAN.graded_node == "gpu-node-03"      # ./scripts/demo shows the graded phase


def test_settings_lines_name_every_changed_setting_and_the_env_carries_them() -> None:
    lines = "\n".join(demo.settings_lines(demo.DEMO_PLAN))
    assert "* tick_interval_s    = 5" in lines and "(default 30)" in lines
    env = demo.child_env(demo.DEMO_PLAN, demo.RunNames("tgdemo-x"), "127.0.0.1:9092", "redis://h:1/0",
                         demo.ROOT / "x")
    assert env["TAILGUARD_TICK_INTERVAL_S"] == "5.0" and env["TAILGUARD_KEY_PREFIX"] == "tgdemo-x"
    assert env["TAILGUARD_TOPIC_HEALTH_CHANGES"] == "tgdemo-x-health-changes"
    assert "TAILGUARD_CONFIRM_WINDOWS" not in env     # the default is kept


def test_a_plan_without_a_healthy_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="onset_s"):
        demo.Plan(onset_s=5.0)
    with pytest.raises(ValueError, match="slow_node"):
        demo.Plan(slow_node="gpu-node-09")


def test_a_saved_run_replots_to_the_same_story(tmp_path: Path) -> None:
    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, STORY_CHANGES)
    obs.snapshots.append(demo.Snapshot(100.0, {"gpu-node-05": demo.NodeView(
        "quarantined", False, None, None, None, 0, 100.0)}, frozenset({"gpu-node-01"})))
    story = demo.analyze(PLAN, obs, 160.0)
    demo.save_run(story, tmp_path / "run.json")
    again = demo.load_run(tmp_path / "run.json")
    assert again.plan == story.plan and again.end_s == 160.0
    assert (again.healthy, again.degraded, again.removed, again.readmitted) == (
        story.healthy, story.degraded, story.removed, story.readmitted)
    assert again.obs.snapshots == story.obs.snapshots and again.obs.changes == story.obs.changes
    demo.plot(again, tmp_path / "run.png")
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_new_nodes_awaiting_admission_did_not_leave_routing() -> None:
    # Every node's first_seen is "warming, not routed" (admission by evidence): not a removal.
    firsts = [change(5.0, f"gpu-node-0{i}", "unknown", "warming", False, "first_seen") for i in range(1, 9)]
    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, [*firsts, *STORY_CHANGES])
    s = demo.analyze(PLAN, obs, 160.0)
    assert s.others_removed == () and s.complete


# -- the graded phase: a node 1.6x slower is weighted down, not removed ------------------------------

GRADED = demo.Plan(onset_s=60.0, degraded_s=30.0, backoff_initial_s=20.0, interval_s=2.5, deadline_s=260.0,
                   graded_node="gpu-node-03", graded_onset_s=175.0, graded_s=50.0)


def graded_observations(weight_from_s: float | None, *, p99_full: float = 450.0, p99_weighted: float = 390.0,
                        extra: list[demo.HealthChange] | None = None) -> demo.Observations:
    """The slow node's story to 160 s, then intervals to 225 s; gpu-node-03 weighted 0.9 from
    ``weight_from_s`` and 0.45 from 5 s later in the snapshots (every 2.5 s); it serves 50 of
    400 requests per interval at full weight, 25 once weighted."""
    obs = observations({"healthy": 370, "degraded": 820, "removed": 380, "back": 372}, [*STORY_CHANGES, *(extra or [])])
    for k in range(65, 91):
        t1 = 2.5 * k
        late = weight_from_s is not None and t1 - 2.5 >= weight_from_s + 1.0
        iv = interval(t1, 372.0 if t1 <= 175 else p99_weighted if late else p99_full)
        iv.by_node.update({"gpu-node-03": 25 if late else 50, "gpu-node-01": 375 if late else 350})
        obs.intervals.append(iv)
    for k in range(1, 91):
        t = 2.5 * k
        w = 1.0 if weight_from_s is None or t < weight_from_s else 0.9 if t < weight_from_s + 5.0 else 0.45
        obs.snapshots.append(demo.Snapshot(t, {"gpu-node-03": demo.NodeView(
            "healthy", True, 290.0, 600.0, 2.0, 200, None, w)}, frozenset(PLAN.node_ids)))
    return obs


def test_the_graded_node_is_cut_at_its_weight_and_the_main_story_ends_where_it_begins() -> None:
    s = demo.analyze(GRADED, graded_observations(195.0), 225.0)
    g = s.graded
    assert g is not None and g.node == "gpu-node-03"
    assert (g.weighted_s, g.weight, g.settled_s, g.left_routing, g.ok) == (195.0, 0.45, 200.0, False, True)
    assert (g.full.t0_s, g.full.t1_s, g.full.p99_ms) == (175.0, 196.0, 450.0)
    assert (g.weighted.t0_s, g.weighted.t1_s, g.weighted.p99_ms) == (201.0, 225.0, 390.0)
    assert (g.full_share, g.weighted_share) == (0.125, 0.0625)
    assert s.readmitted.t1_s == 175.0 and s.readmitted.p99_ms == 372      # not mixed with the graded phase
    assert s.complete
    report = demo.render_report(s)
    assert "graded: gpu-node-03 serves every request 1.6x slower from t=175s on" in report
    assert ("weighted down from t=195.0s (20.0 s after it slowed down), to 0.45 at t=200.0s; never out of routing."
            in report)
    assert "its share of the requests: 12.5% at full weight (1/8 = 12.5%), 6.2% weighted down." in report
    assert "cluster P99 450 ms at full weight, 390 ms weighted down (0.87x)." in report
    assert "result: ok" in report


def test_a_graded_node_not_weighted_or_taken_out_makes_the_story_incomplete() -> None:
    s = demo.analyze(GRADED, graded_observations(None), 225.0)
    assert s.graded is not None and s.graded.weighted_s is None and not s.complete
    assert "gpu-node-03 was NOT weighted down before the run ended." in demo.render_report(s)
    out = change(200.0, "gpu-node-03", "suspect", "unhealthy", False, "relative_p50")
    s = demo.analyze(GRADED, graded_observations(195.0, extra=[out]), 225.0)
    assert s.graded is not None and s.graded.left_routing and not s.complete
    assert s.others_removed == ("gpu-node-03",)


def test_the_story_waits_for_the_graded_phase_and_says_where_it_is() -> None:
    obs = graded_observations(195.0)
    assert not demo.story_done(GRADED, obs, 200.0)
    assert demo.story_done(GRADED, obs, 225.0)
    assert "waiting for tailguard" in demo.current_phase(GRADED, graded_observations(None), 180.0)
    assert "weighted down to 0.45 at t=200s" in demo.current_phase(GRADED, obs, 202.0)
    assert "graded" not in demo.current_phase(GRADED, obs, 170.0)


def test_a_weight_that_settles_late_is_measured_before_the_story_ends() -> None:
    """The weight went 0.9 at 210 s and 0.45 at 215 s: the graded phase ends at 225 s, but the
    weighted phase is measured settle_s (15 s) from 216 s first (a run that ended at 225 s
    reported it "not measured" and the node "NOT weighted down")."""
    obs = graded_observations(210.0)
    assert not demo.story_done(GRADED, obs, 225.0)
    assert not demo.story_done(GRADED, obs, 230.0)
    assert demo.story_done(GRADED, obs, 231.0)
    report = demo.render_report(demo.analyze(GRADED, obs, 217.0))     # no interval after 216 s yet
    assert "NOT weighted down" not in report
    assert "the run ended before gpu-node-03's requests at its final weight were measured." in report


@pytest.mark.parametrize(("kw", "match"), [
    ({"graded_node": "gpu-node-05"}, "graded_node"), ({"graded_node": "gpu-node-09"}, "graded_node"),
    ({"graded_node": "gpu-node-03", "graded_slowdown": 2.5}, "graded_slowdown"),
    ({"graded_node": "gpu-node-03", "graded_onset_s": 80.0}, "graded_onset_s"),
    ({"graded_node": "gpu-node-03", "graded_onset_s": 180.0}, "graded_onset_s"),   # past deadline_s 200
])
def test_a_bad_graded_phase_is_refused(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        demo.Plan(**kw)  # type: ignore[arg-type]


def test_a_saved_run_keeps_the_weights(tmp_path: Path) -> None:
    story = demo.analyze(GRADED, graded_observations(195.0), 225.0)
    demo.save_run(story, tmp_path / "run.json")
    again = demo.load_run(tmp_path / "run.json")
    assert again.graded == story.graded


def test_node_view_reads_the_weight_of_the_status_json() -> None:
    from tailguard.demo.story import node_view

    assert node_view({"state": "healthy", "routed": True, "weight": 0.45}, 0.0).weight == 0.45
    assert node_view({"state": "healthy", "routed": True}, 0.0).weight is None
    assert node_view({"state": "healthy", "routed": True, "weight": True}, 0.0).weight is None
