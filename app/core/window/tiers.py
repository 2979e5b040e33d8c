"""Stage 1's ring allocator: which slab row holds each series' ring, tier by tier.

:class:`RingTiers` owns the slabs of every tier (ring capacity × sized or not, see
:mod:`tailguard.core.window.rings`): it hands a series a ring large enough for its samples,
moves the samples when the series outgrows its ring or starts carrying request sizes, gives
emptied slabs back and repacks tiers left sparse by forgotten series. The window store
(:mod:`tailguard.core.window.window`) decides when; this module only places rows.

Guarantees:

* :meth:`RingTiers.place` keeps a ring's samples, oldest first, and its kept bounds
  (``ts_lo``/``ts_hi``/``lat_lo``) when it moves them; a ring never shrinks, and a sized ring
  never becomes unsized.
* A slab whose last ring is released is dropped from its tier at once.
* :meth:`RingTiers.compact` changes no ring's content, only where it sits; it costs nothing
  when no tier has more than 4× the rows in use.
"""

from __future__ import annotations

import numpy as np

from tailguard.core.window.rings import MIN_SLAB_ROWS, SLAB_BYTES, TIER_BASE, TIER_GROWTH, SeriesRecord, Slab

__all__ = ["RingTiers"]


class RingTiers:
    """The slabs of every tier for rings of at most ``window_size`` slots; see the module docstring."""

    def __init__(self, window_size: int) -> None:
        self.window_size = window_size
        caps: list[int] = []
        c = TIER_BASE
        while c < window_size:
            caps.append(c)
            c *= TIER_GROWTH
        caps.append(window_size)
        self.caps: tuple[int, ...] = tuple(caps)
        #: ``{(cap, sized): slabs}`` — read-only outside this class.
        self.slabs_by_tier: dict[tuple[int, bool], list[Slab]] = {}
        #: Bumped whenever a row is taken or freed (rings placed, moved, released, repacked):
        #: while it stands, every used row holds the same series as before.
        self.layout = 0

    def clear(self) -> None:
        self.slabs_by_tier.clear()
        self.layout += 1

    def nbytes(self) -> int:
        """Bytes held by the slabs (every row, used or free)."""
        return sum(col.nbytes for tier in self.slabs_by_tier.values() for ch in tier
                   for col in ch.columns())

    def used_slabs(self) -> list[Slab]:
        """Every slab holding a used ring, tier by tier."""
        return [ch for tier in self.slabs_by_tier.values() for ch in tier if ch.used]

    def compact(self) -> int:
        """Repack every tier whose slabs have more than 4× as many rows as rings in use into
        new slabs sized for the rings left; returns how many ring rows were freed.

        A flood leaves thousands of rows of a small tier behind, a few still used. Rings keep
        their content; cost: one copy of the rings moved.
        """
        freed = 0
        for key, chunks in self.slabs_by_tier.items():
            used = sum(ch.used for ch in chunks)
            if sum(ch.rows for ch in chunks) <= 4 * max(used, MIN_SLAB_ROWS):
                continue
            cap, sized = key
            new: list[Slab] = []
            dst: Slab | None = None
            left = used
            for ch in chunks:
                rows = np.flatnonzero(ch.midx >= 0)
                while rows.size:
                    if dst is None or dst.unused_from == dst.rows:
                        dst = Slab(cap, min(self._max_rows(cap, sized),
                                              max(MIN_SLAB_ROWS, left)), sized)
                        new.append(dst)
                    k = min(rows.size, dst.rows - dst.unused_from)
                    dst.take_rows(ch, rows[:k])
                    left, rows = left - k, rows[k:]
            freed += sum(ch.rows for ch in chunks) - sum(ch.rows for ch in new)
            self.slabs_by_tier[key] = new
            self.layout += 1
        return freed

    @staticmethod
    def _max_rows(cap: int, sized: bool) -> int:
        slot_bytes = 4 + 4 + (12 if sized else 0)
        return max(MIN_SLAB_ROWS, SLAB_BYTES // (cap * slot_bytes))

    def release(self, ch: Slab, row: int) -> None:
        """Free ``row`` of ``ch``; drop ``ch`` from its tier once it holds no ring."""
        ch.release(row)
        self.layout += 1
        if ch.used == 0:  # series outgrow small tiers: give their slabs back
            self.slabs_by_tier[(ch.cap, ch.sized)].remove(ch)

    def _alloc(self, cap: int, sized: bool, s: SeriesRecord) -> tuple[Slab, int]:
        chunks = self.slabs_by_tier.setdefault((cap, sized), [])
        for ch in chunks:
            if ch.has_room():
                break
        else:
            max_rows = self._max_rows(cap, sized)
            rows = min(max_rows, max(MIN_SLAB_ROWS, 2 * (chunks[-1].rows if chunks else 2)))
            ch = Slab(cap, rows, sized)
            chunks.append(ch)
        row = ch.take()
        self.layout += 1
        ch.series[row] = s
        ch.midx[row] = s.midx
        ch.used += 1
        return ch, row

    def place(self, s: SeriesRecord, need: int, sized: bool) -> None:
        """Make ``s`` own a ring that can take ``need`` samples without loss below
        window_size, in a sized slab if ``sized``; move its samples if needed."""
        old, orow = s.chunk, s.row
        cap = next((c for c in self.caps if c >= min(need, self.window_size)), self.window_size)
        if old is not None:
            sized = sized or old.sized
            if old.cap >= cap and old.sized == sized:
                return
            cap = max(cap, old.cap)
        ch, row = self._alloc(cap, sized, s)
        if old is not None:
            order = old.order(orow)
            n = order.size
            ch.ts_code[row, :n] = old.ts_code[orow, order]
            ch.base_us[row] = old.base_us[orow]
            ch.lat[row, :n] = old.lat[orow, order]
            if old.sized:
                assert ch.inp is not None and ch.out is not None and ch.ttft is not None
                ch.inp[row, :n] = old.inp[orow, order]  # type: ignore[index]
                ch.out[row, :n] = old.out[orow, order]  # type: ignore[index]
                ch.ttft[row, :n] = old.ttft[orow, order]  # type: ignore[index]
            ch.fill[row] = n
            ch.head[row] = n % ch.cap
            ch.ts_lo[row], ch.ts_hi[row], ch.lat_lo[row] = old.ts_lo[orow], old.ts_hi[orow], old.lat_lo[orow]
            self.release(old, orow)
        s.chunk, s.row = ch, row
