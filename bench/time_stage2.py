"""Milliseconds per tick of named functions inside the façade's tick at 10,000 series.

Run: ``python -m bench.time_stage2 [--nodes N] [--feed K] MODULE:NAME ...`` (``NAME`` a function, or
``Class.method``), e.g. ``tailguard.core.judge.peers:norms_of
tailguard.core.judge.evaluate:FleetEvaluator.evaluate``. Each function is wrapped with
``time.perf_counter`` wherever a ``tailguard`` module holds it; the tick is
:func:`bench.bench_core_stage2.bench_facade`'s (10,000 series x 1000 samples, ``N`` nodes per
model, the worker's collector policy). Prints the best of three rounds of ten ticks (after
three warm-up ticks): the whole tick and each function, wall-clock ms per tick (each wrapper
adds a little to every call). ``--feed K``: before every tick each series gets ``K`` new
samples over the 30 s before it (a worker's load at ``K / 30`` req/s a series: ``K`` of every
ring's 1000 slots written a tick), fed outside the timed tick. To compare builds, alternate
runs of each in the same minutes
(``PYTHONPATH=<link to the other build>:.``, see bench.compare_tick) and compare ratios.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.bench_core_stage2 import steady_detector, worker_collector
from tailguard.core.contract.events import SampleBatch


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
    ap.add_argument("--feed", type=int, default=0,
                    help="new samples per series before every tick, over 30 s (default 0)")
    ap.add_argument("functions", nargs="*", help="MODULE:NAME or MODULE:Class.method")
    args = ap.parse_args(argv)
    acc: dict[str, float] = {}
    for spec in args.functions:
        _wrap(spec, acc)
    det, t_full, _raw = steady_detector(10_000, 1000, args.nodes)
    now = [t_full]
    rng = np.random.default_rng(5)
    keys = list(det.store.keys())
    feed = args.feed
    ok, probe = np.ones(feed, bool), np.zeros(feed, bool)

    def tick() -> float:
        """One tick (after feeding, if asked); its wall-clock seconds."""
        if feed:
            ts = now[0] + np.sort(rng.uniform(0.0, 30.0, feed))
            lat = 1e5 * np.exp(rng.normal(0, 0.3, (len(keys), feed)))
            before = dict(acc)          # a timed function the feeding calls counts the tick only
            det.observe([SampleBatch(node, model, "A100", ts, lat[i], ok, probe)
                         for i, (node, model) in enumerate(keys)])
            acc.clear()
            acc.update(before)
            now[0] += 30.0
        else:
            now[0] += 0.001
        t0 = time.perf_counter()
        with worker_collector(det):
            det.evaluate(now[0], with_statuses=False)
        return time.perf_counter() - t0

    for _ in range(3):
        tick()
    best: dict[str, float] = {}
    for _ in range(3):
        acc.clear()
        spent = sum(tick() for _ in range(10))
        best["tick"] = min(best.get("tick", float("inf")), spent / 10)
        for k, v in acc.items():
            best[k] = min(best.get(k, float("inf")), v / 10)
    for k, v in best.items():
        print(f"{k:40s} {v * 1e3:7.2f} ms per tick")


if __name__ == "__main__":
    main()
