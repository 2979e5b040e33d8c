"""Shared helpers of the benchmarks: CPU-time measurement and aligned output.

``best`` measures this process's CPU time (``time.process_time``), the best of
``repeat`` runs: the benchmarked code is single-threaded, and CPU time is less
disturbed than wall-clock time by other work on a shared machine.
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


def row(label: str, value: str, note: str = "", *, width: int = 52) -> None:
    """Print one result line: label, right-aligned value, optional note."""
    print(f"  {label:<{width}} {value:>16}  {note}")
