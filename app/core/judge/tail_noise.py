"""Whether the tail rule's noise limit lies below a bound, without the log of every ratio.

Owns :func:`noise_below`: for the peers' P99/P50 ratios, sorted, and a bound (the larger of
``ratio_threshold`` and ``fleet_ratio_factor`` x their median), True only when the noise limit
:func:`tailguard.core.judge.peers.tail_limit_sorted` computes — ``exp(mid + K x MAD)`` over the
log ratios, ``mid`` their median — is certainly below the bound, so the limit is the bound.

How: the MAD is at most the deviation of rank ``n // 2 + 1`` (the upper middle), so the noise
limit is below the bound when that many ratios lie within ``exp(mid ± d)`` of the median, ``d``
the deviation the bound allows; two bisections of the sorted ratios and the logs of their one
or two middle ones, not one log per ratio, a list of deviations and a sort.

Guarantees: never True when the exact computation would give the bound or more: ``d`` is
shrunk by :data:`MARGIN` (in log units, orders of magnitude above the rounding of ``log`` and
``exp``), which also covers a ``log`` that is not monotonic by an ulp. False says nothing
(the caller computes the noise limit). Pure.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

#: How far inside the bound (log units) the proof must hold.
MARGIN = 1e-9


def noise_below(ratios: Sequence[float], k: float, bound: float) -> bool:
    """True only if ``exp(mid + k x MAD) < bound`` over the logs of ``ratios`` (sorted, all
    positive, at least one; False when some is not finite), ``mid`` their median, ``k`` > 0
    (see the module docstring)."""
    n = len(ratios)
    if not math.isfinite(sum(ratios)):  # (their order and bisection would mean nothing)
        return False
    half = n // 2
    mid = (math.log(ratios[half]) if n % 2
           else (math.log(ratios[half - 1]) + math.log(ratios[half])) / 2.0)
    d = (math.log(bound) - MARGIN - mid) / k - MARGIN
    if not d > 0.0:                     # (a NaN or an infinite bound: no proof)
        return False
    lo, hi = math.exp(mid - d), math.exp(mid + d)
    # Ratios strictly inside (lo, hi): at least the upper middle rank of them bounds the MAD.
    return bisect_left(ratios, hi) - bisect_right(ratios, lo) >= half + 1
