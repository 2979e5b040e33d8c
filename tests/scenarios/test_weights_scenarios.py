"""Routing weights through the replay code path on scenario traces (issue 25).

A node 1.2–2x slower than its peers is weighted down (a ``"type": "weight"`` line), not
ejected; a healthy fleet, one whose nodes differ within the noise, and a fleet slower all
together keep every weight at 1.0 (the shipped scenarios and the backtests assert >= 0.95
through tailguard.sim.outcome.check and their own checks).
"""

from __future__ import annotations

from typing import Any

import pytest
from scenario_traces import T0, Mod, Node, Outcome, Scenario, run

ONSET = 400.0


def fleet(n: int, **kw: Any) -> list[Node]:
    return [Node(f"gpu-{i:02d}", **kw) for i in range(n)]


def slow(nodes: list[Node], node_id: str, *mods: Mod) -> list[Node]:
    return [Node(**{**n.__dict__, "mods": n.mods + mods}) if n.node_id == node_id else n
            for n in nodes]


def weights(out: Outcome) -> list[dict[str, Any]]:
    return [r for r in out.records if r["type"] == "weight"]


def lowest(out: Outcome, node_id: str | None = None) -> float:
    return min((float(r["weight"]) for r in weights(out)
                if node_id is None or r["node_id"] == node_id), default=1.0)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_steady_fleet_keeps_full_weight(seed: int) -> None:
    out = run(Scenario("steady", fleet(8), duration_s=1200, seed=seed))
    assert weights(out) == [] and out.ejections() == []


def test_nodes_a_little_apart_keep_full_weight() -> None:
    nodes = [Node(f"gpu-{i:02d}", p50_us=100_000.0 * (0.95 + 0.1 * i / 9)) for i in range(10)]
    out = run(Scenario("spread", nodes, duration_s=1200, seed=3))
    assert lowest(out) >= 0.95 and out.ejections() == []


def test_a_fleet_slower_together_changes_no_weight() -> None:
    nodes = [Node(**{**n.__dict__, "mods": (Mod("slow", ONSET, ONSET + 240, factor=2.5),)})
             for n in fleet(8)]
    out = run(Scenario("load", nodes, duration_s=1000, seed=4))
    assert weights(out) == [] and out.ejections() == []


@pytest.mark.parametrize(("factor", "within", "at_most"), [(1.6, 0.6, 150.0), (1.3, 0.95, 150.0)])
def test_a_slower_node_is_weighted_down_not_ejected(factor: float, within: float,
                                                    at_most: float) -> None:
    nodes = slow(fleet(8), "gpu-03", Mod("slow", ONSET, factor=factor))
    out = run(Scenario(f"slow-{factor}", nodes, duration_s=1000, seed=5))
    assert out.ejections() == []
    down = [r for r in weights(out) if r["node_id"] == "gpu-03"]
    assert down and float(down[0]["ts"]) - (T0 + ONSET) <= at_most, down
    assert lowest(out, "gpu-03") <= within
    assert {r["node_id"] for r in weights(out)} == {"gpu-03"}     # nobody else moves
    assert set(down[0]) == {"type", "ts", "node_id", "model", "weight"}


def test_1_3x_is_weighted_down_less_than_1_6x() -> None:
    lows = []
    for factor in (1.3, 1.6):
        nodes = slow(fleet(8), "gpu-03", Mod("slow", ONSET, factor=factor))
        lows.append(lowest(run(Scenario("slow", nodes, duration_s=900, seed=6)), "gpu-03"))
    assert lows[1] < lows[0] < 1.0


def test_a_recovered_node_returns_to_full_weight_in_steps() -> None:
    nodes = slow(fleet(8), "gpu-03", Mod("slow", ONSET, ONSET + 300, factor=1.6))
    out = run(Scenario("recover", nodes, duration_s=1500, seed=7))
    seen = [float(r["weight"]) for r in weights(out)]
    assert min(seen) < 0.6 and seen[-1] == 1.0
    ups = seen[seen.index(min(seen)):]
    assert len(ups) >= 3 and ups == sorted(ups)                  # back in steps, never down
