"""Turns on the worker's one event loop: stage 1's tick before stage 2's long tick.

Stage 1 (:class:`~tailguard.streaming.ingest.IngestService`) and stage 2
(:class:`~tailguard.streaming.ticker.Stage2Ticker`) share one event loop. A stage-2 tick of many
models is long (at 100,000 series, seconds of evaluation); it steps one model at a time
(judging, the operator edge, the Redis write, its bookkeeping and messages) and between two steps calls
:meth:`Turns.stage2_step`, which returns at once unless a stage-1 tick
runs: then it waits until that tick has sent its summaries, or ``hold_s`` after it began
(a stage-1 tick stuck on a slow broker never stops routing writes). A stage-1 tick marks
itself with :meth:`Turns.stage1_tick`.

Guarantees: while a stage-1 tick runs (up to ``hold_s``), a stage-2 tick takes at most the
rest of one model's step; a stage-2 tick is never held by anything else (polls, the stage-2
agent and faust's own work take their ordinary turns); a stage-1 tick that fails still ends
its turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress


class Turns:
    """Who goes first on the shared loop (see the module docstring)."""

    def __init__(self, hold_s: float = 5.0) -> None:
        if not hold_s >= 0:
            raise ValueError(f"hold_s must be >= 0, got {hold_s!r}")
        self.hold_s = hold_s
        self._stage1_ticks = 0
        self._since = 0.0           # loop time the running stage-1 tick began
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:      # made on the loop that uses it
            self._idle = asyncio.Event()
            self._idle.set()
        return self._idle

    @asynccontextmanager
    async def stage1_tick(self) -> AsyncIterator[None]:
        """Hold stage 2's steps for the ``async with`` block (a stage-1 tick)."""
        idle = self._event()
        if not self._stage1_ticks:
            self._since = asyncio.get_running_loop().time()
        self._stage1_ticks += 1
        idle.clear()
        try:
            yield
        finally:
            self._stage1_ticks -= 1
            if not self._stage1_ticks:
                idle.set()

    async def stage2_step(self) -> None:
        """Between two models of a stage-2 tick: one turn of the loop for the other tasks,
        and a wait while a stage-1 tick runs."""
        await asyncio.sleep(0)
        idle = self._event()
        if idle.is_set():
            return
        left_s = self._since + self.hold_s - asyncio.get_running_loop().time()
        with suppress(TimeoutError):
            await asyncio.wait_for(idle.wait(), max(0.0, left_s))
