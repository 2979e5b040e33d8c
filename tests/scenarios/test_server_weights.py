"""Routing weights on fleets scraped from Triton (counters only) and TGI (1.5^k buckets), end to end.

Each fleet (LLM conversation sizes, TTFT and tokens, 22 ms a token) is played into each pod's
simulated server ``/metrics`` (the server's own names, buckets and counters), scraped every 10 s
through the scraper's converter (:func:`tailguard.sim.servertrace.server_lines`) and replayed on
the default settings. A pod 1.3x or 1.5x slower got no weight on either server (Triton: a mean per
interval; TGI 1.3x: inside the noise of one window's buckets); it is weighted from the median of
its recent windows now. Healthy fleets get none.
"""

from __future__ import annotations

import json

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.replay import replay
from tailguard.sim import outcome, servertrace, tracegen
from tailguard.sim import scenario as sc

ONSET_S = 600.0


def fleet(pods: int, factor: float, *, rate: float = 5.0, duration_s: float = 1500.0) -> sc.Scenario:
    return sc.one_model_fleet(pods, p50_ms=22.0, llm="conv", rate_per_s=rate, duration_s=duration_s,
                              faults=sc.slowdown_fault(["gpu-node-01"], factor, ONSET_S))


def run(server: str, s: sc.Scenario, seed: int) -> tuple[outcome.Outcome, list[dict[str, object]]]:
    out: list[str] = []
    _det, stats = replay(servertrace.server_lines(tracegen.generate(s, seed), server), DetectorSettings(),
                         out.append)
    assert stats.bad == {}, stats.summary()
    records = [json.loads(line) for line in out]
    return outcome.check(s, records), records


def weights(records: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return [(r["ts"], r["node_id"], r["weight"]) for r in records if r.get("type") == "weight"]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(("factor", "lo", "hi"), [(1.3, 0.6, 0.85), (1.5, 0.5, 0.7)])
@pytest.mark.parametrize("server", ["triton", "tgi"])
def test_a_pod_a_little_slower_is_weighted_and_kept(server: str, factor: float, lo: float, hi: float,
                                                    seed: int) -> None:
    s = fleet(10, factor)
    res, records = run(server, s, seed)
    assert res.ok and res.ejected_at_s == {}, res.problems
    assert set(res.lowest_weight) == {("gpu-node-01", "m")}, weights(records)
    low = res.lowest_weight[("gpu-node-01", "m")][0]
    assert lo <= low <= hi, weights(records)
    first = next(float(r["ts"]) - s.epoch_s for r in records if r.get("type") == "weight")
    assert first - ONSET_S <= 300.0, weights(records)          # 10 ticks of 30 s


@pytest.mark.parametrize(("pods", "rate", "seed"), [(3, 5.0, 1), (5, 2.0, 2), (10, 8.0, 3), (20, 2.0, 1)])
@pytest.mark.parametrize("server", ["triton", "tgi"])
def test_a_healthy_fleet_gets_no_weight(server: str, pods: int, rate: float, seed: int) -> None:
    res, records = run(server, fleet(pods, 1.0, rate=rate, duration_s=1500.0), seed)
    assert res.ok and weights(records) == [] and res.ejected_at_s == {}, (res.problems, weights(records))
