"""The demo's story told from /metrics (`./scripts/demo --source metrics`), end to end with 1-s ticks.

As test_e2e_story, but no node reports anything: the 8 simulated nodes serve
``/metrics`` as vLLM does (``tailguard simulate fleet --metrics vllm --traffic
http``) and ``tailguard scrape`` polls them into ``latency-events``. Checked: the
slow node leaves routing (and nobody else does), the client-side cluster P99
comes back within 20 % of the all-healthy P99, and the node is re-admitted
after it recovers (on the probe traffic the proxy sends it, as scraped).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard import demo
from tailguard.demo.plan import with_source

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


async def test_scraped_story_removes_the_slow_node_restores_the_p99_and_readmits_it(
        kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    plan = with_source(demo.TEST_PLAN, "metrics")
    log: list[str] = []
    story = await demo.run_story(plan, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url,
                                 run_dir=tmp_path, progress=log.append, show=lambda view: None)
    report = demo.render_report(story) + "\n" + "\n".join(log)
    assert any("tailguard scrape" in line for line in log), report
    assert story.removal is not None and story.removal.node_id == plan.slow_node, report
    assert not story.removal.routed and story.others_removed == (), report
    assert story.degraded.p99_ms is not None and story.healthy.p99_ms is not None, report
    assert story.degraded.p99_ms > 1.5 * story.healthy.p99_ms, report
    assert story.readmitted_s is not None and story.reejected_s is None, report
    assert story.complete, report
