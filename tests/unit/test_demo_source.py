"""The demo told from /metrics: the plan's source and what it changes."""

from __future__ import annotations

import pytest

from tailguard.demo.plan import DEMO_PLAN, TEST_PLAN, Plan, with_source


def test_the_default_demo_is_the_emitters() -> None:
    assert DEMO_PLAN.source == TEST_PLAN.source == "emitter"
    assert with_source(DEMO_PLAN, "emitter") is DEMO_PLAN


def test_from_metrics_latencies_fit_vllms_buckets_and_the_rest_stays() -> None:
    p = with_source(TEST_PLAN, "metrics")
    assert (p.source, p.p50_ms) == ("metrics", 600.0)
    assert (p.tick_interval_s, p.slow_node, p.onset_s) == (TEST_PLAN.tick_interval_s, TEST_PLAN.slow_node,
                                                           TEST_PLAN.onset_s)
    assert "p50_ms = 600" in p.scenario_toml()
    assert with_source(p, "emitter").p50_ms == DEMO_PLAN.p50_ms


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="source='otel' must be one of emitter, metrics"):
        Plan(source="otel")


def test_from_metrics_the_graded_phase_stays() -> None:
    """Histogram models get routing weights too (hist_weights): the demo's graded node, 1.6x
    slower, is weighted from its buckets (./scripts/demo --source metrics, 2026-12-05: to 0.55)."""
    assert DEMO_PLAN.graded_node is not None
    p = with_source(DEMO_PLAN, "metrics")
    assert (p.graded_node, p.graded_slowdown) == (DEMO_PLAN.graded_node, DEMO_PLAN.graded_slowdown)
    assert Plan(source="metrics", graded_node="gpu-node-03", graded_onset_s=100.0, deadline_s=200.0).source == "metrics"
