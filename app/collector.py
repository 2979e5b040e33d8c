"""Pausing Python's cyclic garbage collector around a batch of allocations.

Owns :func:`collector_paused`, the context manager the worker and ``tailguard replay``
hand to the pure core (``WindowStore(..., pause_collector=collector_paused)``): the core
makes one tuple per series at each tick's summary pass and calls no ``gc`` itself — the
caller decides. Every allocation of a container counts towards the collector's next pass,
and a tick makes tens of thousands (summaries and their sort keys, none of them in a
cycle): paused, the collector runs once after the batch instead of many times during it,
and its older generations, whose passes cost most, far less often.

Guarantees: the collector is enabled again on exit (also on an exception) when it was
enabled on entry; a collector disabled by someone else stays disabled.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
