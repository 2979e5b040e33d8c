"""One model's peer columns sorted for :func:`tailguard.core.judge.peers.norms_of`, at once.

Owns :func:`sort_columns`: the P50s, the P99/P50 ratios, their products and the fresh P50s
sorted as rows of one array by one ``np.sort``, and :class:`Ordered`, what ``norms_of`` reads of
a sorted list (its smallest value, its median's one or two middle values, its largest).

Guarantees: of float columns (stage 1 sends floats), the floats Python's ``sorted`` gives, bit
for bit. ``np.sort`` may order equal values either way, and the only equal floats with other
bits are 0.0 and -0.0: P50s or ratios not all positive (a P99 of zero) are sorted by
``sorted``, with their products. A product past the largest float is inf, as in
Python, without a warning. Pure.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np


class Ordered(NamedTuple):
    """A sorted list as ``norms_of`` reads it: its smallest value, the one or two middle ones
    (their ``median_sorted`` is the list's median) and its largest."""

    low: float
    middle: list[float]
    high: float


def ordered(values: Iterable[float]) -> Ordered:
    """:class:`Ordered` of ``values`` (not empty), sorted by ``sorted``."""
    s = sorted(values)
    n = len(s)
    return Ordered(s[0], s[(n - 1) // 2:n // 2 + 1], s[-1])


def sort_columns(p50s: list[float], ratios: list[float], fp: list[float]
                 ) -> tuple[Ordered, list[float], Ordered, Ordered | None]:
    """``p50s`` and ``ratios`` (finite; the ratios' whole list sorted), their products and the
    fresh P50s ``fp`` (finite; None when empty; by ``sorted`` when fewer than the P50s)."""
    n = len(p50s)
    a = np.empty((4 if len(fp) == n else 3, n))
    a[0], a[1] = p50s, ratios
    if len(a) == 4:
        a[3] = fp
    with np.errstate(over="ignore"):
        np.multiply(a[0], a[1], out=a[2])
    a.sort(axis=1)
    rows = list(map(Ordered, a[:, 0].tolist(), a[:, (n - 1) // 2:n // 2 + 1].tolist(),
                    a[:, -1].tolist()))
    sr = a[1].tolist()
    if not (rows[0].low > 0.0 and sr[0] > 0.0):      # (a P99 of zero)
        rows[0], sr = ordered(p50s), sorted(ratios)
        rows[2] = ordered(map(operator.mul, p50s, ratios))
    return rows[0], sr, rows[2], rows[3] if len(a) == 4 else ordered(fp) if fp else None
