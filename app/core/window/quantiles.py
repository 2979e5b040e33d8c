"""Quantiles: exact (numpy selection) and mergeable (t-digest).

Guarantees:

* :func:`exact_quantiles` and :func:`row_quantiles` equal ``numpy.quantile(values, q)``
  (linear interpolation) to floating-point rounding; they select with ``np.partition`` and
  sort only when many different ranks are needed.
* Rows wider than :data:`SPLIT_WIDTH` of non-negative float32 are sorted as two halves and
  the ranks selected across both (:func:`select_in_halves`): the same order statistics as a
  full sort.
* Two sets of values in one row, one sort: :func:`to_run_keys` flags the second set in the
  float32 sign bit; :func:`select_two_runs` / :func:`two_run_quantiles` select the whole
  row's ranks across the two runs and :func:`prefix_quantiles` the first run's, bit for bit
  what sorting each set apart gives (tests/unit/test_quantiles.py).
* The t-digest wrapper (``fastdigest``) gives P50 within 1 % and P99 within 2 % of the exact
  value on 1000+ lognormal or bimodal samples at ``DIGEST_CENTROIDS``, merges across nodes,
  and serializes to the ``{"centroids": [{"m", "c"} …]}`` dict of the ``tdigest`` package.
* :func:`quantiles` switches from exact to t-digest above :data:`EXACT_LIMIT` samples.
* No input means ``None``, never NaN. Measurements: docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
from fastdigest import TDigest

FloatArray: TypeAlias = npt.NDArray[np.floating[Any]]
F64: TypeAlias = npt.NDArray[np.float64]

EXACT_LIMIT: Final = 100_000
DIGEST_CENTROIDS: Final = 200
# Above this many distinct ranks, one sort beats a multi-pivot partition.
_MAX_KTH: Final = 16
# Rows wider than this are sorted as two halves (numpy's SIMD sort is much faster on short rows).
SPLIT_WIDTH: Final = 512
# From this many values on, order_statistics selects inside brackets read off a sample.
BRACKET_MIN: Final = 8192
_BRACKET_SAMPLE: Final = 1024
I64: TypeAlias = npt.NDArray[np.int64]


def _ranks(n: npt.NDArray[np.int64], q: float) -> tuple[npt.NDArray[np.int64],
                                                           npt.NDArray[np.int64], F64]:
    pos = q * (np.maximum(n, 1) - 1).astype(np.float64)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    return lo, hi, pos - lo


def _fixed_ranks(n: int, qs: Sequence[float]) -> tuple[I64, I64, F64]:
    """:func:`_ranks` of ``n`` values at each of ``qs``, as arrays over ``qs``."""
    ranks = [_ranks(np.array([n], dtype=np.int64), q) for q in qs]
    return (np.array([r[0][0] for r in ranks], dtype=np.int64),
            np.array([r[1][0] for r in ranks], dtype=np.int64), np.array([r[2][0] for r in ranks]))


def exact_quantiles(values: FloatArray, qs: Sequence[float]) -> list[float] | None:
    """``numpy.quantile(values, qs)`` by selection; ``None`` for no values.

    float32 input is selected as float32 (no widening copy); the interpolation is
    in float64 either way. Large inputs select inside sampled brackets
    (:func:`order_statistics`).
    """
    v = np.asarray(values)
    if v.dtype != np.float32:
        v = v.astype(np.float64, copy=False)
    v = v.ravel()
    n = v.size
    if n == 0:
        return None
    ns = np.array([n], dtype=np.int64)
    parts = [_ranks(ns, q) for q in qs]
    at = order_statistics(v, sorted({int(k) for lo, hi, _ in parts for k in (lo[0], hi[0])}))
    out = []
    for lo, hi, f in parts:
        a, b = at[int(lo[0])], at[int(hi[0])]
        out.append(a + (b - a) * float(f[0]))
    return out


def order_statistics(v: FloatArray, ranks: Sequence[int]) -> dict[int, float]:
    """``{k: np.partition(v, k)[k]}`` for the ascending, distinct 0-based ``ranks`` of 1-D
    ``v`` (NaN sorts last, as in numpy). Exact.

    From :data:`BRACKET_MIN` values on, each cluster of nearby ranks is bracketed between
    two values of an evenly strided sample of ~1,000 (with a margin of three binomial
    standard deviations), and only the values inside the bracket are partitioned (the
    Floyd–Rivest idea; its cost against a whole partition: docs/performance.md). A
    bracket that misses (checked by counting) falls back to partitioning everything.
    """
    n = int(v.size)
    if n >= BRACKET_MIN:
        got = _bracketed(v, list(ranks))
        if got is not None:
            return got
    s = np.partition(v, list(ranks))
    return {k: float(s[k]) for k in ranks}


def _bracketed(v: FloatArray, ranks: list[int]) -> dict[int, float] | None:
    n = int(v.size)
    sample = np.sort(v[::n // _BRACKET_SAMPLE])
    m = int(sample.size)
    groups: list[list[int]] = []
    for k in ranks:                      # ranks within 1 % of n share a bracket
        if groups and k - groups[-1][-1] <= n // 100:
            groups[-1].append(k)
        else:
            groups.append([k])
    out: dict[int, float] = {}
    for g in groups:
        p = min(max(g[0] / n, 1e-6), 1 - 1e-6)
        margin = 3.0 * float(np.sqrt(m * p * (1 - p))) + 3.0
        i_lo = int(np.floor(g[0] / n * m - margin))
        i_hi = int(np.ceil(g[-1] / n * m + margin))
        t_lo = float(sample[i_lo]) if i_lo >= 0 else -np.inf
        t_hi = float(sample[i_hi]) if i_hi < m else np.inf
        below = int(np.count_nonzero(v < t_lo)) if i_lo >= 0 else 0
        inside = v[(v >= t_lo) & (v <= t_hi)]
        # Every value < t_lo or inside the bracket is a number; NaN (last in numpy's
        # order) is in neither, so the ranks are right as long as the bracket holds them.
        if not (below <= g[0] and below + inside.size > g[-1]):
            return None
        sel = np.partition(inside, [k - below for k in g])
        out.update((k, float(sel[k - below])) for k in g)
    return out


def sort_rows(matrix: npt.NDArray[np.float32]) -> int:
    """Sort each row of a C-contiguous, non-negative float32 ``matrix`` in place, as two
    halves when it is wider than :data:`SPLIT_WIDTH`. Returns the split column ``h``:
    ``matrix[:, :h]`` and ``matrix[:, h:]`` are each sorted (``h == width``: one sort).

    Non-negative IEEE floats (and +inf) order like their bit patterns: numpy's SIMD
    integer sort is the fastest exact sort it has for many short rows.
    """
    rows, width = int(matrix.shape[0]), int(matrix.shape[1])
    bits = matrix.view(np.int32)
    if width <= SPLIT_WIDTH or rows == 0:
        bits.sort(axis=1)
        return width
    h = width // 2
    if width % 2 == 0 and matrix.flags.c_contiguous:
        bits.reshape(2 * rows, h).sort(axis=1)  # one call over contiguous half-rows
    else:
        bits[:, :h].sort(axis=1)
        bits[:, h:].sort(axis=1)
    return h


def select_in_halves(matrix: FloatArray, h: int, k: I64) -> tuple[F64, F64]:
    """Per row ``r`` of a C-contiguous ``matrix`` whose ``[:, :h]`` and ``[:, h:]`` are each
    sorted ascending: the ``k[r, c]``-th and ``(k[r, c] + 1)``-th smallest (0-based) of the row.
    ``k`` is ``[rows, nq]`` with ``0 <= k < width``; the second value repeats the first when
    ``k`` is the last rank. Returns two float64 arrays shaped like ``k``.

    A vectorized binary search for ``i``, how many of the ``k + 1`` smallest lie in the first
    half (ties: first half first): the smallest ``i`` with ``i == h``, or ``k - i < 0``, or
    ``b[k - i] < a[i]`` (``a``, ``b`` the halves) — false below, true from there on. Then
    rank ``k`` is ``max(a[i-1], b[k-i])`` and rank ``k + 1`` is ``min(a[i], b[k+1-i])``, absent
    neighbours left out. ``ceil(log2(h + 1))`` rounds of flat gathers, for all rows at once.
    """
    rows, width = int(matrix.shape[0]), int(matrix.shape[1])
    m1, m2 = h, width - h
    flat = matrix.reshape(-1)
    k = np.asarray(k, dtype=np.int64).reshape(rows, -1)
    row_a = (np.arange(rows, dtype=np.int64) * width)[:, None]
    row_b = row_a + h
    lo = np.maximum(0, k + 1 - m2)
    hi = np.minimum(k + 1, m1)
    # Invariant: the answer is in [lo, hi] and the predicate holds at hi. While lo < hi,
    # mid < m1 and 0 <= k - mid < m2; rows already settled (lo == hi) read clipped
    # indices and keep lo == hi whatever the comparison says.
    for _ in range(int((hi - lo).max(initial=0)).bit_length()):
        mid = (lo + hi) >> 1
        p = flat[row_b + np.maximum(k - mid, 0)] < flat[row_a + np.minimum(mid, m1 - 1)]
        hi = np.where(p, mid, hi)
        lo = np.where(p, lo, np.minimum(mid + 1, hi))
    i, j = lo, k + 1 - lo                             # taken from each half
    ninf, pinf = np.float32(-np.inf), np.float32(np.inf)
    a_prev = np.where(i > 0, flat[row_a + np.maximum(i - 1, 0)], ninf)
    b_prev = np.where(j > 0, flat[row_b + np.maximum(j - 1, 0)], ninf)
    a_next = np.where(i < m1, flat[row_a + np.minimum(i, m1 - 1)], pinf)
    b_next = np.where(j < m2, flat[row_b + np.minimum(j, m2 - 1)], pinf)
    kth = np.maximum(a_prev, b_prev).astype(np.float64)
    nxt = np.where(k + 1 < width, np.minimum(a_next, b_next), kth).astype(np.float64)
    return kth, nxt


U32: TypeAlias = npt.NDArray[np.uint32]
#: Bit 31 of a non-negative float32's bits (its sign bit, always 0): :func:`to_run_keys`
#: sets it on the entries of a row's second run.
RUN_FLAG: Final = np.uint32(1 << 31)
_VALUE_BITS: Final = np.uint32((1 << 31) - 1)
_NO_VALUE: Final = np.uint32(0xFFFF_FFFF)


def to_run_keys(keys: U32, values: npt.NDArray[np.float32]) -> None:
    """Turn ``keys`` (1 where an entry of ``values`` belongs to its row's second run, else
    0; same shape) into sort keys in place: the bits of the non-negative float32 ``values``
    with :data:`RUN_FLAG` set on second-run entries. Sorting a row of keys (as uint32)
    orders it ``[first run ascending | second run ascending]``: non-negative IEEE floats,
    +inf included, order like their bits, and the flag puts every second-run key last."""
    np.left_shift(keys, 31, out=keys)
    np.bitwise_or(keys, values.view(np.uint32), out=keys)


def select_two_runs(keys: U32, split: I64, k: I64) -> tuple[F64, F64]:
    """:func:`select_in_halves` with a split point per row, on sort keys (:func:`to_run_keys`).

    Row ``r`` of the C-contiguous uint32 ``keys`` holds two runs, ``keys[r, :split[r]]``
    and ``keys[r, split[r]:]`` (either may be empty), each ascending in value: the float32
    of a key's bits with :data:`RUN_FLAG` cleared. Returns, per row and column of ``k``
    (``[rows, nq]``, ``0 <= k < width``), the ``k``-th and ``(k + 1)``-th smallest value
    (0-based) of the whole row as float64; the second repeats the first when ``k`` is the
    last rank. The same vectorized binary search as :func:`select_in_halves`, all rows at
    once; an empty run is never compared (rows whose search has ended read clamped
    indices, and what they read is not used).
    """
    rows, width = int(keys.shape[0]), int(keys.shape[1])
    flat = keys.reshape(-1)
    k = np.asarray(k, dtype=np.int64).reshape(rows, -1)
    m1 = np.asarray(split, dtype=np.int64).reshape(rows, 1)
    row_a = (np.arange(rows, dtype=np.int64) * width)[:, None]
    b_k = row_a + m1 + k                    # flat index of the second run's entry k - i is b_k - i
    lo = np.maximum(0, k + 1 - (width - m1))
    hi = np.minimum(k + 1, m1)
    # The answer is in [lo, hi] and the predicate holds at hi. While lo < hi, mid < m1 and
    # 0 <= k - mid < width - m1. A settled row (lo >= hi) reads clamped indices, and whatever
    # it reads, hi stays where it is (lo may pass it by one): hi is the answer.
    for _ in range(int((hi - lo).max(initial=0)).bit_length()):
        mid = (lo + hi) >> 1
        p = (flat.take(b_k - mid, mode="clip") & _VALUE_BITS) < flat.take(row_a + mid, mode="clip")
        hi = np.where(p, mid, hi)
        lo = np.where(p, lo, mid + 1)
    i, j = hi, k + 1 - hi                   # taken from each run
    a_at = row_a + i
    b_at = b_k - i + 1                      # the second run's entry j
    none = np.uint32(0)                     # below every value (they are >= +0.0)
    kth = np.maximum(np.where(i > 0, flat.take(a_at - 1, mode="clip"), none),
                     np.where(j > 0, flat.take(b_at - 1, mode="clip") & _VALUE_BITS, none))
    nxt = np.minimum(np.where(i < m1, flat.take(a_at, mode="clip"), _NO_VALUE),
                     np.where(j < width - m1, flat.take(b_at, mode="clip") & _VALUE_BITS, _NO_VALUE))
    nxt = np.where(k + 1 < width, nxt, kth)
    return kth.view(np.float32).astype(np.float64), nxt.view(np.float32).astype(np.float64)


def two_run_quantiles(keys: U32, split: I64, qs: Sequence[float]) -> F64:
    """``numpy.quantile`` at ``qs`` of every whole row of ``keys`` (two runs split at
    ``split``, see :func:`select_two_runs`); ``[rows, len(qs)]``. Each rank is searched
    on its own: one near either end of a row (a P99) takes fewer steps than a P50."""
    rows, n = int(keys.shape[0]), int(keys.shape[1])
    lo, hi, f = _fixed_ranks(n, qs)
    out: F64 = np.empty((rows, lo.size))
    for c in range(lo.size):
        vlo, vnext = select_two_runs(keys, split, np.full((rows, 1), lo[c], dtype=np.int64))
        vhi = vnext if hi[c] > lo[c] else vlo
        with np.errstate(invalid="ignore"):         # +inf - +inf: NaN, as in numpy
            out[:, c:c + 1] = vlo + (vhi - vlo) * f[c]
    return out


def prefix_quantiles(matrix: FloatArray, counts: I64, q: float) -> F64:
    """``numpy.quantile(matrix[r, :counts[r]], q)`` of each row of a C-contiguous ``matrix``
    whose rows start with their ``counts[r]`` values ascending (NaN where ``counts == 0``).
    The two ranks are read by index."""
    rows, width = int(matrix.shape[0]), int(matrix.shape[1])
    counts = np.asarray(counts, dtype=np.int64)
    lo, hi, f = _ranks(counts, q)
    flat = matrix.reshape(-1)
    at = np.arange(rows, dtype=np.int64) * width
    vlo = flat[at + lo].astype(np.float64)
    vhi = flat[at + hi].astype(np.float64)
    with np.errstate(invalid="ignore"):
        out: F64 = np.where(counts > 0, vlo + (vhi - vlo) * f, np.nan)
    return out


def count_at_most(matrix: npt.NDArray[Any], stop: I64, v: npt.ArrayLike) -> I64:
    """Per row ``r`` of a C-contiguous ``matrix`` whose ``matrix[r, :stop[r]]`` is ascending:
    how many of those entries are ``<= v[r]`` (``np.searchsorted(..., side="right")`` row by
    row, as one vectorized binary search; a NaN ``v`` counts none)."""
    rows, width = int(matrix.shape[0]), int(matrix.shape[1])
    flat = matrix.reshape(-1)
    at = np.arange(rows, dtype=np.int64) * width
    lo = np.zeros(rows, dtype=np.int64)
    hi = np.asarray(stop, dtype=np.int64)
    # Entries below lo are <= v, entries from hi on are not. A settled row (lo >= hi) reads
    # clamped indices, and hi stays where it is whatever it reads: hi is the answer.
    for _ in range(int(hi.max(initial=0)).bit_length()):
        mid = (lo + hi) >> 1
        le = flat.take(at + mid, mode="clip") <= v
        lo = np.where(le, mid + 1, lo)
        hi = np.where(le, hi, mid)
    return hi


def row_quantiles(matrix: FloatArray, counts: npt.NDArray[np.int64],
                  qs: Sequence[float], *, nonnegative: bool = False) -> F64:
    """Quantiles of each row's ``counts[r]`` smallest entries.

    The caller fills the entries that do not belong to a row with ``+inf``
    (so they sort last). Returns ``[rows, len(qs)]``; NaN for rows with
    ``counts == 0``. ``matrix`` is modified (sorted or partitioned in place).
    ``nonnegative``: the caller knows no entry is negative (spares a pass to check).
    """
    rows = matrix.shape[0]
    out = np.full((rows, len(qs)), np.nan)
    if rows == 0:
        return out
    counts = np.asarray(counts, dtype=np.int64)
    parts = [_ranks(counts, q) for q in qs]
    if matrix.dtype == np.float32 and (nonnegative or not (matrix < 0).any()):
        f32 = matrix.view(np.float32)
        h = sort_rows(f32)
        if h < matrix.shape[1]:
            # Entries past counts[r] are +inf and sort last in each half, so the ranks
            # below counts[r] of the whole row are those of the row's own values.
            los = np.stack([lo for lo, _, _ in parts], axis=1)
            vlo, vnext = select_in_halves(f32, h, los)
            for j, (lo, hi, f) in enumerate(parts):
                vhi = np.where(hi > lo, vnext[:, j], vlo[:, j])
                with np.errstate(invalid="ignore"):
                    out[:, j] = np.where(counts > 0, vlo[:, j] + (vhi - vlo[:, j]) * f, np.nan)
            return out
    else:
        kth = np.unique(np.concatenate([np.concatenate((lo, hi)) for lo, hi, _ in parts]))
        if kth.size <= _MAX_KTH:
            matrix.partition(kth, axis=1)
        else:
            matrix.sort(axis=1)
    for j, (lo, hi, f) in enumerate(parts):
        vlo = np.take_along_axis(matrix, lo[:, None], axis=1)[:, 0].astype(np.float64)
        vhi = np.take_along_axis(matrix, hi[:, None], axis=1)[:, 0].astype(np.float64)
        with np.errstate(invalid="ignore"):
            out[:, j] = np.where(counts > 0, vlo + (vhi - vlo) * f, np.nan)
    return out


def sorted_row_quantiles(matrix: npt.NDArray[np.float32], qs: Sequence[float]) -> F64:
    """``numpy.quantile(row, qs)`` of every row of a full, non-negative float32 ``matrix``
    (no padding); ``matrix`` is sorted in place (as halves when wide, see :func:`sort_rows`)."""
    rows, n = int(matrix.shape[0]), int(matrix.shape[1])
    lo, hi, f = _fixed_ranks(n, qs)
    h = sort_rows(matrix)
    if h < n:
        vlo, vnext = select_in_halves(matrix, h, np.broadcast_to(lo, (rows, lo.size)))
        vhi = np.where(hi > lo, vnext, vlo)
    else:
        vlo = matrix[:, lo].astype(np.float64)
        vhi = matrix[:, hi].astype(np.float64)
    out: F64 = vlo + (vhi - vlo) * f
    return out


# ---------------------------------------------------------------- t-digest

def digest_of(values: FloatArray | Iterable[float],
              max_centroids: int = DIGEST_CENTROIDS) -> TDigest:
    """A t-digest of ``values``."""
    v = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    return TDigest.from_values(v.ravel(), max_centroids=max_centroids)  # type: ignore[arg-type]


def digest_dict_of_sorted(values: FloatArray,
                          max_centroids: int = DIGEST_CENTROIDS) -> dict[str, Any]:
    """The dict of a t-digest of ascending ``values`` (non-empty), built offline.

    Centroids are runs of consecutive ranks cut where the k1 scale function
    ``asin(2q - 1)`` crosses ``max_centroids`` equal steps: narrow runs in the tails
    (single samples at both ends, so ``min``/``max`` are exact), wide ones at the median;
    at most ``max_centroids`` centroids. Only ``max_centroids`` cut points are computed
    and the runs summed with one ``np.add.reduceat``: cheaper than :func:`digest_of`
    once the values are sorted (docs/performance.md). Same dict format, so it
    merges with any other digest (:func:`merge_digests`).
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    n = int(v.size)
    j = np.arange(max_centroids + 1, dtype=np.float64)
    q_edges = (np.sin(np.pi * (j / max_centroids - 0.5)) + 1.0) / 2.0
    starts = np.unique(np.clip(np.ceil(q_edges * n - 0.5), 0, n - 1).astype(np.int64))
    sums = np.add.reduceat(v, starts)
    counts = np.diff(np.append(starts, n))
    # A run's mean lies within its first and last value (rounding could leave it a ulp out,
    # and centroid means must not decrease).
    means = np.clip(sums / counts, v[starts], v[starts + counts - 1])
    return {"max_centroids": max_centroids, "mass": float(n), "sum": float(sums.sum()),
            "min": float(v[0]), "max": float(v[-1]), "n_values": n,
            "centroids": [{"m": m, "c": c} for m, c in zip(means.tolist(),
                                                           counts.astype(np.float64).tolist(),
                                                           strict=True)]}


def digest_to_dict(d: TDigest) -> dict[str, Any]:
    """JSON-able form, compatible with the ``tdigest`` package's ``to_dict``."""
    return dict(d.to_dict())


def digest_from_dict(data: Mapping[str, Any]) -> TDigest:
    return TDigest.from_dict(dict(data))


def merge_digests(digests: Iterable[TDigest | Mapping[str, Any]],
                  max_centroids: int = DIGEST_CENTROIDS) -> TDigest:
    """One digest of the union of the inputs (dicts or digests)."""
    acc = TDigest(max_centroids=max_centroids)
    for d in digests:
        acc.merge_inplace(d if isinstance(d, TDigest) else digest_from_dict(d))
    return acc


def digest_quantiles(d: TDigest, qs: Sequence[float]) -> list[float] | None:
    if d.is_empty():
        return None
    return [float(x) for x in d.quantile_vec(list(qs))]


def quantiles(values: FloatArray, qs: Sequence[float], *,
              exact_limit: int = EXACT_LIMIT) -> list[float] | None:
    """Exact up to ``exact_limit`` samples, t-digest above; ``None`` if empty."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size <= exact_limit:
        return exact_quantiles(v, qs)
    return digest_quantiles(digest_of(v), qs)


def segment_quantiles(values: npt.NDArray[np.float32], counts: I64,
                      qs: Sequence[float]) -> F64:
    """``numpy.quantile(segment, qs)`` of consecutive segments of 1-D, C-contiguous,
    non-negative float32 ``values``: segment ``i`` is the ``counts[i]`` values after
    segment ``i - 1``'s. Returns ``[segments, len(qs)]`` float64; NaN rows for empty
    segments. ``values`` is reordered (partitioned) in place within each segment.

    Exactly :func:`exact_quantiles`' figures (the same order statistics, interpolated
    as ``vlo + (vhi - vlo) * f`` in float64), at a fraction of its numpy calls: non-negative
    floats order like their int32 bit patterns, numpy's SIMD selection (one ``kth``)
    partitions int32 rows fast, and runs of adjacent segments of equal size are selected
    as the rows of one 2-D view. Per quantile (ascending), the rows are partitioned at
    rank ``lo`` to the right of the previous one, and rank ``lo + 1`` is the minimum of
    what lies right of ``lo``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    out = np.full((counts.size, len(qs)), np.nan)
    bits = values.view(np.int32)
    if bits.size != int(counts.sum()):
        raise ValueError(f"segment counts sum to {int(counts.sum())}, not {bits.size} values")
    order = sorted(range(len(qs)), key=lambda j: qs[j])
    edges = [0, *(np.flatnonzero(np.diff(counts)) + 1).tolist(), int(counts.size)] if counts.size else []
    start = 0
    for e in range(len(edges) - 1):
        i, j = edges[e], edges[e + 1]
        n = int(counts[i])
        if n == 0:
            continue
        block = bits[start:start + (j - i) * n].reshape(j - i, n)
        start += (j - i) * n
        ns = np.array([n], dtype=np.int64)
        done = 0           # every value in columns >= done is >= every value left of them
        vlo = vhi = block[:, 0]
        lo_prev = -1
        for c in order:
            lo_a, hi_a, f = _ranks(ns, qs[c])
            lo, hi = int(lo_a[0]), int(hi_a[0])
            if lo != lo_prev:
                if lo >= done:
                    block[:, done:].partition(lo - done, axis=1)
                    done = lo + 1
                vlo = block[:, lo]
                vhi = block[:, lo + 1:].min(axis=1) if hi > lo else vlo
                lo_prev = lo
            a = vlo.view(np.float32).astype(np.float64)
            b = (vhi if hi > lo else vlo).view(np.float32).astype(np.float64)
            with np.errstate(invalid="ignore"):       # inf - inf: NaN, as exact_quantiles gives
                out[i:j, c] = a + (b - a) * float(f[0])
    return out
