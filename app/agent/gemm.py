"""``python -m tailguard.agent.gemm``: a fixed half-precision GEMM, timed on each GPU.

Prints one JSON line: ``{"tflops": {"0": 231.4, …}, "size": N, "iters": K,
"devices": {"0": "NVIDIA A100-SXM4-80GB"}}``, or ``{"skip": "why"}`` when
torch is not importable or sees no CUDA device (exit code 0 either way; a
crash exits non-zero). The agent runs it in a subprocess with a timeout, so
a CUDA hang or a slow import never stalls the agent, and torch is never
imported into the agent's own process. A replacement program (config
``gemm.command``) must print the same JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tailguard.agent.gemm")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--gpus", default="", help="comma-separated CUDA device indices (default all)")
    args = p.parse_args(argv)
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        print(json.dumps({"skip": f"torch is not importable ({e})"}))
        return 0
    t: Any = torch
    if not t.cuda.is_available():
        print(json.dumps({"skip": "torch sees no CUDA device"}))
        return 0
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()] or list(range(t.cuda.device_count()))
    n, iters = args.size, args.iters
    tflops, names = {}, {}
    for g in gpus:
        dev = t.device(f"cuda:{g}")
        a = t.randn(n, n, device=dev, dtype=t.float16)
        b = t.randn(n, n, device=dev, dtype=t.float16)
        for _ in range(3):
            a @ b
        t.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        t.cuda.synchronize(dev)
        took = time.perf_counter() - t0
        tflops[str(g)] = round(2.0 * n ** 3 * iters / took / 1e12, 2)
        names[str(g)] = t.cuda.get_device_name(dev)
        del a, b
    print(json.dumps({"tflops": tflops, "size": n, "iters": iters, "devices": names}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
