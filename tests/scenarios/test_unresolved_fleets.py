"""Scraped fleets whose buckets cannot resolve the model, end to end: judged on their means.

A model of ~0.1-s requests (lognormal, σ 0.4, no tokens) puts every healthy request in the
first e2e bucket of vLLM (0.3 s), SGLang (0.1 s: half of them) and Dynamo (2 s). Each pod's
requests are played into its simulated server's ``/metrics``, scraped every 10 s through the
scraper's converter (:func:`tailguard.sim.servertrace.server_lines`) and replayed on the default
settings. Until 2026-12-06 such a model was named only: on Dynamo a pod 3x slower was never
removed, and a pod 1.3x slower got no weight on vLLM or Dynamo. Now each window's mean is judged
against the peers' (hist_mean) and weights come from the recent windows' means (hist_weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_server_weights import ONSET_S, run, weights

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.replay import replay
from tailguard.sim import outcome, servertrace, tracegen
from tailguard.sim import scenario as sc

SLOW = ("gpu-node-01", "m")
ROOT = Path(__file__).resolve().parents[2]


def fleet(factor: float, *, pods: int = 10, rate: float = 4.0) -> sc.Scenario:
    return sc.one_model_fleet(pods, p50_ms=100.0, sigma=0.4, rate_per_s=rate, llm=None, duration_s=1500.0,
                              faults=sc.slowdown_fault([SLOW[0]], factor, ONSET_S))


@pytest.mark.parametrize("server", ["vllm", "sglang", "dynamo"])
def test_a_pod_3x_slower_leaves_and_stays_out(server: str) -> None:
    res, _records = run(server, fleet(3.0), 1)
    assert set(res.ejected_at_s) == {SLOW} and res.gone_at_s == {}, (res.problems, res.ejected_at_s)
    assert res.ejected_at_s[SLOW] - ONSET_S <= 150.0, res.ejected_at_s
    assert res.readmitted_at_s == {}, res.readmitted_at_s


@pytest.mark.parametrize("server", ["vllm", "dynamo"])
def test_a_pod_1_3x_slower_is_weighted_and_kept(server: str) -> None:
    res, records = run(server, fleet(1.3), 1)
    assert res.ok and res.ejected_at_s == {}, (res.problems, res.ejected_at_s)
    assert set(res.lowest_weight) == {SLOW}, weights(records)
    assert 0.6 <= res.lowest_weight[SLOW][0] <= 0.9, weights(records)


@pytest.mark.parametrize(("server", "pods", "rate", "seed"), [
    ("vllm", 10, 4.0, 2), ("sglang", 5, 2.0, 3), ("dynamo", 20, 8.0, 1), ("dynamo", 3, 2.0, 2)])
def test_a_healthy_unresolved_fleet_gets_no_weight_and_no_removal(server: str, pods: int, rate: float,
                                                                   seed: int) -> None:
    res, records = run(server, fleet(1.0, pods=pods, rate=rate), seed)
    assert res.ok and weights(records) == [] and res.ejected_at_s == {}, (res.problems, weights(records))


@pytest.mark.parametrize("server", ["vllm", "dynamo"])
def test_a_fleet_wide_peak_under_the_first_bound_raises_the_fleet_event(server: str) -> None:
    """The shipped ``traffic_peak`` (every node 2.5x slower together, a 180-ms model under both
    first bounds): the fleet event it expects, as on the event path; before 2026-12-06 the
    interpolated P50s inside the first bucket stayed flat and none came."""
    s = sc.load(ROOT / "scenarios" / "traffic_peak.toml")
    res, records = run(server, s, 1)
    assert res.ok, res.problems
    kinds = {r["kind"] for r in records if r.get("type") == "fleet"}
    assert {"fleet_slow", "baseline_shift"} <= kinds, kinds


def test_a_2x_diurnal_swing_on_dynamo_reports_a_baseline_shift() -> None:
    """The shipped ``diurnal_swing_slow_node`` (the fleet 2x slower for 500 s) through Dynamo's
    /metrics: a ``baseline_shift``, as on the event path and on Triton's counters."""
    s = sc.load(ROOT / "scenarios" / "diurnal_swing_slow_node.toml")
    res, records = run("dynamo", s, 1)
    assert res.ok, res.problems
    shifts = [float(r["ts"]) - s.epoch_s for r in records
              if r.get("type") == "fleet" and r["kind"] == "baseline_shift"]
    assert shifts and 400.0 <= shifts[0] <= 520.0, shifts


@pytest.mark.parametrize("name", ["two_node_models", "scale_down_then_fault"])
def test_below_min_peers_dynamo_judges_each_node_on_its_own_mean(name: str) -> None:
    """The shipped fleets of fewer than ``min_peers`` nodes through Dynamo's /metrics (a 180-ms
    model under its 2-s bound): the slow node leaves as the scenario expects (its mean against its
    own baseline's), the mistral pair slowing together stays (a shared change)."""
    s = sc.load(ROOT / "scenarios" / f"{name}.toml")
    res, _records = run("dynamo", s, 1)
    assert res.ok, res.problems


@pytest.mark.parametrize("server", ["vllm", "sglang", "dynamo"])
def test_mixed_hardware_a_1_3x_h100_is_weighted_and_a_3x_a10g_leaves(server: str) -> None:
    """backtest3's mixed fleet (7 H100 + 3 A10G 2.2x slower, ~110-ms requests, 15-s scrapes): the
    A10G 3x slower than its class leaves, the H100 1.3x slower is weighted (before 2026-12-06 it
    got a weight only on TGI and Triton, and on Dynamo the A10G never left)."""
    text = (ROOT / "scenarios" / "minority_class_slow.toml").read_text(encoding="utf-8")
    text = text.replace("p50_ms = 180", "p50_ms = 110").replace("duration_s = 1200", "duration_s = 1500")
    s = sc.loads(text.replace("[expect]", '[[faults]]\nnode = "gpu-node-03"\nkind = "slowdown"\n'
                                          'onset_s = 617\nfactor = 1.3\n\n[expect]'))
    out: list[str] = []
    replay(servertrace.server_lines(tracegen.generate(s, 1), server, interval_s=15.0), DetectorSettings(),
           out.append)
    records = [json.loads(line) for line in out]
    res = outcome.check(s, records)
    assert res.ok and set(res.ejected_at_s) == {("gpu-node-09", "llama-3-70b")}, res.problems
    assert set(res.lowest_weight) == {("gpu-node-03", "llama-3-70b")}, weights(records)
    assert 0.6 <= res.lowest_weight[("gpu-node-03", "llama-3-70b")][0] <= 0.85, weights(records)
