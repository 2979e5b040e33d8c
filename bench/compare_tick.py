"""Does this build decide exactly as another one? A random fleet, tick by tick, on both.

Run: ``python -m bench.compare_tick --base PATH`` where ``PATH`` is a checkout of the
build to compare against (e.g. ``git worktree add --detach /tmp/base main``). The
script runs itself once under ``PATH`` (a ``tailguard`` symlink to ``PATH/app`` first on
``PYTHONPATH``, so ``tailguard`` is that build's) and once here, on the same generated
fleet, and compares, tick by tick: every summary of stage 1 (``WindowStore.summaries``), every tick result of the façade
(``Detector.evaluate``: transitions, routing, quarantine, fleet events, diagnostics,
statuses, cluster P50/P99) and, at the end, the whole detector snapshot (stage 2's
state: baselines, rates, streaks). Exit status 1 and the first difference when they
differ; ``--record FILE`` only writes this build's record (what the base run does).

The fleet (``--series``, default 3,000 (node, model) pairs over models of 1 to 150
nodes, one or two hardware classes, some with request sizes) is drawn from ``--seed``:
nodes at rates from 3 to 1,500 samples per tick, some slowing down (P50 or tail),
failing requests, falling silent, coming back, sending only probes while ejected,
and whole models slowing at once (load events). Floats are compared by ``repr``:
identical means bit-identical.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.replay.detector import Detector

T0 = 1_764_680_000.0
TICK_S = 30.0


@dataclasses.dataclass
class _Node:
    node: str
    model: str
    hardware: str
    rate: int             # samples per tick
    p50_us: float
    sigma: float
    slow_at: int          # tick it degrades from (-1: never)
    slow_kind: str        # "p50", "tail", "errors"
    factor: float
    silent: tuple[int, int]
    sized: bool


def fleet(series: int, seed: int) -> list[_Node]:
    rng = np.random.default_rng(seed)
    nodes: list[_Node] = []
    m = 0
    while len(nodes) < series:
        size = int(rng.choice([1, 2, 3, 4, 6, 12, 40, 100, 150]))
        size = min(size, series - len(nodes))
        base = float(rng.choice([5e3, 8e4, 1.5e6]))
        sigma = float(rng.choice([0.2, 0.4, 0.9]))        # 0.9: heavy-tailed (shift rule)
        two_classes = rng.uniform() < 0.3
        sized = rng.uniform() < 0.2
        load_at = int(rng.integers(12, 30)) if rng.uniform() < 0.1 else -1
        for i in range(size):
            hw = "H100" if two_classes and rng.uniform() < 0.25 else "A100"
            kind = str(rng.choice(["p50", "tail", "errors"]))
            slow_at = load_at if load_at >= 0 else (
                int(rng.integers(6, 36)) if rng.uniform() < 0.08 else -1)
            silent = ((int(rng.integers(8, 30)),) * 2 if rng.uniform() > 0.03 else
                      (s := int(rng.integers(8, 30)), s + int(rng.integers(2, 12))))
            nodes.append(_Node(
                f"gpu-{i:03d}", f"model-{m}", hw,
                int(rng.choice([3, 8, 40, 100, 400, 1500])),
                base * (1.3 if hw == "H100" else 1.0) * float(np.exp(rng.normal(0, 0.05))),
                sigma, slow_at, kind, float(rng.choice([1.6, 2.5, 4.0])), silent, sized))
        m += 1
    return nodes


def batch(n: _Node, k: int, rng: np.random.Generator, probe_only: bool) -> SampleBatch:
    size = max(1, int(rng.poisson(n.rate)))
    if probe_only:
        size = max(1, min(size, 30))
    hi = T0 + k * TICK_S
    ts = np.sort(rng.uniform(hi - TICK_S, hi, size))
    ts[rng.uniform(size=size) < 0.02] -= 5.0            # a few late arrivals
    lat = n.p50_us * np.exp(rng.normal(0, n.sigma, size))
    ok = rng.uniform(size=size) > 0.01
    if n.slow_at >= 0 and k >= n.slow_at:
        if n.slow_kind == "p50":
            lat *= n.factor
        elif n.slow_kind == "tail":
            tail = rng.uniform(size=size) < 0.06
            lat[tail] *= 6.0 * n.factor
        else:
            ok &= rng.uniform(size=size) > 0.3
    probe = np.full(size, probe_only)
    inp = out = ttft = None
    if n.sized:
        out = rng.integers(1, 400, size).astype(np.float64)
        inp = rng.integers(10, 2000, size).astype(np.float64)
        ttft = lat * 0.2
        lat = ttft + out * (lat / 200.0)
    return SampleBatch(n.node, n.model, n.hardware, ts, lat, ok, probe, inp, out, ttft)


def run(series: int, seed: int, ticks: int) -> list[str]:
    """The record: one line per summary, per model tick, and the final snapshot."""
    rng = np.random.default_rng(seed + 1)
    nodes = fleet(series, seed)
    det = Detector(DetectorSettings())
    lines: list[str] = []
    for k in range(1, ticks + 1):
        now = T0 + k * TICK_S
        routed = det.routing()
        for n in nodes:
            if n.silent[0] <= k < n.silent[1]:
                continue
            out_of_routing = n.model in routed and n.node not in routed[n.model]
            if k % 7 == 0 and rng.uniform() < 0.05:
                det.observe([Heartbeat(n.node, n.model, n.hardware, now - 1.0)])
                continue
            det.observe([batch(n, k, rng, probe_only=out_of_routing and rng.uniform() < 0.7)])
        ev = det.evaluator
        for s in det.store.summaries(now, ev.judge_since_all(now), out_of_fit=ev.out_of_fit_all(),
                                     tail_refs=ev.tail_refs()):
            lines.append(f"{k} summary {s!r}")
        result = det.evaluate(now)
        for t in result.models:     # sets in a stable order (string hashes vary by process)
            t = dataclasses.replace(t, routing=tuple(sorted(t.routing)),  # type: ignore[arg-type]
                                    quarantine=dict(sorted(t.quarantine.items())))
            lines.append(f"{k} tick {t!r}")
    lines.append(f"snapshot {json.dumps(det.snapshot(), sort_keys=True)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--base", help="checkout of the build to compare against")
    ap.add_argument("--record", help="only write this build's record to this file")
    ap.add_argument("--series", type=int, default=3000)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.record:
        import tailguard
        print(f"recording the build at {os.path.dirname(os.path.dirname(tailguard.__file__))}",
              file=sys.stderr)
        with open(args.record, "w") as f:
            f.write("\n".join(run(args.series, args.seed, args.ticks)) + "\n")
        return 0
    if not args.base:
        ap.error("--base PATH or --record FILE is required")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "base.txt")
        # The import package is `tailguard`, its source PATH/app: a symlink puts it first on the path.
        os.symlink(os.path.join(os.path.abspath(args.base), "app"), os.path.join(tmp, "tailguard"))
        env = {**os.environ, "PYTHONPATH": tmp}
        subprocess.run([sys.executable, os.path.abspath(__file__), "--record", path,
                        "--series", str(args.series), "--ticks", str(args.ticks),
                        "--seed", str(args.seed)],
                       env=env, cwd=os.path.abspath(args.base), check=True)
        with open(path) as f:
            base = f.read().splitlines()
    here = run(args.series, args.seed, args.ticks)
    digest = hashlib.sha256("\n".join(here).encode()).hexdigest()[:16]
    kinds = _count(here)
    for i, (a, b) in enumerate(zip(base, here, strict=False)):
        if a != b:
            print(f"DIFFERENT at record line {i}:\n  base: {a[:2000]}\n  here: {b[:2000]}")
            return 1
    if len(base) != len(here):
        print(f"DIFFERENT: base has {len(base)} record lines, here {len(here)}")
        return 1
    print(f"identical: {len(here)} record lines ({kinds}), sha256 {digest}")
    return 0


def _count(lines: list[str]) -> dict[str, Any]:
    out: dict[str, int] = {"summaries": 0, "model ticks": 0, "transitions": 0}
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) > 1 and parts[1] == "summary":
            out["summaries"] += 1
        elif len(parts) > 1 and parts[1] == "tick":
            out["model ticks"] += 1
            out["transitions"] += line.count("Transition(")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
