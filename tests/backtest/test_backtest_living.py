"""Backtest of ``tailguard replay`` on fleets that change, from a generator of this file.

Independent of ``tailguard.sim``: each node here has a life (join, leave), optional restarts (a
silence, then a warm-up 6x slower decaying over 90 s, a new ``instance`` when the producer
sends one), optional heartbeats every 10 s, Poisson arrivals and lognormal latency; faults
make a node 3x slower. Traces go through the command-line entry point on a file, the way a
user or an external evaluation runs it. Each case asserts the routing set over time:

* a node that leaves is out of routing (reason ``silent``) within ``silent_after_s`` plus
  two ticks, and no live node is ever taken out unless it is at fault;
* a faulty node among the survivors is out within its deadline;
* restarts and crowds of new nodes remove nobody; a pipeline-wide silence removes nobody.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tailguard.replay_cli import main

pytestmark = pytest.mark.slow

T0 = 1_764_690_013.7
SILENT_AFTER_S = 120.0
TICK_S = 30.0


@dataclass(frozen=True)
class Life:
    node: str
    join_s: float = 0.0
    leave_s: float | None = None
    restarts: tuple[tuple[float, float], ...] = ()      # (down_s, up_s)
    slow_from_s: float | None = None                    # 3x slower from then on
    rate: float = 20.0
    warmup_at_join: bool = False


@dataclass
class Trace:
    lives: list[Life]
    duration_s: float
    heartbeats: bool = True
    instances: bool = False
    silence: tuple[float, float] | None = None           # nobody reports in [a, b)
    seed: int = 1
    lines: list[tuple[float, str]] = field(default_factory=list)

    def write(self, path: Path) -> None:
        rng = np.random.default_rng(self.seed)
        for life in self.lives:
            end = self.duration_s if life.leave_s is None else life.leave_s
            n = rng.poisson(life.rate * (end - life.join_s))
            t = np.sort(life.join_s + (end - life.join_s) * rng.random(n))
            lat = 180_000.0 * np.exp(0.3 * rng.standard_normal(n))
            starts = [life.join_s] if life.warmup_at_join else []
            starts += [up for _, up in life.restarts]
            for s0 in starts:                            # warm-up: 6x, decaying over 90 s
                w = (t >= s0) & (t < s0 + 90.0)
                lat[w] *= 1.0 + 5.0 * (1.0 - (t[w] - s0) / 90.0)
            if life.slow_from_s is not None:
                lat[t >= life.slow_from_s] *= 3.0
            done = t + lat / 1e6
            for ts, v in zip(done.tolist(), lat.tolist(), strict=True):
                if self._reports(life, ts):
                    ev = {"node_id": life.node, "model": "m", "latency_us": round(v), "ts": T0 + ts}
                    if self.instances:
                        ev["instance"] = f"{life.node}-{sum(1 for _, up in life.restarts if up <= ts)}"
                    self.lines.append((ts, json.dumps(ev)))
            if self.heartbeats:
                for ts in np.arange(life.join_s, end, 10.0).tolist():
                    if self._reports(life, ts):
                        self.lines.append((ts, json.dumps({"type": "heartbeat", "node_id": life.node,
                                                           "model": "m", "ts": T0 + ts})))
        self.lines.sort(key=lambda x: x[0])
        path.write_text("\n".join(line for _, line in self.lines) + "\n")

    def _reports(self, life: Life, ts: float) -> bool:
        if ts >= self.duration_s or (life.leave_s is not None and ts >= life.leave_s):
            return False
        if self.silence is not None and self.silence[0] <= ts < self.silence[1]:
            return False
        return not any(down <= ts < up for down, up in life.restarts)


def replay(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    f = tmp_path / "trace.jsonl"
    trace.write(f)
    assert main([str(f)]) == 0
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def out_at(records: list[dict[str, object]]) -> dict[str, tuple[float, str]]:
    """node -> (seconds after T0, reason) of its first transition out of routing (a new node
    awaiting admission, ``warming`` and not routed, was never in it)."""
    out: dict[str, tuple[float, str]] = {}
    for r in records:
        if (r.get("type") == "transition" and r["routed"] is False and r["reason"] != "forgotten"
                and r["to"] != "warming"):
            out.setdefault(str(r["node_id"]), (float(r["ts"]) - T0, str(r["reason"])))  # type: ignore[arg-type]
    return out


def weighted_down(records: list[dict[str, object]]) -> dict[str, float]:
    """node -> its lowest routing weight below 0.95 (no false down-weighting: a healthy
    node keeps at least 0.95)."""
    low: dict[str, float] = {}
    for r in records:
        if r.get("type") == "weight" and float(r["weight"]) < 0.95:  # type: ignore[arg-type]
            node = str(r["node_id"])
            low[node] = min(low.get(node, 1.0), float(r["weight"]))  # type: ignore[arg-type]
    return low


@pytest.mark.parametrize("seed", [21, 22])
@pytest.mark.parametrize("heartbeats", [True, False])
def test_scale_down_then_a_slow_survivor(seed: int, heartbeats: bool, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    lives = [Life(f"n{i}", leave_s=330.0 if i >= 4 else None, slow_from_s=720.0 if i == 0 else None)
             for i in range(8)]
    out = out_at(replay(Trace(lives, 1200.0, heartbeats=heartbeats, seed=seed), tmp_path, capsys))
    for i in range(4, 8):
        t, reason = out[f"n{i}"]
        assert reason == "silent" and 0 < t - 330.0 <= SILENT_AFTER_S + 2 * TICK_S, (i, t)
    t, reason = out["n0"]
    assert reason != "silent" and 0 < t - 720.0 <= 180.0, (t, reason)
    assert set(out) == {"n0", "n4", "n5", "n6", "n7"}, out


@pytest.mark.parametrize("seed", [23, 24])
@pytest.mark.parametrize(("gap_s", "instances"), [(60.0, False), (40.0, False), (8.0, True)])
def test_rolling_restart_removes_nobody(seed: int, gap_s: float, instances: bool, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    lives = [Life(f"n{i}", restarts=((300.0 + 140.0 * i, 300.0 + 140.0 * i + gap_s),)) for i in range(6)]
    records = replay(Trace(lives, 1400.0, instances=instances, seed=seed), tmp_path, capsys)
    assert out_at(records) == {}
    assert weighted_down(records) == {}


@pytest.mark.parametrize("seed", [25, 26])
def test_preemption_wave_and_crowd_join(seed: int, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    lives = [Life(f"old{i}", leave_s=400.0 if i < 3 else None) for i in range(6)]
    lives += [Life(f"new{i}", join_s=420.0 + 3 * i, warmup_at_join=True) for i in range(12)]
    records = replay(Trace(lives, 1100.0, seed=seed), tmp_path, capsys)
    out = out_at(records)
    assert {n for n, (_, r) in out.items()} == {"old0", "old1", "old2"}
    assert all(r == "silent" for _, r in out.values())
    assert weighted_down(records) == {}


@pytest.mark.parametrize("seed", [27, 28])
def test_pipeline_silence_keeps_routing(seed: int, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    lives = [Life(f"n{i}") for i in range(6)]
    records = replay(Trace(lives, 1100.0, silence=(400.0, 650.0), seed=seed), tmp_path, capsys)
    assert out_at(records) == {} and weighted_down(records) == {}
    kinds = [r["kind"] for r in records if r.get("type") == "fleet"]
    assert kinds == ["telemetry_lost", "telemetry_restored"], kinds


@pytest.mark.parametrize("seed", [29, 30])
def test_two_node_model(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = out_at(replay(Trace([Life("a", slow_from_s=600.0), Life("b")], 1000.0, seed=seed),
                        tmp_path, capsys))
    assert set(one) == {"a"} and 0 < one["a"][0] - 600.0 <= 180.0, one
    both = out_at(replay(Trace([Life("a", slow_from_s=600.0), Life("b", slow_from_s=600.0)], 1000.0,
                               seed=seed), tmp_path, capsys))
    assert both == {}, both
