"""Quantiles: exact selection equals numpy; t-digest accuracy and merging."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tailguard.core.window.quantiles import (
    BRACKET_MIN,
    RUN_FLAG,
    SPLIT_WIDTH,
    count_at_most,
    digest_from_dict,
    digest_of,
    digest_quantiles,
    digest_to_dict,
    exact_quantiles,
    merge_digests,
    order_statistics,
    prefix_quantiles,
    quantiles,
    row_quantiles,
    select_in_halves,
    select_two_runs,
    sorted_row_quantiles,
    to_run_keys,
    two_run_quantiles,
)

QS = (0.5, 0.99)
finite = st.floats(-1e9, 1e9, allow_nan=False, width=64)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 300), elements=finite),
       st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_exact_quantiles_equal_numpy(values: np.ndarray, qs: list[float]) -> None:
    got = exact_quantiles(values, qs)
    assert got is not None
    np.testing.assert_allclose(got, np.quantile(values, qs), rtol=1e-12, atol=1e-6)


def _large(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "lognormal":
        return rng.lognormal(11, 1, n).astype(np.float32)
    if kind == "ties":
        return rng.integers(0, 7, n).astype(np.float32)
    if kind == "sorted":
        return np.sort(rng.lognormal(11, 1, n))
    if kind == "reversed":
        return np.sort(rng.normal(0, 1, n))[::-1].copy()
    if kind == "periodic":          # period = the sample stride: the sample sees one value
        v = np.full(n, 5.0)
        v[:: n // 1024] = 1.0
        return v
    if kind == "nan":
        v = rng.lognormal(11, 1, n)
        v[rng.uniform(size=n) < 0.02] = np.nan
        return v
    raise AssertionError(kind)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["lognormal", "ties", "sorted", "reversed", "periodic", "nan"]),
       st.integers(BRACKET_MIN, 4 * BRACKET_MIN), st.integers(0, 2**32 - 1),
       st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_bracketed_selection_equals_partition(kind: str, n: int, seed: int, qs: list[float]) -> None:
    """Large inputs select inside sampled brackets: the same order statistics as a full
    partition, also on ties, sorted and adversarially periodic input, and with NaN."""
    v = _large(kind, n, np.random.default_rng(seed))
    ranks = sorted({min(n - 1, int(q * (n - 1)) + d) for q in qs for d in (0, 1)} | {0, n - 1})
    full = np.partition(v, ranks)
    got = order_statistics(v, ranks)
    want = {k: float(full[k]) for k in ranks}
    assert got.keys() == want.keys()
    for k in ranks:
        assert got[k] == want[k] or (np.isnan(got[k]) and np.isnan(want[k])), (k, got[k], want[k])
    if kind != "nan":
        np.testing.assert_allclose(exact_quantiles(v, qs), np.quantile(v.astype(np.float64), qs),
                                   rtol=1e-12, atol=1e-6)


def test_exact_quantiles_empty_is_none() -> None:
    assert exact_quantiles(np.array([]), QS) is None
    assert quantiles(np.array([]), QS) is None


@pytest.mark.parametrize("qs", [QS, tuple(np.linspace(0, 1, 13))])  # partition / sort branch
def test_row_quantiles_with_varying_counts(qs: tuple[float, ...]) -> None:
    rng = np.random.default_rng(0)
    m = rng.lognormal(5, 1, (40, 120)).astype(np.float32)
    counts = rng.integers(0, 121, 40)
    counts[:5] = 120
    for r, c in enumerate(counts):
        m[r, c:] = np.inf
    expect = [np.quantile(m[r, :c].astype(np.float64), qs) if c else [np.nan] * len(qs)
              for r, c in enumerate(counts)]
    got = row_quantiles(m.copy(), counts, qs)
    np.testing.assert_allclose(got, np.array(expect), rtol=1e-6)
    assert np.isnan(got[counts == 0]).all()


# ---- rows wider than SPLIT_WIDTH: two sorted halves, ranks selected across both

def _values(rng: np.random.Generator, shape: tuple[int, int], ties: int) -> np.ndarray:
    """Lognormal latency, or (``ties`` > 0) drawn from only ``ties`` distinct values."""
    if ties:
        return rng.choice(rng.lognormal(10, 1, ties), shape).astype(np.float32)
    return rng.lognormal(10, 1, shape).astype(np.float32)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 6), m1=st.integers(1, 40),
       m2=st.integers(1, 40), ties=st.sampled_from([0, 1, 2, 5]))
def test_select_in_halves_is_the_merged_order(seed: int, rows: int, m1: int, m2: int,
                                              ties: int) -> None:
    rng = np.random.default_rng(seed)
    a = np.sort(_values(rng, (rows, m1), ties), axis=1)
    b = np.sort(_values(rng, (rows, m2), ties), axis=1)
    k = rng.integers(0, m1 + m2, (rows, 3))
    k[0, 0], k[-1, -1] = 0, m1 + m2 - 1                  # both ends
    kth, nxt = select_in_halves(np.concatenate([a, b], axis=1), m1, k)
    merged = np.sort(np.concatenate([a, b], axis=1), axis=1)
    r = np.arange(rows)[:, None]
    assert np.array_equal(kth, merged[r, k])
    assert np.array_equal(nxt, merged[r, np.minimum(k + 1, m1 + m2 - 1)])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 8),
       width=st.integers(SPLIT_WIDTH + 1, 2 * SPLIT_WIDTH + 77), ties=st.sampled_from([0, 1, 3, 50]),
       qs=st.lists(st.floats(0, 1), min_size=1, max_size=3))
def test_wide_rows_equal_numpy_quantile(seed: int, rows: int, width: int, ties: int,
                                        qs: list[float]) -> None:
    rng = np.random.default_rng(seed)
    m = _values(rng, (rows, width), ties)
    counts = rng.integers(0, width + 1, rows)
    counts[0] = width
    for r, c in enumerate(counts):
        m[r, c:] = np.inf
    expect = np.array([np.quantile(m[r, :c].astype(np.float64), qs) if c else [np.nan] * len(qs)
                       for r, c in enumerate(counts)])
    got = row_quantiles(m.copy(), counts, qs)
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    assert np.isnan(got[counts == 0]).all()
    full = np.ascontiguousarray(m[:1, :width])
    np.testing.assert_allclose(sorted_row_quantiles(full.copy(), qs)[0],
                               np.quantile(full[0].astype(np.float64), qs), rtol=1e-12)


# ---- one sort for two runs: flagged keys, a split point per row

def _run_keys(values: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted keys of ``values`` with ``second`` marking the second run; the split per row."""
    keys = second.astype(np.uint32)
    to_run_keys(keys, values)
    keys.sort(axis=1)
    return keys, np.count_nonzero(~second, axis=1).astype(np.int64)


def _rows_with_runs(rng: np.random.Generator, rows: int, width: int, ties: int,
                    pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Values (``pad`` trailing +inf per row, as callers pad) and a second-run mask with
    first runs of every size: none, all, and random."""
    v = _values(rng, (rows, width), ties)
    if pad:
        v[:, width - pad:] = np.inf
    second = rng.uniform(size=(rows, width)) < rng.uniform(size=(rows, 1))
    second[0] = False                   # no second run
    if rows > 1:
        second[1] = True                # no first run
    return v, second


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 6), width=st.integers(1, 80),
       ties=st.sampled_from([0, 1, 2, 5]), pad=st.integers(0, 3))
def test_select_two_runs_is_the_merged_order(seed: int, rows: int, width: int, ties: int,
                                             pad: int) -> None:
    rng = np.random.default_rng(seed)
    v, second = _rows_with_runs(rng, rows, width, ties, min(pad, width))
    keys, split = _run_keys(v, second)
    # Sorted keys: the first run, ascending, then the second (flagged), ascending.
    r = np.arange(rows)[:, None]
    first_part = np.arange(width)[None, :] < split[:, None]
    assert np.array_equal(keys < RUN_FLAG, first_part)
    k = rng.integers(0, width, (rows, 3))
    k[0, 0], k[-1, -1] = 0, width - 1                    # both ends
    kth, nxt = select_two_runs(keys, split, k)
    merged = np.sort(v, axis=1).astype(np.float64)
    assert np.array_equal(kth, merged[r, k])
    assert np.array_equal(nxt, merged[r, np.minimum(k + 1, width - 1)])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 6), width=st.integers(1, 1200),
       ties=st.sampled_from([0, 1, 3, 50]), pad=st.integers(0, 3),
       qs=st.lists(st.floats(0, 1), min_size=1, max_size=3))
def test_two_run_quantiles_equal_numpy(seed: int, rows: int, width: int, ties: int, pad: int,
                                       qs: list[float]) -> None:
    rng = np.random.default_rng(seed)
    v, second = _rows_with_runs(rng, rows, width, ties, min(pad, width))
    keys, split = _run_keys(v, second)
    with np.errstate(invalid="ignore"):         # +inf - +inf, when padded
        got = two_run_quantiles(keys, split, qs)
        # Bit for bit what sorting the rows gives (the window's quantiles before the runs).
        np.testing.assert_array_equal(got, sorted_row_quantiles(v.copy(), qs))
        # numpy interpolates between +inf and a number differently; finite rows only.
        finite_rows = np.isfinite(v).all(axis=1)
        expect = np.array([np.quantile(row.astype(np.float64), qs) for row in v[finite_rows]])
        np.testing.assert_allclose(got[finite_rows], expect.reshape(-1, len(qs)), rtol=1e-12)
        # The first run's own quantile, read by index (NaN when it is empty), bit for bit
        # what row_quantiles gives with +inf over the second run (the fresh P50 before).
        q = qs[0]
        first = prefix_quantiles(keys.view(np.float32), split, q)
        masked = np.where(second, np.float32(np.inf), v)
        np.testing.assert_array_equal(first, row_quantiles(masked, split, [q])[:, 0])
    for i in range(rows):
        own = v[i][~second[i]].astype(np.float64)
        if own.size and np.isfinite(own).all():
            np.testing.assert_allclose(first[i], np.quantile(own, q), rtol=1e-12)
        elif not own.size:
            assert np.isnan(first[i])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 6), width=st.integers(1, 60),
       ties=st.sampled_from([0, 1, 3]))
def test_count_at_most_is_searchsorted_right(seed: int, rows: int, width: int, ties: int) -> None:
    rng = np.random.default_rng(seed)
    m = np.sort(_values(rng, (rows, width), ties), axis=1)
    stop = rng.integers(0, width + 1, rows)
    # Thresholds on, between and beyond the values, in float64 like the callers' (and NaN).
    v = np.where(rng.uniform(size=rows) < 0.5, m[np.arange(rows), rng.integers(0, width, rows)],
                 rng.lognormal(10, 1.5, rows)).astype(np.float64)
    v[0] = np.nan
    got = count_at_most(m, stop, v)
    expect = [0 if np.isnan(v[i]) else int(np.searchsorted(m[i, :stop[i]], v[i], side="right"))
              for i in range(rows)]
    assert got.tolist() == expect


def lognormal(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(11, 0.6, n)


def bimodal(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fast = rng.normal(100_000, 8_000, int(n * 0.7))
    slow = rng.normal(900_000, 60_000, n - fast.size)
    return rng.permutation(np.concatenate([fast, slow]))


@pytest.mark.parametrize("dist", [lognormal, bimodal])
@pytest.mark.parametrize("n", [1_000, 50_000])
def test_tdigest_accuracy(dist: object, n: int) -> None:
    """P50 within 1 %, P99 within 2 % of the exact value."""
    values = dist(n, 1)  # type: ignore[operator]
    got = digest_quantiles(digest_of(values), QS)
    assert got is not None
    exact = np.quantile(values, QS)
    assert got[0] == pytest.approx(exact[0], rel=0.01)
    assert got[1] == pytest.approx(exact[1], rel=0.02)


@pytest.mark.parametrize("dist", [lognormal, bimodal])
def test_merged_digests_match_union(dist: object) -> None:
    parts = [dist(2_000, seed) for seed in range(8)]  # type: ignore[operator]
    merged = merge_digests([digest_to_dict(digest_of(p)) for p in parts[:4]]
                           + [digest_of(p) for p in parts[4:]])
    union = np.concatenate(parts)
    got = digest_quantiles(merged, QS)
    assert got is not None and merged.n_values == union.size
    exact = np.quantile(union, QS)
    assert got[0] == pytest.approx(exact[0], rel=0.01)
    assert got[1] == pytest.approx(exact[1], rel=0.02)


def test_digest_dict_round_trip_and_tdigest_package_compatibility() -> None:
    import tdigest

    values = lognormal(5_000, 3)
    d = digest_of(values)
    again = digest_from_dict(digest_to_dict(d))
    assert again.quantile(0.99) == d.quantile(0.99)
    other = tdigest.TDigest()
    other.update_from_dict(digest_to_dict(d))
    assert other.percentile(50) == pytest.approx(d.quantile(0.5), rel=0.01)


def test_quantiles_switch_to_digest_above_limit() -> None:
    values = lognormal(3_000, 4)
    exact = quantiles(values, QS, exact_limit=10_000)
    approx = quantiles(values, QS, exact_limit=1_000)
    assert exact is not None and approx is not None
    np.testing.assert_allclose(exact, np.quantile(values, QS), rtol=1e-12)
    assert approx != exact
    np.testing.assert_allclose(approx, exact, rtol=0.02)
    assert digest_quantiles(merge_digests([]), QS) is None
