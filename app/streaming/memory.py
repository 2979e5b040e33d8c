"""Giving memory back to the system after a flood's series are forgotten.

A flood of node ids leaves, once its series are forgotten, freed memory that the
process keeps: cyclic garbage (a window's series and its slab refer to each other)
until the collector's next full pass, and freed heap blocks that glibc keeps for
reuse (also those of large numpy arrays, once its mmap threshold has grown).
:func:`give_back` collects and trims, so the worker's RSS returns to about its
pre-flood level (docs/operating.md, "Floods"). Stage 1 and stage 2 call it after
they dropped at least :data:`GIVE_BACK_MIN` series or pairs at once and compacted
their own maps, and stage 1 once a flood it refused (at least as many messages a tick) is
over (:func:`give_back_soon`); elsewhere than glibc the trim is skipped; on jemalloc
(:mod:`tailguard.streaming.allocator`) its freed pages are purged too. What still refers to the
dropped data then (the last tick's summaries, the operator edge's history) lets go
within a few ticks, so the next :data:`GIVE_BACK_TICKS` ticks (:func:`after_tick`,
called by stage 1's tick) give back again; on jemalloc every :data:`PURGE_EVERY_TICKS`-th
tick purges its freed pages, which it otherwise keeps mapped. The heap is the process's: the state
here is too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Any, Final

from tailguard.streaming import allocator

#: Fewer series or pairs dropped at once are not worth a full collection.
GIVE_BACK_MIN: Final = 1000
#: Ticks after a give-back that give back again.
GIVE_BACK_TICKS: Final = 5

#: On jemalloc, freed pages go back every this many ticks too: the worker keeps them
#: mapped between give-backs (:data:`tailguard.streaming.allocator.MALLOC_CONF`).
PURGE_EVERY_TICKS: Final = 10

_again = 0          # ticks left that give back again
_ticks = 0

_LIBC: Any = None


def give_back() -> None:
    """Collect cyclic garbage and return freed heap to the system (glibc ``malloc_trim``),
    now and at the next :data:`GIVE_BACK_TICKS` ticks."""
    global _again
    _again = GIVE_BACK_TICKS
    _collect_and_trim()


def give_back_soon() -> None:
    """Give back at the next :data:`GIVE_BACK_TICKS` ticks (a flood was refused: what reading
    and dropping its records cost is freed, but glibc keeps the heap until a trim)."""
    global _again
    _again = GIVE_BACK_TICKS


def after_tick() -> None:
    """Give back again if a give-back was asked for within the last ticks; on jemalloc,
    purge its freed pages every :data:`PURGE_EVERY_TICKS` ticks."""
    global _again, _ticks
    _ticks += 1
    if _again > 0:
        _again -= 1
        _collect_and_trim()
    elif _ticks % PURGE_EVERY_TICKS == 0:
        allocator.purge()


def _collect_and_trim() -> None:
    global _LIBC
    gc.collect()
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)
    allocator.purge()
