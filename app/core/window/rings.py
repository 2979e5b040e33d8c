"""Stage 1's storage layout: slabs of sample rings, and the record of each series.

Owns :class:`Slab` (``rows`` rings of ``cap`` slots, a numpy row per ring, one column per
field), the tier constants that size slabs, and :class:`SeriesRecord` (a series' ring, first
and last seen, request and failure counts, restart bookkeeping). The window store
(:mod:`tailguard.core.window.window`) places series in slabs; :mod:`tailguard.core.window.summarize` and
:mod:`tailguard.core.window.pools` read whole slabs at once.

Guarantees:

* A ring's samples sit in slots ``head - fill … head - 1`` (mod ``cap``), oldest first
  (:meth:`Slab.order`); empty slots have NaN ts and latency. Timestamps are float64, latency
  float32 (probe = negative) and, in sized slabs only, input/output tokens and TTFT float32:
  12 bytes per sample, ~12 KB per latency-only series at window_size 1000.
* Tiers: ring capacities ``TIER_BASE`` × ``TIER_GROWTH``ⁿ (16, 128, 1024, …) capped at
  window_size; slabs are sized up to ``SLAB_BYTES``, never below ``MIN_SLAB_ROWS`` rings.
* Per ring, the kept bounds ``ts_lo``/``ts_hi``/``lat_lo`` never exclude a filled slot.
* :meth:`SeriesRecord.seen` marks a restart at once on a new ``instance``, or after a gap once
  ``RESTART_CONFIRM_SIGNS`` signs of life confirm it.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

SeriesKey: TypeAlias = tuple[str, str]
F64: TypeAlias = npt.NDArray[np.float64]
F32: TypeAlias = npt.NDArray[np.float32]
I64: TypeAlias = npt.NDArray[np.int64]

# Signs of life (samples, heartbeats) within restart_gap_s after a gap that confirm a restart.
RESTART_CONFIRM_SIGNS: Final = 10
TIER_BASE: Final = 16
TIER_GROWTH: Final = 8
SLAB_BYTES: Final = 4 << 20
MIN_SLAB_ROWS: Final = 4


class Slab:
    """A slab of ``rows`` rings of ``cap`` slots. Empty slots have NaN ts and latency.

    Per ring, ``ts_lo <= min(ts)``, ``ts_hi >= max(ts)`` and ``lat_lo <= min(lat)`` over
    the ring's filled slots: bounds kept on insert (a slot that leaves the ring can only
    loosen them) and tightened to the exact values when a tick needs them
    (:mod:`tailguard.core.window.summarize`), so most full rings are proven "clean" without a pass over them.
    """

    __slots__ = ("cap", "fill", "free", "head", "inp", "lat", "lat_lo", "midx", "out", "rows",
                 "series", "sized", "ts", "ts_hi", "ts_lo", "ttft", "used")

    def __init__(self, cap: int, rows: int, sized: bool) -> None:
        self.cap, self.rows, self.sized = cap, rows, sized
        self.ts: F64 = np.full((rows, cap), np.nan)
        self.lat: F32 = np.full((rows, cap), np.nan, dtype=np.float32)
        self.inp: F32 | None = None
        self.out: F32 | None = None
        self.ttft: F32 | None = None
        if sized:
            self.inp = np.full((rows, cap), np.nan, dtype=np.float32)
            self.out = np.full((rows, cap), np.nan, dtype=np.float32)
            self.ttft = np.full((rows, cap), np.nan, dtype=np.float32)
        self.head: I64 = np.zeros(rows, dtype=np.int64)
        self.fill: I64 = np.zeros(rows, dtype=np.int64)
        self.midx: I64 = np.full(rows, -1, dtype=np.int64)
        self.ts_lo: F64 = np.full(rows, np.inf)
        self.ts_hi: F64 = np.full(rows, -np.inf)
        self.lat_lo: F64 = np.full(rows, np.inf)
        self.series: list[SeriesRecord | None] = [None] * rows
        self.free: list[int] = list(range(rows - 1, -1, -1))
        self.used = 0

    def columns(self) -> list[npt.NDArray[Any]]:
        cols: list[npt.NDArray[Any]] = [self.ts, self.lat]
        if self.sized:
            cols += [self.inp, self.out, self.ttft]  # type: ignore[list-item]
        return cols

    def order(self, row: int) -> I64:
        """Slot indices of ``row`` from oldest to newest."""
        fill, head = int(self.fill[row]), int(self.head[row])
        return (head - fill + np.arange(fill, dtype=np.int64)) % self.cap

    def release(self, row: int) -> None:
        for col in self.columns():
            col[row] = np.nan
        self.fill[row] = self.head[row] = 0
        self.midx[row] = -1
        self.ts_lo[row], self.ts_hi[row], self.lat_lo[row] = np.inf, -np.inf, np.inf
        self.series[row] = None
        self.free.append(row)
        self.used -= 1

    def take_rows(self, src: Slab, rows: I64, at: int) -> None:
        """Move ``src``'s rings ``rows`` (same tier) to this slab's rows ``at``, ``at + 1``, …,
        which must be unused; ``src`` is left as it was (the caller drops it)."""
        to = slice(at, at + rows.size)
        for dst_col, src_col in zip(self.columns(), src.columns(), strict=True):
            dst_col[to] = src_col[rows]
        for name in ("head", "fill", "midx", "ts_lo", "ts_hi", "lat_lo"):
            getattr(self, name)[to] = getattr(src, name)[rows]
        for i, r in enumerate(rows.tolist(), start=at):
            s = src.series[r]
            assert s is not None
            self.series[i] = s
            s.chunk, s.row = self, i
        self.used += rows.size
        self.free = [r for r in self.free if not at <= r < at + rows.size]


class SeriesRecord:
    """What the store knows of one (node_id, model): its ring (``chunk``, ``row``; None and -1
    before its first ``ok`` sample), model index, first/last seen, counts and restarts."""

    __slots__ = ("chunk", "failed", "failures", "first_seen_ts", "gap_s", "hardware", "instance",
                 "instance_ts", "last_seen_ts", "midx", "model", "node_id", "requests", "resume_signs",
                 "resume_ts", "resumed_ts", "row", "signs")

    def __init__(self, node_id: str, model: str, midx: int) -> None:
        self.node_id, self.model, self.midx = node_id, model, midx
        self.hardware: str | None = None
        self.first_seen_ts: float | None = None
        self.last_seen_ts: float | None = None
        self.failed: dict[int, int] = {}
        self.requests = self.failures = 0      # every request taken, and the failed ones
        self.chunk: Slab | None = None
        self.row = -1
        # Restarts: the reporting process (event "instance"), when a new one was first seen,
        # and when signs of life last resumed after a gap; signs = samples and heartbeats seen,
        # gap_s = an EWMA of the time between them (the scale a restart gap is measured on).
        self.instance: str | None = None
        self.instance_ts: float | None = None
        self.resumed_ts: float | None = None
        self.signs = 0
        self.gap_s = 0.0
        self.resume_ts: float | None = None     # a gap seen, its restart not yet confirmed
        self.resume_signs = 0

    def seen(self, lo: float, hi: float, instance: str | None = None, gap_s: float = 0.0,
             n: int = 1, ts: F64 | None = None) -> None:
        """``n`` signs of life from ``lo`` to ``hi`` (event time; ``ts`` each, or None for one)
        of process ``instance``.

        A new instance marks a restart at once (``instance_ts``). Signs that resume after a gap
        longer than ``gap_s`` and than 20 of the series' recent gaps (an EWMA) mark one
        (``resumed_ts``) once ``RESTART_CONFIRM_SIGNS`` signs follow within ``gap_s``: a node
        back at work, not a trickle after a traffic drop.
        """
        last = self.last_seen_ts
        if instance is not None:
            if self.instance is not None and instance != self.instance:
                self.instance_ts = lo
            self.instance = instance
        if last is not None and hi >= last:
            gap = lo - last
            if gap_s > 0 and gap > gap_s and self.signs >= 3 and gap > 20.0 * self.gap_s:
                self.resume_ts, self.resume_signs = lo, 0
            mean = (hi - last) / n
            self.gap_s = mean if self.signs == 1 else self.gap_s + 0.2 * (mean - self.gap_s)
        pending = self.resume_ts
        if pending is not None:
            until = pending + gap_s
            self.resume_signs += (n if hi <= until else int(np.count_nonzero(ts <= until)) if ts is not None
                                  else int(lo <= until))
            if self.resume_signs >= RESTART_CONFIRM_SIGNS:
                self.resumed_ts, self.resume_ts = pending, None
            elif lo > until:
                self.resume_ts = None
        self.signs += n
        if self.first_seen_ts is None or lo < self.first_seen_ts:
            self.first_seen_ts = lo
        if last is None or hi > last:
            self.last_seen_ts = hi

