"""Quantiles: exact (numpy selection) and mergeable (t-digest).

Guarantees:

* :func:`exact_quantiles` and :func:`row_quantiles` equal
  ``numpy.quantile(values, q)`` (linear interpolation, numpy's default)
  to floating-point rounding; they select with ``np.partition`` (O(n)) and
  only fall back to a full sort when many different ranks are needed.
* The t-digest wrapper (``fastdigest``, Rust) gives P50 within 1 % and P99
  within 2 % relative error of the exact value on 1000+ samples of lognormal
  and bimodal data at ``DIGEST_CENTROIDS`` (tests/unit/test_quantiles.py),
  merges across nodes, and serializes to the same ``{"centroids": [{"m", "c"}
  …]}`` dict as the ``tdigest`` package.
* :func:`quantiles` switches from exact to t-digest above
  :data:`EXACT_LIMIT` samples (the seed: sort up to ~100k, sketch above).
* No input means ``None``, never NaN.
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


def _ranks(n: npt.NDArray[np.int64], q: float) -> tuple[npt.NDArray[np.int64],
                                                           npt.NDArray[np.int64], F64]:
    pos = q * (np.maximum(n, 1) - 1).astype(np.float64)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    return lo, hi, pos - lo


def exact_quantiles(values: FloatArray, qs: Sequence[float]) -> list[float] | None:
    """``numpy.quantile(values, qs)`` by selection; ``None`` for no values."""
    v = np.asarray(values, dtype=np.float64).ravel()
    n = v.size
    if n == 0:
        return None
    ns = np.array([n], dtype=np.int64)
    parts = [_ranks(ns, q) for q in qs]
    kth = sorted({int(k) for lo, hi, _ in parts for k in (lo[0], hi[0])})
    s = np.partition(v, kth)
    return [float(s[lo[0]] + (s[hi[0]] - s[lo[0]]) * f[0]) for lo, hi, f in parts]


def row_quantiles(matrix: FloatArray, counts: npt.NDArray[np.int64],
                  qs: Sequence[float]) -> F64:
    """Quantiles of each row's ``counts[r]`` smallest entries.

    The caller fills the entries that do not belong to a row with ``+inf``
    (so they sort last). Returns ``[rows, len(qs)]``; NaN for rows with
    ``counts == 0``. ``matrix`` is modified (partitioned in place).
    """
    rows = matrix.shape[0]
    out = np.full((rows, len(qs)), np.nan)
    if rows == 0:
        return out
    counts = np.asarray(counts, dtype=np.int64)
    parts = [_ranks(counts, q) for q in qs]
    kth = np.unique(np.concatenate([np.concatenate((lo, hi)) for lo, hi, _ in parts]))
    if matrix.dtype == np.float32 and not (matrix < 0).any():
        # Non-negative IEEE floats order like their bit patterns: the SIMD integer
        # sort is the fastest exact selection numpy has for many short rows.
        matrix.view(np.int32).sort(axis=1)
    elif kth.size <= _MAX_KTH:
        matrix.partition(kth, axis=1)
    else:
        matrix.sort(axis=1)
    for j, (lo, hi, f) in enumerate(parts):
        vlo = np.take_along_axis(matrix, lo[:, None], axis=1)[:, 0].astype(np.float64)
        vhi = np.take_along_axis(matrix, hi[:, None], axis=1)[:, 0].astype(np.float64)
        with np.errstate(invalid="ignore"):
            out[:, j] = np.where(counts > 0, vlo + (vhi - vlo) * f, np.nan)
    return out


# ---------------------------------------------------------------- t-digest

def digest_of(values: FloatArray | Iterable[float],
              max_centroids: int = DIGEST_CENTROIDS) -> TDigest:
    """A t-digest of ``values``."""
    v = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    return TDigest.from_values(v.ravel(), max_centroids=max_centroids)  # type: ignore[arg-type]


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
