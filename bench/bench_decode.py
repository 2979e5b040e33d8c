"""CPU cost of decoding each event form through ``Accumulator`` (the worker's and replay's path).

Run: ``python -m bench.bench_decode``. 200 series of one model with realistic ids
(``gpu-node-007``, ``meta-llama/Llama-3.1-8B-Instruct``): JSON batches and binary
batches of 100 samples, and single events; ``Accumulator.add`` of every message and one
``drain``, best of 7 (CPU time, :mod:`bench.timing`). Prints µs per message. Run it on
two checkouts (``PYTHONPATH=<checkout>``) to compare decoder changes, e.g. the id rule.
"""

from __future__ import annotations

import numpy as np
import orjson

from bench.timing import best, row
from tailguard.core.contract import binary
from tailguard.core.window.accumulate import Accumulator

T = 1_764_680_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def main() -> None:
    rng = np.random.default_rng(1)
    nodes = [f"gpu-node-{i:03d}" for i in range(200)]
    forms = {
        "JSON batch, 100 samples": [orjson.dumps({"node_id": n, "model": MODEL, "samples": [
            [T, float(x)] for x in rng.uniform(1e3, 2e3, 100)]}) for n in nodes],
        "binary batch, 100 samples": [binary.encode(n, MODEL, None, np.full(100, T),
                                                    rng.uniform(1e3, 2e3, 100)) for n in nodes],
        "single event": [orjson.dumps({"node_id": n, "model": MODEL, "latency_us": 1000.0 + i,
                                       "ts": T}) for i in range(25) for n in nodes],
    }
    print("Accumulator.add + drain, 200 series (best of 7, CPU time)")
    for label, msgs in forms.items():
        def run(msgs: list[bytes] = msgs) -> None:
            for _ in range(5):
                acc = Accumulator(now_s=T + 10)
                for m in msgs:
                    acc.add(m)
                acc.drain()
        row(label, f"{best(run, 7) / (5 * len(msgs)) * 1e6:.2f} µs/msg")


if __name__ == "__main__":
    main()
