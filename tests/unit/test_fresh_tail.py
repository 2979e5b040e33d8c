"""Low-rate tails: stage 1's count of fresh samples above the model's threshold and stage 2's
binomial verdict on it (tailguard.core.window.window ``fresh_over``, tailguard.core.judge.rules.judge_fresh_tail)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge import rules
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import FRESH_TAIL_MAX_SAMPLES, WindowStore

S = DetectorSettings()


@pytest.mark.parametrize(("k", "n", "p"), [(0, 10, 0.1), (3, 10, 0.1), (9, 150, 0.01),
                                           (12, 150, 0.01), (151, 150, 0.01), (1, 1, 0.5)])
def test_binomial_tail_equals_the_sum_of_the_pmf(k: int, n: int, p: float) -> None:
    exact = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
    assert rules.binomial_sf(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-300)


def summ(over: int | None, fresh: int) -> WindowSummary:
    return WindowSummary(node_id="n", model="m", tick_ts=0.0, signal="latency", samples=1000,
                         p50=100.0, p99=300.0, latency_p50_us=100.0, latency_p99_us=300.0,
                         fresh_samples=fresh, fresh_over=over)


@pytest.mark.parametrize(("over", "fresh", "abnormal"), [
    (12, 150, True),       # 8 %: a tail fault at 5 req/s, one 30-s tick
    (9, 150, True),        # 6 %, p ≈ 2.3e-5 at the healthy 1 %
    (6, 150, False),       # 4 %, but p ≈ 4.2e-3: a healthy node sees that now and then
    (3, 150, False),
    (5, 50, False),        # too few fresh samples to judge
    (None, 150, False),    # no threshold handed down
    (30, 600, True),
])
def test_fresh_tail_verdicts(over: int | None, fresh: int, abnormal: bool) -> None:
    j = rules.judge_fresh_tail(summ(over, fresh), S)
    assert (j is not None) == abnormal
    if j is not None:
        assert j.reason == "relative_p99" and j.severity > 1 and f"{over} of {fresh}" in (j.detail or "")


def test_stage1_counts_fresh_samples_above_the_models_threshold() -> None:
    store = WindowStore(S)
    rng = np.random.default_rng(3)
    ts = np.sort(rng.uniform(0.0, 200.0, 1000))
    lat = rng.lognormal(np.log(1000.0), 0.3, 1000)
    store.observe(SampleBatch("n", "m", None, ts, lat, np.ones(1000, bool), np.zeros(1000, bool)))
    now = 200.0
    (without,) = store.summaries(now)
    assert without.fresh_over is None
    (s,) = store.summaries(now, tail_refs={"m": 1500.0})
    fresh = ts > now - S.tick_interval_s
    assert s.fresh_samples == int(fresh.sum())
    assert s.fresh_over == int(((lat > 1500.0) & fresh).sum()) > 0
    (other,) = store.summaries(now, tail_refs={"other-model": 1500.0})
    assert other.fresh_over is None


def test_no_count_for_a_busy_series() -> None:
    store = WindowStore(S)
    n = FRESH_TAIL_MAX_SAMPLES + 100        # all within the last tick
    ts = np.linspace(171.0, 199.0, n)
    lat = np.full(n, 2000.0)
    store.observe(SampleBatch("n", "m", None, ts, lat, np.ones(n, bool), np.zeros(n, bool)))
    (s,) = store.summaries(200.0, tail_refs={"m": 1500.0})
    assert s.fresh_over is None


def test_stage2_hands_down_its_fleet_p99_with_the_margin_for_one_class_models() -> None:
    ev = FleetEvaluator(S)
    sums = [WindowSummary(node_id=f"n{i}", model="m", tick_ts=0.0, signal="latency", samples=1000,
                          p50=100.0, p99=200.0 + i, latency_p50_us=100.0, latency_p99_us=200.0 + i,
                          first_seen_ts=0.0) for i in range(5)]
    ev.evaluate("m", sums, 1000.0)      # admitted (not peers yet: admission comes after the peers)
    ev.evaluate("m", sums, 1030.0)
    assert ev.tail_refs() == {"m": pytest.approx(202.0 * rules.FRESH_TAIL_MARGIN, rel=0.05)}
    assert ev.tail_ref("m") == ev.tail_refs()["m"] and ev.tail_ref("other") is None
    mixed = [s._replace(hardware="A10" if i % 2 else "A100") for i, s in enumerate(sums)]
    ev2 = FleetEvaluator(S)
    ev2.evaluate("m", mixed, 1000.0)
    ev2.evaluate("m", mixed, 1030.0)
    assert ev2.tail_refs() == {}


@pytest.mark.parametrize(("fresh_p50", "peers_p50", "abnormal"), [
    (180.0, 100.0, False),     # the whole body 1.8x: the tail share follows from it, no verdict
    (150.0, 100.0, False),     # at FRESH_TAIL_MARGIN x the peers
    (140.0, 100.0, True),      # below it: the tail share is the node's own
    (105.0, 100.0, True),      # a tail fault on a normal body
    (180.0, None, True),       # no peers' reference: judged on the count alone
    (None, 100.0, True),       # no fresh P50 (too few fresh samples for one)
])
def test_a_body_slower_by_the_margin_is_left_to_the_p50_rules(
        fresh_p50: float | None, peers_p50: float | None, abnormal: bool) -> None:
    s = summ(30, 600)._replace(fresh_p50=fresh_p50)
    assert (rules.judge_fresh_tail(s, S, peers_p50) is not None) == abnormal


def _steady(ev: FleetEvaluator, slow: dict[str, tuple[float, float, int]], ticks: int) -> list[str]:
    """``ticks`` ticks of 8 nodes at P50 100 / P99 200 (600 fresh samples, 6 above the
    threshold); ``slow[node]`` = (P50 factor, fresh P50, fresh_over) for some. The reasons of
    the routing changes of the slow nodes."""
    out = []
    for k in range(ticks):
        sums = []
        for i in range(8):
            node = f"n{i}"
            f, f50, over = slow.get(node, (1.0, 100.0, 6))
            sums.append(WindowSummary(
                node_id=node, model="m", tick_ts=0.0, signal="latency", samples=1000, p50=100.0 * f,
                p99=200.0 * f, latency_p50_us=100.0 * f, latency_p99_us=200.0 * f, first_seen_ts=0.0,
                fresh_samples=600, fresh_p50=f50, fresh_over=over if k > 0 else None))
        mt = ev.evaluate("m", sums, 1000.0 + 30.0 * k)
        out += [f"{t.node_id}:{t.to_state}:{t.reason}" for t in mt.transitions if t.node_id in slow
                and t.reason not in ("first_seen", "admitted")]
    return out


def test_a_node_steadily_1_8x_slower_is_never_ejected_by_its_fresh_tail() -> None:
    # 1.8x throughout: 30 of 600 fresh samples (5 %) above 1.5 x the peers' P99, as a
    # narrow latency distribution gives; below every P50/P99 limit (2x)
    ev = FleetEvaluator(S)
    assert _steady(ev, {"n3": (1.8, 180.0, 30)}, 40) == []
    # the control: the same count on a body like its peers' is a tail fault
    ev = FleetEvaluator(S)
    changes = _steady(ev, {"n3": (1.0, 102.0, 30)}, 40)
    assert "n3:unhealthy:relative_p99" in changes and "n3:healthy:probe_passed" not in changes
