"""All models' cluster pools at once: segment_quantiles and WindowStore.model_pools(qs=...).

Both must give exactly (bit for bit) what ``exact_quantiles`` gives on each pool, which the
detector's ticks carried before (``ModelTick.fleet_latency_p50_us``/``_p99_us``), and the
pools must hold exactly the thinned judged samples of every ring, whatever the ring layout.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.window.quantiles import exact_quantiles, segment_quantiles
from tailguard.core.window.window import WindowStore

S = DetectorSettings()
T0 = 1_764_680_010.0
NOW = T0 + 120.0
QS = (0.5, 0.99)


def _check_segments(values: np.ndarray, counts: list[int], qs: tuple[float, ...]) -> None:
    v32 = values.astype(np.float32)
    before = v32.copy()
    got = segment_quantiles(v32, np.array(counts, dtype=np.int64), qs)
    assert got.shape == (len(counts), len(qs))
    lo = 0
    for i, n in enumerate(counts):
        seg = before[lo:lo + n]
        want = exact_quantiles(seg, qs)
        if want is None:
            assert np.isnan(got[i]).all()
        else:
            assert np.array_equal(got[i], want, equal_nan=True)   # bit for bit
            if np.isfinite(seg).all():
                ref = np.quantile(seg.astype(np.float64), qs)
                assert got[i] == pytest.approx(ref, rel=1e-12)
        # reordered within its own segment only
        assert np.array_equal(np.sort(v32[lo:lo + n]), np.sort(seg))
        lo += n


@pytest.mark.parametrize("counts", [
    [12_800] * 7,                            # the common case: one 2-D selection
    [1, 12_800, 3, 0, 2, 5000, 5000, 1],     # very different sizes, empty, single samples
    [0, 0, 1, 1, 1, 0],
    [125] * 3 + [250] * 2 + [125],
    [],
])
@pytest.mark.parametrize("qs", [QS, (0.99, 0.5), (0.0, 1.0), (0.5, 0.5, 0.25, 0.999), (0.3,)])
def test_segment_quantiles_equal_exact_quantiles(counts: list[int], qs: tuple[float, ...]) -> None:
    rng = np.random.default_rng(len(counts) + len(qs))
    n = sum(counts)
    _check_segments(1e5 * np.exp(rng.normal(0, 0.5, n)), counts, qs)
    _check_segments(rng.integers(1, 6, n).astype(np.float64), counts, qs)     # many ties


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=12), st.integers(0, 2**32 - 1),
       st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.booleans())
def test_segment_quantiles_random(counts: list[int], seed: int, qs: list[float],
                                  equal: bool) -> None:
    if equal and counts:
        counts = [counts[0]] * len(counts)
    rng = np.random.default_rng(seed)
    values = rng.lognormal(10, 1.0, sum(counts))
    values[rng.uniform(size=values.size) < 0.05] = np.inf       # +inf orders last, as in numpy
    _check_segments(values, counts, tuple(qs))


def test_segment_quantiles_checks_the_counts() -> None:
    with pytest.raises(ValueError, match="segment counts"):
        segment_quantiles(np.ones(5, dtype=np.float32), np.array([2, 2]), QS)


# ---- model_pools ----------------------------------------------------------------------

def _batch(node: str, model: str, lat: np.ndarray, t_lo: float = T0, t_hi: float = NOW,
           probe: bool = False) -> SampleBatch:
    n = lat.size
    return SampleBatch(node, model, "A100", np.linspace(t_lo, t_hi, n), lat,
                       np.ones(n, bool), np.full(n, probe))


def _reference_pools(store: WindowStore, now_s: float, per_series: int = 128
                     ) -> dict[str, tuple[np.ndarray, int]]:
    """Every ring's slots ``[::stride]`` that hold judged samples, pooled per model."""
    stride = -(-S.window_size // per_series)
    age_lo = now_s - S.max_sample_age_s
    pooled: dict[str, list[np.ndarray]] = {}
    for key in sorted(store.keys()):
        s = store._series[key]
        if s.chunk is None:
            continue
        lat, ts = s.chunk.lat[s.row, ::stride], s.chunk.ts[s.row, ::stride]
        with np.errstate(invalid="ignore"):
            kept = lat[(lat > 0) & (ts > age_lo) & (ts <= now_s)]
        if kept.size:
            pooled.setdefault(key[1], []).append(kept)
    return {m: (np.sort(np.concatenate(v)), len(v)) for m, v in pooled.items()}


def _mixed_store(interleave: bool, seed: int) -> WindowStore:
    """Models of 1..100 nodes, full and partial rings, stale/future/probe samples; the
    models' rings adjacent in their slabs (long runs) or interleaved (one ring per run)."""
    rng = np.random.default_rng(seed)
    store = WindowStore(S)
    sizes = {"big": 60, "mid": 25, "one": 1, "pair": 2}
    plan = [(m, i) for m, k in sizes.items() for i in range(k)]
    if interleave:
        plan.sort(key=lambda p: (p[1], p[0]))
    for model, i in plan:
        n = 1000 if i % 4 else int(rng.integers(1, 1000))
        lat = 1e5 * np.exp(rng.normal(0, 0.4, n))
        if i % 7 == 3:      # partly stale ring
            store.observe(_batch(f"n{i}", model, lat, T0 - 2 * S.max_sample_age_s, NOW))
        elif i % 7 == 5:    # partly after the tick
            store.observe(_batch(f"n{i}", model, lat, NOW - 50, NOW + 50))
        else:
            store.observe(_batch(f"n{i}", model, lat))
        if i % 9 == 2:      # probes overwrite a few slots
            store.observe(_batch(f"n{i}", model, np.full(5, 9e6), NOW - 1, NOW, probe=True))
    for i in range(100):    # clean full rings side by side: copied as slices of adjacent rows
        store.observe(_batch(f"b{i}", "bulk", 2e5 * np.exp(rng.normal(0, 0.2, 1000))))
    store.observe(_batch("lonely", "single", np.array([123.0]), NOW - 1, NOW))
    store.observe(_batch("old", "stale", np.full(50, 5e4), T0 - 900, T0 - 800))
    return store


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_pools_hold_the_thinned_judged_samples(interleave: bool, seed: int) -> None:
    store = _mixed_store(interleave, seed)
    want = _reference_pools(store, NOW)
    pools = store.model_pools(NOW, qs=QS)
    assert set(pools) == set(want) == {"big", "mid", "one", "pair", "single", "bulk"}   # not "stale"
    for m, pool in pools.items():
        values, nodes = want[m]
        assert pool.nodes == nodes
        assert pool.values.dtype == np.float32
        assert np.array_equal(np.sort(pool.values), values)
        assert pool.quantiles(QS) == exact_quantiles(values, QS)          # bit for bit
        assert pool.at_qs == tuple(exact_quantiles(values, QS) or ())
        assert pool.quantiles((0.25,)) == exact_quantiles(values, (0.25,))  # not precomputed
    assert pools["single"].quantiles(QS) == [123.0, 123.0]
    plain = store.model_pools(NOW)                  # without qs: same pools, nothing selected
    assert {m: np.sort(p.values).tolist() for m, p in plain.items()} == \
        {m: v.tolist() for m, (v, _) in want.items()}
    assert all(p.at_qs == () for p in plain.values())
    sub = store.model_pools(NOW, models=["one", "nope", "mid"], qs=QS)
    assert list(sub) == ["mid", "one"]
    assert sub["mid"].quantiles(QS) == pools["mid"].quantiles(QS)


def test_model_pools_other_strides() -> None:
    store = _mixed_store(True, 4)
    for per_series in (1, 7, 1000):
        want = _reference_pools(store, NOW, per_series)
        pools = store.model_pools(NOW, per_series=per_series, qs=(0.5, 0.99, 1.0))
        assert {m: np.sort(p.values).tolist() for m, p in pools.items()} == \
            {m: v.tolist() for m, (v, _) in want.items()}
        for m, pool in pools.items():
            assert pool.quantiles((0.5, 0.99, 1.0)) == exact_quantiles(want[m][0], (0.5, 0.99, 1.0))


@pytest.mark.parametrize("now_s", [NOW, NOW + S.max_sample_age_s - 60])  # clean / partly stale
@pytest.mark.parametrize("interleave", [True, False])
def test_model_pools_of_whole_slabs(now_s: float, interleave: bool) -> None:
    """Every slab full: of rings of alternating models (gathered and regrouped by model)
    or of long runs of one model; at ``now_s`` every ring clean or holding stale samples."""
    rng = np.random.default_rng(9)
    store = WindowStore(S)
    models = (("fast", 1e4), ("slow", 1e6))
    plan = [(i, m) for i in range(64) for m in models] if interleave else \
        [(i, m) for m in models for i in range(64)]
    for i, (model, scale) in plan:
        store.observe(_batch(f"n{i}", model, scale * np.exp(rng.normal(0, 0.3, 1000))))
    want = _reference_pools(store, now_s)
    pools = store.model_pools(now_s, qs=QS)
    assert {m: np.sort(p.values).tolist() for m, p in pools.items()} == \
        {m: v.tolist() for m, (v, _) in want.items()}
    assert {m: p.nodes for m, p in pools.items()} == {"fast": 64, "slow": 64}
    for m, pool in pools.items():
        assert pool.quantiles(QS) == exact_quantiles(want[m][0], QS)
