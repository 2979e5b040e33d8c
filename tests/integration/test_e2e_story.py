"""The demo's story end to end, through the real stack and the reference proxy, with 1-s ticks.

``tailguard.demo.run_story`` starts ``tailguard worker``, a simulated fleet of 8
nodes (``tailguard simulate fleet``), ``tailguard proxy`` and the load
generator as child processes against the real Kafka and Redis, with a run
name of their own (``tgdemo-<random>``: app id, topics, key prefix), and
deletes the run's topics and keys afterwards. One node serves every request
3x slower from t=20 s to t=30 s (``tailguard.demo.TEST_PLAN``). Checked:

- the weak link is real: while the slow node is routed, the client-side
  cluster P99 is far above the all-healthy P99 (else the rest proves nothing);
- tailguard removes the slow node (a health change with ``routed: false``), and
  afterwards the cluster P99 is back within 20 % of the all-healthy P99;
- nobody else leaves the routing set;
- once the node has recovered, probe traffic from the proxy gets it re-admitted:
  a health change ``quarantined -> healthy`` (``probe_passed``), the node is
  in the routing set in Redis again, and it is not removed again in the
  ``settle_s`` that follow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard import demo

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


async def test_slow_node_removed_cluster_p99_restored_and_recovered_node_readmitted(
        kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    plan = demo.TEST_PLAN
    log: list[str] = []
    routed_after_readmission: list[bool] = []

    def show(view: demo.View) -> None:
        # The routing set as Redis holds it, sampled while the story runs.
        s = demo.analyze(plan, demo.Observations(changes=list(view.changes)), view.t_s)
        if s.readmitted_s is not None and view.snapshot is not None and view.t_s > s.readmitted_s:
            routed_after_readmission.append(plan.slow_node in view.snapshot.routing)

    story = await demo.run_story(plan, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url,
                                 run_dir=tmp_path, progress=log.append, show=show)
    report = demo.render_report(story) + "\n" + "\n".join(log)
    healthy, degraded, removed = story.healthy, story.degraded, story.removed
    assert healthy.p99_ms is not None and healthy.intervals >= 8, report
    assert degraded.p99_ms is not None and degraded.intervals >= 1, report
    assert removed.p99_ms is not None and removed.intervals >= 3, report

    assert degraded.p99_ms > 1.5 * healthy.p99_ms, "the slow node did not raise the cluster P99\n" + report
    assert story.removal is not None and story.removed_s is not None, report
    assert story.removal.node_id == plan.slow_node and not story.removal.routed, report
    # The numbers behind the verdict show the slowdown (the rule's name may be any of the detector's).
    assert story.removal.reason and story.removal.p50_ms is not None and story.removal.p99_ms is not None, report
    assert story.removal.p99_ms > 1.5 * healthy.p99_ms, report
    assert abs(removed.p99_ms / healthy.p99_ms - 1.0) <= 0.20, report
    assert story.others_removed == (), report
    assert story.errors == 0, report

    assert story.readmission is not None and story.readmitted_s is not None, report
    assert story.plan.end_s is not None and story.readmitted_s > story.plan.end_s, report
    assert (story.readmission.from_state, story.readmission.to_state) == ("quarantined", "healthy"), report
    assert story.readmission.reason == "probe_passed" and story.readmission.routed, report
    assert any(routed_after_readmission), "not in the routing set in Redis after re-admission\n" + report
    # Re-admitted for good: not taken out again on samples from before it recovered.
    assert story.reejected_s is None, report
    assert story.complete, report
    # The report shows the worker's page and `tailguard explain` of the node while it was out.
    assert story.obs.page_url is not None and story.obs.page_url in report, report
    assert story.obs.explain is not None and plan.slow_node in story.obs.explain, report
    assert f"tailguard explain {plan.slow_node}" in report, report
