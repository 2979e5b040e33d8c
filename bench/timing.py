"""Shared helpers of the benchmarks: CPU-time measurement and aligned output.

``best`` measures this process's CPU time (``time.process_time``), the best of
``repeat`` runs: the benchmarked code is single-threaded, and CPU time is less
disturbed than wall-clock time by other work on a shared machine.
``best_alternating`` does the same for a function and its baseline called in
turn, so that load which comes and goes weighs on both.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    """Least CPU seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def best_alternating(fns: dict[str, Callable[[], object]], rounds: int = 5) -> dict[str, float]:
    """Least CPU seconds of each of ``fns`` over ``rounds`` rounds that call them in turn:
    a shared machine's load then weighs on a function and its baseline alike."""
    out = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name] = min(out[name], best(fn, 1))
    return out


def row(label: str, value: str, note: str = "", *, width: int = 52) -> None:
    """Print one result line: label, right-aligned value, optional note."""
    print(f"  {label:<{width}} {value:>16}  {note}")
