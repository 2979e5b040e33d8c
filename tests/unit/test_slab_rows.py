"""A slab's free rows (tailguard.core.window.rings.Slab): the last released is taken first,
then the never-used rows in order; a compacted slab's rows are filled in order."""

from __future__ import annotations

import numpy as np

from tailguard.core.window.rings import SeriesRecord, Slab


def test_rows_are_taken_last_released_first_then_never_used_in_order() -> None:
    ch = Slab(16, 6, sized=False)
    assert [ch.take() for _ in range(3)] == [0, 1, 2]
    ch.used = 3                 # RingTiers counts the rows it takes
    ch.release(1)
    ch.release(0)
    assert [ch.take() for _ in range(3)] == [0, 1, 3]
    assert ch.has_room()
    assert [ch.take() for _ in range(2)] == [4, 5]
    assert not ch.has_room()


def test_take_rows_fills_the_next_never_used_rows() -> None:
    src = Slab(16, 8, sized=False)
    rows = np.array([2, 5, 6], dtype=np.int64)
    for r in rows.tolist():
        src.series[r], src.midx[r], src.lat[r, 0] = SeriesRecord(f"n{r}", "m", 0), 0, float(r)
    dst = Slab(16, 4, sized=False)
    dst.take_rows(src, rows[:2])
    dst.take_rows(src, rows[2:])
    assert (dst.unused_from, dst.used) == (3, 3)
    assert dst.lat[:3, 0].tolist() == [2.0, 5.0, 6.0]
    assert [s.row if s is not None else -1 for s in dst.series] == [0, 1, 2, -1]
    assert dst.take() == 3 and not dst.has_room()
