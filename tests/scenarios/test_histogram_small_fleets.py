"""Scraped models with fewer than min_peers nodes, through the histogram path at vLLM's buckets.

Each fleet is written as a scenario, turned into the histogram events ``tailguard scrape`` would
publish for vLLM servers scraped every 10 s (:func:`tailguard.sim.histtrace.histogram_lines`) and
replayed with default settings. Below ``min_peers`` a node has no peer CDF: it is admitted on
its requests and judged against its own bucket history, moved as the other node moved
(docs/rules.md, Histogram pairs). Healthy fleets must keep every node (the bucket noise of a
healthy node is never a fault); a node 3x slower leaves; two nodes slower together stay.
"""

from __future__ import annotations

import json

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.replay import replay
from tailguard.sim import histtrace, outcome, tracegen
from tailguard.sim import scenario as sc

ONSET_S = 600.0
DEADLINE_S = 180.0      # scenarios/two_node_models.toml's, the event path's own-history fallback


def fleet(nodes: int, *, p50_ms: float = 450.0, sigma: float = 0.3, rate: float = 20.0,
          llm: str | None = None, faults: str = "", duration_s: float = 1500.0) -> sc.Scenario:
    return sc.one_model_fleet(nodes, p50_ms=p50_ms, sigma=sigma, rate_per_s=rate, llm=llm,
                              faults=faults, duration_s=duration_s)


def slowdown(nodes: list[str], factor: float) -> str:
    return sc.slowdown_fault(nodes, factor, ONSET_S)


def run(s: sc.Scenario, seed: int = 1) -> tuple[outcome.Outcome, list[dict[str, object]]]:
    out: list[str] = []
    replay(histtrace.histogram_lines(tracegen.generate(s, seed)), DetectorSettings(), out.append)
    records = [json.loads(line) for line in out]
    return outcome.check(s, records), records


def moves(records: list[dict[str, object]]) -> list[str]:
    """Every transition but first sight and admission, for a failure message."""
    return [f"{r['ts']} {r['node_id']} {r['from']}->{r['to']} {r['reason']} {r.get('detail')}"
            for r in records if r.get("type") == "transition" and r["reason"] not in ("first_seen", "admitted")]


def admitted(records: list[dict[str, object]]) -> set[object]:
    return {r["node_id"] for r in records if r.get("type") == "transition" and r["reason"] == "admitted"}


@pytest.mark.parametrize("nodes", [1, 2, 3])
@pytest.mark.parametrize("rate", [2.0, 20.0])
@pytest.mark.parametrize("sigma", [0.3, 0.6])
@pytest.mark.parametrize("p50_ms", [120.0, 450.0, 2200.0])
def test_a_healthy_small_model_is_routed_and_keeps_every_node(nodes: int, p50_ms: float, sigma: float,
                                                                rate: float) -> None:
    res, records = run(fleet(nodes, p50_ms=p50_ms, sigma=sigma, rate=rate), seed=1 if rate > 2 else 2)
    assert res.ok and moves(records) == [], "\n".join([*res.problems, *moves(records)])
    assert admitted(records) == {f"gpu-node-{i:02d}" for i in range(1, nodes + 1)}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("trace", ["conv", "code"])
def test_a_healthy_two_node_llm_model_keeps_both_nodes(trace: str, seed: int) -> None:
    res, records = run(fleet(2, p50_ms=30.0, llm=trace, rate=5.0), seed)
    assert res.ok and moves(records) == [], "\n".join([*res.problems, *moves(records)])
    assert admitted(records) == {"gpu-node-01", "gpu-node-02"}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("p50_ms", [250.0, 450.0, 900.0, 2200.0])
def test_a_node_3x_slower_than_its_own_history_leaves(p50_ms: float, seed: int) -> None:
    s = fleet(2, p50_ms=p50_ms, faults=slowdown(["gpu-node-01"], 3.0), duration_s=1100.0)
    res, records = run(s, seed)
    at = res.ejected_at_s.get(("gpu-node-01", "m"))
    assert at is not None and at - ONSET_S <= DEADLINE_S, moves(records)
    assert set(res.ejected_at_s) == {("gpu-node-01", "m")}, moves(records)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("p50_ms", [450.0, 900.0])
def test_two_nodes_slower_together_stay(p50_ms: float, seed: int) -> None:
    """A shared change (a new model version, load): each node moved as the other did."""
    res, records = run(fleet(2, p50_ms=p50_ms, faults=slowdown(["gpu-node-01", "gpu-node-02"], 3.0)), seed)
    assert res.ejected_at_s == {}, moves(records)


@pytest.mark.parametrize("p50_ms", [250.0, 900.0])
def test_a_node_1_4x_slower_is_not_removed(p50_ms: float) -> None:
    """Below what the buckets can prove (1.5x): never a removal (the weights grade it, elsewhere)."""
    res, records = run(fleet(2, p50_ms=p50_ms, faults=slowdown(["gpu-node-01"], 1.4)))
    assert res.ejected_at_s == {}, moves(records)
