"""Stage 1's storage layout: slabs of sample rings, and the record of each series.

Owns :class:`Slab` (``rows`` rings of ``cap`` slots, a numpy row per ring, one column per
field), the tier constants that size slabs, and :class:`SeriesRecord` (a series' ring, first
and last seen, request and failure counts, restart bookkeeping). The window store
(:mod:`tailguard.core.window.window`) places series in slabs; :mod:`tailguard.core.window.summarize` and
:mod:`tailguard.core.window.pools` read whole slabs at once.

Guarantees:

* A ring's samples sit in slots ``head - fill … head - 1`` (mod ``cap``), oldest first
  (:meth:`Slab.order`). Latency float32 (probe = negative, empty = NaN), event time a uint32
  code (:mod:`tailguard.core.window.ts_codes`) and, in sized slabs only, input/output tokens
  and TTFT float32: 8 bytes per sample (20 sized), ~8 KB per series at window_size 1000.
* Tiers: ring capacities ``TIER_BASE`` × ``TIER_GROWTH``ⁿ (16, 128, 1024, …) capped at
  window_size; slabs are sized up to ``SLAB_BYTES``, never below ``MIN_SLAB_ROWS`` rings.
* Per ring, the kept bounds ``ts_lo``/``ts_hi`` (decoded times) and ``lat_lo`` never exclude
  a filled slot.
* :meth:`SeriesRecord.seen` marks a restart at once on a new ``instance``, or after a gap once
  ``RESTART_CONFIRM_SIGNS`` signs of life confirm it.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tailguard.core.window.ts_codes import MAX_CODE, U32, base_for, codes_against, decode, encode_into

SeriesKey: TypeAlias = tuple[str, str]
F64: TypeAlias = npt.NDArray[np.float64]
F32: TypeAlias = npt.NDArray[np.float32]
I64: TypeAlias = npt.NDArray[np.int64]

# Signs of life (samples, heartbeats) within restart_gap_s after a gap that confirm a restart.
RESTART_CONFIRM_SIGNS: Final = 10
TIER_BASE: Final = 16
TIER_GROWTH: Final = 8
# A full slab of latency rings (8 B a slot) holds one block of fast sort keys (4 B a slot,
# passes._FAST_BLOCK_BYTES); why 16 MB: docs/performance.md, 2026-12-06 (session 10): slabs.
SLAB_BYTES: Final = 16 << 20
MIN_SLAB_ROWS: Final = 4
#: The failures of every series that has had none (never written: ``failures_by_s``).
NO_FAILURES: Final[dict[int, int]] = {}


class Slab:
    """A slab of ``rows`` rings of ``cap`` slots. Empty slots have ts code 0 and NaN latency.

    Free rows: those released (``free``, the last released taken first), then the rows from
    ``unused_from`` on, never used (:meth:`take`).

    ``ts_code`` holds each sample's time code (:mod:`tailguard.core.window.ts_codes`) against
    its ring's ``base_us``; :attr:`ts` decodes them all. Per ring, ``ts_lo <= min(ts)``,
    ``ts_hi >= max(ts)`` and ``lat_lo <= min(lat)`` over the ring's filled slots: bounds kept
    on insert (a slot that leaves the ring can only loosen them) and tightened to the exact
    values when a tick needs them (:mod:`tailguard.core.window.summarize`), so most full rings
    are proven "clean" without a pass over them.
    """

    __slots__ = ("base_us", "cap", "fill", "free", "head", "inp", "lat", "lat_lo", "midx", "out",
                 "rows", "series", "sized", "ts_code", "ts_hi", "ts_lo", "ttft", "unused_from", "used")

    def __init__(self, cap: int, rows: int, sized: bool) -> None:
        self.cap, self.rows, self.sized = cap, rows, sized
        self.ts_code: U32 = np.zeros((rows, cap), dtype=np.uint32)
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
        self.base_us: I64 = np.zeros(rows, dtype=np.int64)       # µs; see ts_codes
        self.ts_lo: F64 = np.full(rows, np.inf)
        self.ts_hi: F64 = np.full(rows, -np.inf)
        self.lat_lo: F64 = np.full(rows, np.inf)
        self.series: list[SeriesRecord | None] = [None] * rows
        self.free: list[int] = []
        self.unused_from = 0
        self.used = 0

    def has_room(self) -> bool:
        return bool(self.free) or self.unused_from < self.rows

    def take(self) -> int:
        """A free row (:meth:`has_room` first): the last released, else the first never used."""
        if self.free:
            return self.free.pop()
        self.unused_from += 1
        return self.unused_from - 1

    def columns(self) -> list[npt.NDArray[Any]]:
        cols: list[npt.NDArray[Any]] = [self.ts_code, self.lat]
        if self.sized:
            cols += [self.inp, self.out, self.ttft]  # type: ignore[list-item]
        return cols

    def order(self, row: int) -> I64:
        """Slot indices of ``row`` from oldest to newest."""
        fill, head = int(self.fill[row]), int(self.head[row])
        return (head - fill + np.arange(fill, dtype=np.int64)) % self.cap

    @property
    def ts(self) -> F64:
        """Every slot's event time, decoded (a copy; NaN in empty slots, -inf if too old)."""
        t: F64 = np.where(np.isnan(self.lat), np.nan, decode(self.ts_code, self.base_us[:, None]))
        return t

    def times(self, row: int, slots: I64) -> F64:
        """The event times of ``row``'s ``slots`` (decoded; a sample stored as too old: -inf)."""
        return decode(self.ts_code[row, slots], int(self.base_us[row]))

    def put_times(self, row: int, ts: F64, lo_s: float, hi_s: float, replace: bool) -> U32:
        """The codes of ``ts`` (new samples of ``row``, in order, from ``lo_s`` to ``hi_s``;
        ``replace``: they replace the ring's), the ring moved to a new base first if they need
        one (:func:`~tailguard.core.window.ts_codes.encode_into`); its kept time bounds updated."""
        codes, base, lost, c_lo, c_hi = encode_into(self.ts_code, row, int(self.base_us[row]), ts,
                                                    lo_s, hi_s, not replace and bool(self.fill[row]))
        self.base_us[row] = base
        t_lo = (c_lo + base) / 1e6 if c_lo else -np.inf       # as ts_codes.decode
        t_hi = (c_hi + base) / 1e6 if c_hi else -np.inf
        if replace:
            self.ts_lo[row], self.ts_hi[row] = t_lo, t_hi
        else:
            self.ts_lo[row] = -np.inf if lost else min(float(self.ts_lo[row]), t_lo)
            self.ts_hi[row] = max(float(self.ts_hi[row]), t_hi)
        return codes

    def as_original(self, row: int, ts: F64, base_us: int | None, head: int | None) -> None:
        """Make ring ``row``, just filled with the times ``ts`` (oldest first; -inf: stored as
        too old) by a restore, the snapshotted ring: codes against its base ``base_us`` (it
        decides which later samples fit; None or one the times do not fit: a new one, as
        :func:`~tailguard.core.window.ts_codes.base_for`), code 0 where too old, its kept time
        bounds, and its place in its slots ``head`` (None: where it is)."""
        t = ts[ts.size - int(self.fill[row]):]      # a smaller window keeps the newest
        fin = t[np.isfinite(t)]
        lo, hi = (round(float(fin.min()) * 1e6), round(float(fin.max()) * 1e6)) if fin.size else (0, 0)
        base = base_us
        if base is None or not (lo - base >= 1 and hi - base <= MAX_CODE):
            base = base_for(lo, hi)
        codes = codes_against(t, base)
        self.ts_code[row, self.order(row)] = codes
        self.base_us[row] = base
        times = decode(codes, base)                 # -inf where too old: the bounds kept
        self.ts_hi[row], self.ts_lo[row] = times.max(), times.min()
        if head is not None and (shift := (int(head) - int(self.head[row])) % self.cap):
            for col in self.columns():
                col[row] = np.roll(col[row], shift)
            self.head[row] = head

    def release(self, row: int) -> None:
        for col in self.columns():
            col[row] = 0 if col is self.ts_code else np.nan
        self.fill[row] = self.head[row] = self.base_us[row] = 0
        self.midx[row] = -1
        self.ts_lo[row], self.ts_hi[row], self.lat_lo[row] = np.inf, -np.inf, np.inf
        self.series[row] = None
        self.free.append(row)
        self.used -= 1

    def take_rows(self, src: Slab, rows: I64) -> None:
        """Move ``src``'s rings ``rows`` (same tier) to this slab's next never-used rows (there
        must be enough); ``src`` is left as it was (the caller drops it)."""
        at = self.unused_from
        to = slice(at, at + rows.size)
        assert to.stop <= self.rows
        for dst_col, src_col in zip(self.columns(), src.columns(), strict=True):
            dst_col[to] = src_col[rows]
        for name in ("head", "fill", "midx", "base_us", "ts_lo", "ts_hi", "lat_lo"):
            getattr(self, name)[to] = getattr(src, name)[rows]
        for i, r in enumerate(rows.tolist(), start=at):
            s = src.series[r]
            assert s is not None
            self.series[i] = s
            s.chunk, s.row = self, i
        self.used += rows.size
        self.unused_from = to.stop


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
        self.failed: dict[int, int] = NO_FAILURES   # failed requests per second (``failures_by_s``)
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

    def failures_by_s(self) -> dict[int, int]:
        """``failed`` to write to: its own dict from the first failure on (until then every
        series shares the empty ``NO_FAILURES``, 64 B each fewer)."""
        if self.failed is NO_FAILURES:
            self.failed = {}
        return self.failed

    def seen(self, lo: float, hi: float, instance: str | None = None, gap_s: float = 0.0,
             n: int = 1, ts: F64 | None = None) -> bool:
        """``n`` signs of life from ``lo`` to ``hi`` (event time; ``ts`` each, or None for one)
        of process ``instance``.

        A new instance marks a restart at once (``instance_ts``). Signs that resume after a gap
        longer than ``gap_s`` and than 20 of the series' recent gaps (an EWMA) mark one
        (``resumed_ts``) once ``RESTART_CONFIRM_SIGNS`` signs follow within ``gap_s``: a node
        back at work, not a trickle after a traffic drop. Returns whether it wrote
        ``first_seen_ts``, ``instance_ts`` or ``resumed_ts``.
        """
        wrote = False
        last = self.last_seen_ts
        if instance is not None:
            if self.instance is not None and instance != self.instance:
                self.instance_ts = lo
                wrote = True
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
                wrote = True
            elif lo > until:
                self.resume_ts = None
        self.signs += n
        if self.first_seen_ts is None or lo < self.first_seen_ts:
            self.first_seen_ts = lo
            wrote = True
        if last is None or hi > last:
            self.last_seen_ts = hi
        return wrote

