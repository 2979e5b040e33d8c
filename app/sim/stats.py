"""Healthy-node spread of the shipped LLM traces under the simulator's LLM model.

``python -m tailguard.sim.stats [--samples N] [--window 1000] [--seed S]`` draws
requests of one healthy node from each Azure trace (``conv``, ``code``) with
the default LLM parameters (TTFT = 50 ms + 0.25 ms × input tokens, TPOT =
30 ms, 5 % jitter; see :class:`~tailguard.sim.latency.LLM`) and prints, per trace:
the raw-latency P99/P50 over all samples, the median P99/P50 of
``window``-sample windows and the share of those windows above 3.0 (the
default ``ratio_threshold``), and the same P99/P50 for the per-token time signal
``(latency − ttft) / (output_tokens − 1)``. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tailguard.sim.latency import LLM, NodeLatency, node_rng
from tailguard.sim.scenario import TRACES, request_sizes


def spread(values: np.ndarray, window: int) -> dict[str, float]:
    """P99/P50 overall, and over consecutive ``window``-sample windows."""
    p50, p99 = np.percentile(values, [50, 99])
    n = values.shape[0] // window
    w = values[: n * window].reshape(n, window)
    wq = np.percentile(w, [50, 99], axis=1)
    ratios = wq[1] / wq[0]
    return {"p50": float(p50), "p99": float(p99), "ratio": float(p99 / p50),
            "window_ratio_median": float(np.median(ratios)), "windows_above_3": float(np.mean(ratios > 3.0))}


def measure(trace: str, *, samples: int, window: int, seed: int) -> dict[str, Any]:
    d = NodeLatency(LLM(request_sizes(trace))).sample(node_rng(seed, TRACES.index(trace)), np.zeros(samples))
    assert d.ttft_us is not None and d.output_tokens is not None
    tpot = (d.latency_us - d.ttft_us) / np.maximum(d.output_tokens - 1, 1)
    return {"trace": trace, "samples": samples, "window": window,
            "latency": spread(d.latency_us, window), "tpot": spread(tpot[d.output_tokens > 1], window)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tailguard.sim.stats", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=200_000, help="requests drawn per trace (default 200000)")
    p.add_argument("--window", type=int, default=1000, help="window size in samples (default 1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    a = p.parse_args(argv)
    if a.samples < a.window or a.window < 2:
        p.error("need --samples >= --window >= 2")
    rows = [measure(t, samples=a.samples, window=a.window, seed=a.seed) for t in TRACES]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"healthy node, {a.samples} requests per trace, windows of {a.window} (seed {a.seed})")
    print(f"{'trace':<6}{'signal':<9}{'P50':>12}{'P99':>12}{'P99/P50':>9}{'window P99/P50':>16}{'windows > 3.0':>15}")
    for r in rows:
        for sig, unit in (("latency", 1e3), ("tpot", 1e3)):
            s = r[sig]
            print(f"{r['trace']:<6}{sig:<9}{s['p50'] / unit:>10.1f}ms{s['p99'] / unit:>10.1f}ms{s['ratio']:>9.2f}"
                  f"{s['window_ratio_median']:>16.2f}{s['windows_above_3']:>14.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
