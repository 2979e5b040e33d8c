"""Milliseconds per tick of named functions inside the façade's tick at 10,000 series.

Run: ``python -m bench.time_stage2 [--nodes N] MODULE:NAME ...`` (``NAME`` a function, or
``Class.method``), e.g. ``tailguard.core.judge.peers:norms_of
tailguard.core.judge.evaluate:FleetEvaluator.evaluate``. Each function is wrapped with
``time.perf_counter`` wherever a ``tailguard`` module holds it; the tick is
:func:`bench.bench_core_stage2.bench_facade`'s (10,000 series x 1000 samples, ``N`` nodes per
model, the worker's collector policy). Prints the best of three rounds of ten ticks (after
three warm-up ticks): the whole tick and each function, wall-clock ms per tick (each wrapper
adds a little to every call). To compare builds, alternate runs of each in the same minutes
(``PYTHONPATH=<link to the other build>:.``, see bench.compare_tick) and compare ratios.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.bench_core_stage2 import steady_detector, worker_collector


def _timed(fn: Callable[..., Any], key: str, acc: dict[str, float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
    return wrapper


def _wrap(spec: str, acc: dict[str, float]) -> None:
    mod_name, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"time_stage2: {spec!r} is not MODULE:NAME (e.g. "
                         "tailguard.core.judge.peers:norms_of)")
    mod = importlib.import_module(mod_name)
    if "." in name:
        cls_name, meth = name.split(".", 1)
        cls = getattr(mod, cls_name)
        setattr(cls, meth, _timed(getattr(cls, meth), name, acc))
        return
    fn: Callable[..., Any] = getattr(mod, name)
    for m in list(sys.modules.values()):      # every module that imported it by name
        if (getattr(m, "__name__", "") or "").startswith("tailguard") and getattr(m, name, None) is fn:
            setattr(m, name, _timed(fn, name, acc))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100, help="nodes per model (default 100)")
    ap.add_argument("functions", nargs="*", help="MODULE:NAME or MODULE:Class.method")
    args = ap.parse_args(argv)
    acc: dict[str, float] = {}
    for spec in args.functions:
        _wrap(spec, acc)
    det, t_full, _raw = steady_detector(10_000, 1000, args.nodes)
    now = [t_full]

    def tick() -> None:
        now[0] += 0.001
        with worker_collector(det):
            det.evaluate(now[0], with_statuses=False)

    for _ in range(3):
        tick()
    best: dict[str, float] = {}
    for _ in range(3):
        acc.clear()
        t0 = time.perf_counter()
        for _ in range(10):
            tick()
        best["tick"] = min(best.get("tick", float("inf")), (time.perf_counter() - t0) / 10)
        for k, v in acc.items():
            best[k] = min(best.get(k, float("inf")), v / 10)
    for k, v in best.items():
        print(f"{k:40s} {v * 1e3:7.2f} ms per tick")


if __name__ == "__main__":
    main()
