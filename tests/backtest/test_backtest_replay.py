"""Backtest of ``tailguard replay`` against independently generated traces.

These traces do not come from ``tailguard.sim``: a small generator in this file draws
its own fleets (lognormal, bimodal and LLM latency = TTFT + TPOT x output
tokens with request sizes from the shipped Azure LLM trace, ``app/data``),
injects faults at onsets that are not aligned to ticks, and runs the real
command-line entry point (``tailguard.replay_cli.main``) on a file, the way a
user or an external evaluation does. Each test asserts the outcome a user
expects: which (node, model) pairs leave routing (a transition with
``routed: false``), how soon after onset, and that nothing else does.

Guarantees checked: a healthy fleet of any shape loses no node; a 3x (or 2.5x
per-token) degraded node is out of routing within 120 s of onset; a fleet-wide
peak removes nobody and is reported as a fleet event; a recovered node is
re-admitted; bad input lines are skipped and counted without changing the
verdict; file and ``--set`` errors give the documented exit codes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from tailguard.replay_cli import main

DATA_DIR = Path(__file__).resolve().parents[2] / "app" / "data"
T0 = 1_764_680_007.3          # not a multiple of any tick interval
DETECT_WITHIN_S = 120.0


@cache
def request_sizes(trace: str) -> np.ndarray:
    """(input_tokens, output_tokens) rows of the shipped Azure trace ``conv`` or ``code``."""
    with (DATA_DIR / f"AzureLLMInferenceTrace_{trace}.csv").open() as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    return np.array(rows, dtype=np.int64)


@dataclass(frozen=True)
class Fault:
    node: str
    onset_s: float                 # seconds after T0
    kind: str = "p50"              # p50 (all requests x factor) | tail (frac of requests x factor) | tpot
    factor: float = 3.0
    frac: float = 0.1
    end_s: float = math.inf
    model: str | None = None       # None: every model of the node


@dataclass(frozen=True)
class Model:
    name: str
    kind: str = "lognormal"        # lognormal | bimodal | llm
    median_us: float = 60_000.0
    sigma: float = 0.3
    trace: str = "conv"
    tpot_us: float = 25_000.0
    tokens: bool = True            # LLM events carry input/output tokens
    ttft: bool = True              # ... and ttft_us


@dataclass(frozen=True)
class Fleet:
    nodes: int
    models: tuple[Model, ...]
    rate: float = 20.0             # requests/s per node and model
    duration_s: float = 600.0
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    hardware: dict[str, str] = field(default_factory=dict)   # node -> class
    class_speed: dict[str, float] = field(default_factory=dict)  # class -> latency multiplier
    peak: tuple[float, float, float] | None = None            # (start_s, end_s, factor) for all nodes
    active: dict[str, tuple[float, float]] = field(default_factory=dict)   # regular traffic window
    probes: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # (start, end, rate)
    batch: int = 0                 # > 0: batch form with this many samples per line

    def node_ids(self) -> list[str]:
        return [f"gpu-{i:02d}" for i in range(self.nodes)]


def _latency(fl: Fleet, m: Model, node: str, t: np.ndarray, rng: np.random.Generator) -> tuple[
        np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    n = len(t)
    mult = np.full(n, fl.class_speed.get(fl.hardware.get(node, ""), 1.0))
    tpot_mult = np.ones(n)
    for f in fl.faults:
        if f.node != node or f.model not in (None, m.name):
            continue
        on = (t >= f.onset_s) & (t < f.end_s)
        if f.kind == "p50":
            mult[on] *= f.factor
        elif f.kind == "tail":
            mult[on & (rng.random(n) < f.frac)] *= f.factor
        else:
            tpot_mult[on] *= f.factor
    if fl.peak is not None:
        mult[(t >= fl.peak[0]) & (t < fl.peak[1])] *= fl.peak[2]
    if m.kind == "lognormal":
        return m.median_us * np.exp(rng.normal(0, m.sigma, n)) * mult, None, None, None
    if m.kind == "bimodal":
        slow = np.where(rng.random(n) < 0.15, 5.0, 1.0)
        return m.median_us * slow * np.exp(rng.normal(0, m.sigma, n)) * mult, None, None, None
    sizes = request_sizes(m.trace)[rng.integers(0, len(request_sizes(m.trace)), n)]
    itok, otok = sizes[:, 0], np.maximum(sizes[:, 1], 1)
    ttft = (40_000.0 + 15.0 * itok) * np.exp(rng.normal(0, 0.08, n)) * mult
    tpot = m.tpot_us * np.exp(rng.normal(0, 0.08, n)) * tpot_mult * mult
    return ttft + tpot * (otok - 1), itok, otok, ttft


def trace_lines(fl: Fleet) -> list[str]:
    """The fleet's events as JSON lines, in event-time order."""
    rng = np.random.default_rng(fl.seed)
    recs: list[tuple[float, str]] = []
    for node in fl.node_ids():
        for m in fl.models:
            a, b = fl.active.get(node, (0.0, fl.duration_s))
            t = rng.uniform(a, b, rng.poisson(fl.rate * (b - a)))
            probe = np.zeros(len(t), dtype=bool)
            if node in fl.probes:
                pa, pb, pr = fl.probes[node]
                tp = rng.uniform(pa, pb, rng.poisson(pr * (pb - pa)))
                t, probe = np.concatenate([t, tp]), np.concatenate([probe, np.ones(len(tp), dtype=bool)])
            order = np.argsort(t, kind="stable")
            t, probe = t[order], probe[order]
            lat, itok, otok, ttft = _latency(fl, m, node, t, rng)
            head: dict[str, object] = {"node_id": node, "model": m.name}
            if node in fl.hardware:
                head["hardware"] = fl.hardware[node]
            sized = itok is not None and otok is not None and ttft is not None and m.tokens
            if fl.batch:
                for s in range(0, len(t), fl.batch):
                    rows: list[list[object]] = []
                    for i in range(s, min(len(t), s + fl.batch)):
                        row: list[object] = [T0 + float(t[i]), round(float(lat[i]), 1)]
                        if sized:
                            assert itok is not None and otok is not None and ttft is not None
                            row += [int(itok[i]), int(otok[i]), round(float(ttft[i]), 1) if m.ttft else None]
                        rows.append(row)
                    recs.append((T0 + float(t[min(len(t), s + fl.batch) - 1]), json.dumps({**head, "samples": rows})))
                continue
            for i in range(len(t)):
                ev: dict[str, object] = {**head, "latency_us": round(float(lat[i]), 1), "ts": T0 + float(t[i])}
                if sized:
                    assert itok is not None and otok is not None and ttft is not None
                    ev["input_tokens"], ev["output_tokens"] = int(itok[i]), int(otok[i])
                    if m.ttft:
                        ev["ttft_us"] = round(float(ttft[i]), 1)
                if probe[i]:
                    ev["probe"] = True
                recs.append((T0 + float(t[i]), json.dumps(ev)))
    recs.sort(key=lambda r: r[0])
    return [r[1] for r in recs]


@dataclass
class Replayed:
    code: int
    records: list[dict[str, object]]
    stderr: str

    def removed(self) -> dict[tuple[str, str], float]:
        """(node, model) -> event time of its first transition out of routing (a new node
        awaiting admission, ``warming`` and not routed, was never in it)."""
        out: dict[tuple[str, str], float] = {}
        for r in self.records:
            if (r.get("type", "transition") == "transition" and r["routed"] is False
                    and r["to"] != "warming"):
                out.setdefault((str(r["node_id"]), str(r["model"])), float(r["ts"]))  # type: ignore[arg-type]
        return out

    def readmitted_after(self, key: tuple[str, str], ts: float) -> bool:
        return any(r.get("type", "transition") == "transition" and r["routed"] is True
                   and (r["node_id"], r["model"]) == key and float(r["ts"]) > ts  # type: ignore[arg-type]
                   for r in self.records)

    def fleet_kinds(self) -> list[str]:
        return [str(r["kind"]) for r in self.records if r.get("type") == "fleet"]


def replay_file(path: Path | str, capsys: pytest.CaptureFixture[str], *sets: str) -> Replayed:
    argv = [x for s in sets for x in ("--set", s)] + [str(path)]
    capsys.readouterr()
    code = main(argv)
    cap = capsys.readouterr()
    return Replayed(code, [json.loads(x) for x in cap.out.splitlines() if x.strip()], cap.err)


def replay_lines(lines: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], *sets: str,
                 newline: str = "\n") -> Replayed:
    path = tmp_path / "trace.jsonl"
    path.write_bytes("".join(x + newline for x in lines).encode())
    return replay_file(path, capsys, *sets)


def assert_outcome(res: Replayed, expected: dict[tuple[str, str], float]) -> None:
    """Exactly the ``expected`` pairs leave routing, each within 120 s of its onset (s after T0)."""
    assert res.code == 0, res.stderr
    removed = res.removed()
    assert set(removed) == set(expected), f"removed {removed}, expected {expected}; {res.stderr}"
    for key, onset_s in expected.items():
        lag = removed[key] - (T0 + onset_s)
        assert 0 <= lag <= DETECT_WITHIN_S, f"{key} removed {lag:.1f} s after onset"
    # No false down-weighting: a node without a fault keeps a routing weight of at least 0.95.
    low = {(str(r["node_id"]), str(r["model"])): r["weight"] for r in res.records
           if r.get("type") == "weight" and float(r["weight"]) < 0.95}  # type: ignore[arg-type]
    assert set(low) <= set(expected), f"weighted down without a fault: {low}"


CONV = Model("llama-3-70b", "llm", trace="conv")
CODE = Model("codellama-34b", "llm", trace="code", tpot_us=18_000.0)
MIXED = {f"gpu-{i:02d}": ("A100" if i % 2 else "A10") for i in range(10)}


@pytest.mark.parametrize("fleet", [
    pytest.param(Fleet(3, (Model("resnet", sigma=0.5),), rate=30, seed=1), id="lognormal-s0.5-3n"),
    pytest.param(Fleet(12, (Model("resnet", sigma=0.6),), rate=10, seed=2), id="lognormal-s0.6-12n"),
    pytest.param(Fleet(8, (Model("mix", "bimodal", 30_000.0),), rate=20, seed=3), id="bimodal-8n"),
    pytest.param(Fleet(8, (CONV,), seed=4), id="conv-tokens-ttft"),
    pytest.param(Fleet(8, (Model("llama-3-70b", "llm", tokens=False),), seed=5), id="conv-no-tokens"),
    pytest.param(Fleet(8, (Model("llama-3-70b", "llm", ttft=False),), seed=6), id="conv-tokens-no-ttft"),
    pytest.param(Fleet(8, (CODE,), seed=7), id="code-tokens-ttft"),
    pytest.param(Fleet(8, (Model("codellama-34b", "llm", trace="code", tokens=False),), seed=8), id="code-no-tokens"),
    pytest.param(Fleet(10, (Model("llama-3-70b", "llm", tokens=False),), seed=9, hardware=MIXED,
                       class_speed={"A10": 2.5}), id="mixed-A100-A10-conv-no-tokens"),
    pytest.param(Fleet(6, (Model("embed", median_us=5_000.0), Model("llama-3-70b", "llm", tokens=False)), seed=10),
                 id="multi-model-embed-and-llm"),
    pytest.param(Fleet(20, (CONV,), rate=40, seed=11, batch=50), id="conv-batch-form-20n"),
])
def test_healthy_fleet_loses_no_node(fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_outcome(replay_lines(trace_lines(fleet), tmp_path, capsys), {})


@pytest.mark.parametrize(("fleet", "expected"), [
    pytest.param(Fleet(10, (Model("resnet"),), seed=21, faults=(Fault("gpu-03", 317.3),)),
                 {("gpu-03", "resnet"): 317.3}, id="p50-3x"),
    pytest.param(Fleet(10, (Model("resnet"),), seed=22, faults=(Fault("gpu-07", 401.7, "tail", 10.0),)),
                 {("gpu-07", "resnet"): 401.7}, id="tail-10pct-10x"),
    pytest.param(Fleet(8, (CONV,), seed=23, faults=(Fault("gpu-02", 333.3, "tpot", 2.5),)),
                 {("gpu-02", "llama-3-70b"): 333.3}, id="conv-tpot-2.5x-tokens-ttft"),
    pytest.param(Fleet(8, (Model("llama-3-70b", "llm", tokens=False),), seed=24,
                       faults=(Fault("gpu-05", 291.1, "tpot", 2.5),)),
                 {("gpu-05", "llama-3-70b"): 291.1}, id="conv-tpot-2.5x-no-tokens"),
    pytest.param(Fleet(8, (Model("llama-3-70b", "llm", ttft=False),), seed=25,
                       faults=(Fault("gpu-06", 355.5, "tpot", 2.5),)),
                 {("gpu-06", "llama-3-70b"): 355.5}, id="conv-tpot-2.5x-tokens-no-ttft"),
    pytest.param(Fleet(8, (Model("codellama-34b", "llm", trace="code", tokens=False),), rate=25, seed=26,
                       faults=(Fault("gpu-01", 312.9, "tpot", 2.5),)),
                 {("gpu-01", "codellama-34b"): 312.9}, id="code-tpot-2.5x-no-tokens"),
    pytest.param(Fleet(10, (Model("resnet"),), seed=27, hardware=MIXED, class_speed={"A10": 2.2},
                       faults=(Fault("gpu-04", 301.0, factor=2.5),)),
                 {("gpu-04", "resnet"): 301.0}, id="A10-node-2.5x-its-class"),
    pytest.param(Fleet(6, (Model("embed", median_us=5_000.0), Model("llama-3-70b", "llm", tokens=False)), seed=28,
                       faults=(Fault("gpu-03", 325.5, "tpot", 3.0, model="llama-3-70b"),)),
                 {("gpu-03", "llama-3-70b"): 325.5}, id="multi-model-only-llm-degrades"),
    pytest.param(Fleet(3, (Model("resnet"),), rate=50, seed=29, faults=(Fault("gpu-00", 300.9),)),
                 {("gpu-00", "resnet"): 300.9}, id="three-nodes-p50-3x"),
    pytest.param(Fleet(6, (Model("resnet"),), rate=30, seed=30,
                       faults=(Fault("gpu-01", 333.0), Fault("gpu-02", 333.0))),
                 {("gpu-01", "resnet"): 333.0, ("gpu-02", "resnet"): 333.0}, id="two-of-six-together"),
])
def test_degraded_node_leaves_routing_within_120s(fleet: Fleet, expected: dict[tuple[str, str], float],
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_outcome(replay_lines(trace_lines(fleet), tmp_path, capsys), expected)


def test_degraded_node_detected_with_tick_override_and_batch_form(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = Fleet(5, (Model("resnet"),), rate=200, seed=31, batch=100, faults=(Fault("gpu-02", 250.5),))
    res = replay_lines(trace_lines(fleet), tmp_path, capsys, "tick_interval_s=10")
    assert_outcome(res, {("gpu-02", "resnet"): 250.5})
    assert all(float(r["ts"]) % 10 == 0 for r in res.records)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", [Model("resnet"), Model("llama-3-70b", "llm", tokens=False), CONV],
                         ids=["lognormal", "conv-no-tokens", "conv-tokens"])
def test_fleet_wide_peak_removes_nobody_and_is_reported(model: Model, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    fleet = Fleet(8, (model,), seed=41, peak=(401.0, 521.0, 3.0))
    res = replay_lines(trace_lines(fleet), tmp_path, capsys)
    assert_outcome(res, {})
    assert "load_event" in res.fleet_kinds() or "baseline_shift" in res.fleet_kinds(), res.records



@pytest.mark.parametrize("seed", [42, 43, 44])
def test_fleet_wide_doubling_removes_nobody_and_is_reported(
        seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # every node 2x slower for 3 minutes: a doubling of the fleet's P50 must be reported, but
    # measured against the slow baseline (which has already taken in the onset tick) it sits
    # just under 2.0, so a 2.0 shift threshold missed it in most runs
    fleet = Fleet(8, (Model("resnet"),), seed=seed, rate=30.0, duration_s=900, peak=(401.0, 581.0, 2.0))
    res = replay_lines(trace_lines(fleet), tmp_path, capsys)
    assert_outcome(res, {})
    assert "load_event" in res.fleet_kinds() or "baseline_shift" in res.fleet_kinds(), res.records

def test_recovered_node_is_readmitted_on_probe_traffic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the LB stops sending regular traffic soon after removal; only probes (2/s) reach the node
    fleet = Fleet(6, (Model("resnet"),), seed=51, duration_s=1500, active={"gpu-04": (0.0, 420.0)},
                  probes={"gpu-04": (420.0, 1500.0, 2.0)}, faults=(Fault("gpu-04", 310.0, end_s=610.0),))
    res = replay_lines(trace_lines(fleet), tmp_path, capsys)
    assert_outcome(res, {("gpu-04", "resnet"): 310.0})
    assert res.readmitted_after(("gpu-04", "resnet"), res.removed()[("gpu-04", "resnet")])



def readmitted_at(res: Replayed, key: tuple[str, str], after: float) -> float | None:
    return next((float(r["ts"]) for r in res.records  # type: ignore[arg-type]
                 if r.get("type", "transition") == "transition" and r["routed"] is True
                 and (r["node_id"], r["model"]) == key and float(r["ts"]) > after), None)  # type: ignore[arg-type]


@pytest.mark.parametrize("probe_rate", [1.0, 2.0])
def test_probe_only_node_is_readmitted_soon_after_it_recovers(
        probe_rate: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Only probes reach the removed node; it is slow until 550 s. Each probe round must be
    # judged on its own probes: probes from before the round (sent while the node was still
    # slow) once failed every round that had no probe of its own yet, at the tick it began,
    # and the doubling back-off held a recovered node out for 300-550 s more.
    fleet = Fleet(6, (Model("resnet"),), seed=53, duration_s=1200, active={"gpu-02": (0.0, 400.0)},
                  probes={"gpu-02": (400.0, 1200.0, probe_rate)},
                  faults=(Fault("gpu-02", 310.0, end_s=550.0),))
    res = replay_lines(trace_lines(fleet), tmp_path, capsys)
    assert_outcome(res, {("gpu-02", "resnet"): 310.0})
    back = readmitted_at(res, ("gpu-02", "resnet"), 550.0 + T0)
    # rounds fail while it is slow (back-off 30, 60, 120 s), the first round after 550 s passes
    assert back is not None and back - (550.0 + T0) <= 180.0, res.records

def _fault_fleet() -> Fleet:
    return Fleet(6, (Model("resnet"),), seed=61, faults=(Fault("gpu-05", 305.5),))


BAD_LINES = [
    "{not json", '"a string"', "[1, 2]", "null",
    '{"model": "resnet", "latency_us": 1000, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": 1000}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": -5, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": 0, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": NaN, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": 1e30, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": "1000", "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": 1000, "ts": "1764680100"}',
    '{"node_id": "", "model": "resnet", "latency_us": 1000, "ts": 1764680100.0}',
    '{"node_id": 7, "model": "resnet", "latency_us": 1000, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": true, "ts": 1764680100.0}',
    '{"node_id": "gpu-00", "model": "resnet", "latency_us": 1000, "ts": -1}',
    '{"type": "mystery", "node_id": "gpu-00"}',
    '{"node_id": "gpu-00", "model": "resnet", "samples": "nope"}',
]


def test_bad_lines_are_counted_and_do_not_change_the_verdict(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    lines = trace_lines(_fault_fleet())
    rng = np.random.default_rng(62)
    mixed = list(lines)
    for bad in BAD_LINES:
        mixed.insert(int(rng.integers(0, len(mixed))), bad)
    # unknown extra fields are accepted
    extra = json.loads(lines[len(lines) // 2]) | {"request_id": "r-1", "region": "eu", "meta": {"a": 1}}
    mixed.insert(len(mixed) // 2, json.dumps(extra))
    res = replay_lines(mixed, tmp_path, capsys)
    assert_outcome(res, {("gpu-05", "resnet"): 305.5})
    assert f"{len(BAD_LINES)} bad lines skipped" in res.stderr
    assert res.records == replay_lines(lines, tmp_path, capsys).records


def test_crlf_out_of_order_and_duplicates_give_the_same_verdict(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    lines = trace_lines(_fault_fleet())
    expected = {("gpu-05", "resnet"): 305.5}
    assert_outcome(replay_lines(lines, tmp_path, capsys, newline="\r\n"), expected)
    rng = np.random.default_rng(63)
    jittered = [lines[i] for i in np.argsort(np.arange(len(lines)) + rng.normal(0, 10, len(lines)))]
    assert jittered != lines
    assert_outcome(replay_lines(jittered, tmp_path, capsys), expected)
    healthy = trace_lines(Fleet(6, (Model("resnet"),), seed=64))
    assert_outcome(replay_lines([x for line in healthy for x in (line, line)], tmp_path, capsys), {})


def test_heartbeats_failed_and_probe_requests_do_not_remove_a_healthy_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = trace_lines(Fleet(6, (Model("resnet"),), seed=65))
    rng = np.random.default_rng(66)
    out = []
    for i, line in enumerate(lines):
        ev = json.loads(line)
        if rng.random() < 0.05:                 # failed requests are often very slow (timeouts)
            ev |= {"ok": False, "latency_us": ev["latency_us"] * 50}
        out.append(json.dumps(ev))
        if i % 500 == 0:
            out.append(json.dumps({"type": "heartbeat", "node_id": ev["node_id"], "model": "resnet",
                                   "ts": ev["ts"]}))
    res = replay_lines(out, tmp_path, capsys)
    assert_outcome(res, {})
    assert "0 bad lines skipped" in res.stderr


def test_empty_file_and_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    empty = replay_lines([], tmp_path, capsys)
    assert (empty.code, empty.records) == (0, [])
    data = "".join(x + "\n" for x in trace_lines(_fault_fleet())).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert_outcome(replay_file("-", capsys), {("gpu-05", "resnet"): 305.5})


def test_unreadable_file_exits_1_and_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-trace.jsonl"
    res = replay_file(missing, capsys)
    assert res.code == 1 and "no-such-trace.jsonl" in res.stderr and res.records == []
    res = replay_file(tmp_path, capsys)
    assert res.code == 1 and str(tmp_path) in res.stderr


@pytest.mark.parametrize(("override", "named"), [
    ("nope=1", "nope"), ("tick_interval_s=abc", "tick_interval_s"), ("tick_interval_s=0", "tick_interval_s"),
    ("window_size=1.5", "window_size"), ("min_samples=5000", "min_samples"), ("tick_interval_s", "KEY=VALUE"),
    ("signal=bogus", "signal"), ("ratio_threshold=nan", "ratio_threshold"),
    ("max_ejected_fraction=2", "max_ejected_fraction"),
])
def test_bad_set_exits_2_and_names_the_setting(override: str, named: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    res = replay_lines([], tmp_path, capsys, override)
    assert res.code == 2 and named in res.stderr and "Traceback" not in res.stderr
