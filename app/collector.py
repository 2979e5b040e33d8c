"""Pausing Python's cyclic garbage collector around a batch of allocations.

Owns :func:`collector_paused`, the context manager the worker and ``tailguard replay``
hand to the pure core (``WindowStore(..., pause_collector=collector_paused)``): the core
makes one tuple per series at each tick's summary pass and calls no ``gc`` itself — the
caller decides. Every allocation of a container counts towards the collector's next pass,
and a tick makes tens of thousands (summaries and their sort keys, none of them in a
cycle): paused, the collector runs once after the batch instead of many times during it,
and its older generations, whose passes cost most, far less often.

Also owns :func:`fewer_full_collections` and :func:`collect_if_due`, the worker's choice of
when the collector walks its oldest generation: seldom on its own, and when it is due at a
quiet moment the worker picks (after its stage-2 tick; docs/performance.md, the cost curve).

Guarantees: the collector is enabled again on exit (also on an exception) when it was
enabled on entry; a collector disabled by someone else stays disabled.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Python's own threshold of the oldest generation (``gc.get_threshold()[2]`` by default).
DEFAULT_FULL_EVERY = 10


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the ``with`` block (see the module docstring)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def fewer_full_collections(every: int) -> None:
    """Let the collector pass over its oldest generation only after ``every`` passes over
    the middle one (Python's default is 10; the other thresholds are kept). For a process
    whose long-lived objects are many and seldom in cycles (a worker holding every series'
    window and state): each full pass walks all of them. ``every`` < 1 is refused."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every!r}")
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, every)


def collect_if_due(due_after: int = DEFAULT_FULL_EVERY) -> bool:
    """A full pass of the collector now if at least ``due_after`` passes over the middle
    generation were made since the last one (the default is when Python's own thresholds
    would have made one); whether it ran."""
    if gc.get_count()[2] < due_after:
        return False
    gc.collect()
    return True
