"""Stage 1's fast path (:func:`tailguard.core.window.passes.fast_stats`: full rings with every
sample judged, one sort per ring for the window and its fresh samples, rings sorted in blocks
that share one buffer, each block's keys built and sorted a few rings at a time) gives exactly
what a plain sort of each window gives: P50/P99 of the window, the fresh samples' count and P50,
and the fresh samples over the model's tail reference, whatever the block and sort-block sizes
(one ring a block up to all rings in one), also where a ring between fast ones is not full."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.window import passes
from tailguard.core.window import ts_codes as tc
from tailguard.core.window.summarize import fresh_min_samples
from tailguard.core.window.window import WindowStore

WINDOW = 64
CFG = DetectorSettings(window_size=WINDOW, min_samples=10, max_sample_age_s=120.0, tick_interval_s=30.0)
NOW = 10_000.0


def _plain(values: np.ndarray[Any, Any], q: float) -> float:
    """``numpy.quantile``'s linear rule on ``np.sort`` of ``values``, in float64."""
    s = np.sort(values.astype(np.float64))
    pos = q * (s.size - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, s.size - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rings=st.integers(1, 30), ties=st.sampled_from([0, 1, 3]),
       block_rings=st.sampled_from([1, 3, 7, 1000]), fresh=st.sampled_from(["mixed", "none", "all"]),
       age_s=st.sampled_from([120.0, 3000.0]), sort_rings=st.sampled_from([1, 2, 5, 1000]),
       gap=st.booleans(), grid_us=st.sampled_from([1, 1 << 23, tc.GRID_US]))
def test_fast_blocks_equal_a_plain_sort_of_each_window(seed: int, rings: int, ties: int, block_rings: int,
                                                       fresh: str, age_s: float, sort_rings: int,
                                                       gap: bool, grid_us: int) -> None:
    """``fresh``: how many samples of each ring are fresh (the kept bounds prove all or none
    of a slab's); ``age_s``: 3000 s puts old samples further than ``FLAG_SPAN_S`` from the
    fresh bound (the keys are then made by a comparison); ``sort_rings``: how many rings'
    keys are built and sorted at a time; ``gap``: the second ring is half full (the slow
    path), so a slab's fast rings are not consecutive; ``grid_us``: the grid of the rings'
    bases (1 µs: every ring its own base and threshold; 8.4 s: some share one)."""
    rng = np.random.default_rng(seed)
    store = WindowStore(dataclasses.replace(CFG, max_sample_age_s=age_s))
    half = 1 if gap and rings > 2 else None    # the ring that is not full
    grid = pytest.MonkeyPatch()
    grid.setattr(tc, "GRID_US", grid_us)
    for i in range(rings):
        size = WINDOW // 2 if i == half else WINDOW
        nf = {"none": 0, "all": size}.get(fresh) or int(
            rng.choice([0, 1, 9, 10, 11, size - 1, size, int(rng.integers(0, size + 1))]))
        ts = np.concatenate([rng.uniform(NOW - age_s + 1.0, NOW - 30.0, size - nf),
                             rng.uniform(NOW - 29.9, NOW, nf)])
        lat = (rng.choice(rng.lognormal(10, 0.5, ties), size) if ties
               else rng.lognormal(10, 0.5, size))
        n = ts.size
        store.observe(SampleBatch(f"n{i:02}", "m", None, rng.permutation(ts), lat,
                                  np.ones(n, bool), np.zeros(n, bool)))
    grid.undo()
    ref = float(np.exp(10.3))
    blocks: list[int] = []
    real: Callable[..., None] = passes._fast_block

    def spy(items: Any, n: int, *args: Any) -> None:
        blocks.append(n)
        real(items, n, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(passes, "_FAST_BLOCK_BYTES", block_rings * 4 * WINDOW)
        mp.setattr(passes, "_SORT_BLOCK_BYTES", sort_rings * 4 * WINDOW)
        mp.setattr(passes, "_fast_block", spy)
        out = store.summaries(NOW, tail_refs={"m": ref})
    assert sum(blocks) == rings - (half is not None)     # every full ring took the fast path
    if block_rings == 1 and rings >= 12:         # slabs of 4 and 8 rings at least: 2 blocks
        assert len(blocks) >= 2
    for s in out:
        w = store.window(s.node_id, "m")
        assert w is not None
        lat = w["latency_us"].astype(np.float32)
        fresh = lat[w["ts"] > NOW - CFG.tick_interval_s]
        assert (s.samples, s.p50, s.p99) == (lat.size, _plain(lat, 0.5), _plain(lat, 0.99))
        assert (s.latency_p50_us, s.latency_p99_us) == (s.p50, s.p99)
        assert s.fresh_samples == fresh.size
        assert s.fresh_p50 == (_plain(fresh, 0.5) if fresh.size >= fresh_min_samples(CFG) else None)
        assert s.fresh_over == (int(np.count_nonzero(fresh.astype(np.float64) > ref))
                                if fresh.size else None)
