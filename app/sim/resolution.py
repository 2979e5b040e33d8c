"""What each server's default buckets let the histogram rules see: ``python -m tailguard.sim.resolution``.

For one histogram layout (each server's default buckets, :data:`tailguard.sim.exposition.SERVERS`)
and a lognormal latency of median ``m`` and log-spread ``sigma``, :func:`smallest_factor` finds the
smallest slow-down factor of one node's whole distribution that the real rule
(:func:`tailguard.core.judge.hist_rules.judge_metric`, ``relative_p50``) flags, given the expected
bucket counts of ``requests`` requests for the node and for each of its peers. :func:`table`
sweeps the median over each layout's range and prints, per decade of medians, the worst and the
best such factor, and the medians no factor up to ``MAX_FACTOR`` makes visible. docs/scrape.md
quotes its output.

Guarantees: deterministic (expected counts, no sampling); the rule is the one stage 2 runs, with
default settings.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from typing import Final

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.health import Verdict
from tailguard.core.judge.hist_rules import judge_metric, reference
from tailguard.core.window.hist_window import HistWindow
from tailguard.sim.exposition import SERVERS

MAX_FACTOR: Final = 10.0
STEP: Final = 1.02


def _counts(bounds: Sequence[float], median_s: float, sigma: float, n: int) -> tuple[int, ...]:
    cdf = [0.5 * (1.0 + math.erf(math.log(b / median_s) / (sigma * math.sqrt(2.0)))) for b in bounds]
    edges = [0.0, *cdf, 1.0]
    return tuple(round(n * (hi - lo)) for lo, hi in itertools.pairwise(edges))


def smallest_factor(bounds: Sequence[float], median_s: float, sigma: float, requests: int = 600,
                    st: DetectorSettings | None = None) -> float | None:
    """The smallest factor (a grid of ``STEP``) flagged ``relative_p50``; None up to ``MAX_FACTOR``."""
    st = st or DetectorSettings()
    b = tuple(float(x) for x in bounds if x > 0)
    peer = HistWindow(b, _counts(b, median_s, sigma, requests), requests, None, 30.0)
    ref = reference([peer] * 8)
    if ref is None:
        return None
    s = WindowSummary("n", "m", 0.0, "e2e_hist", requests, None, None, None, None)
    f = STEP
    while f <= MAX_FACTOR:
        node = HistWindow(b, _counts(b, median_s * f, sigma, requests), requests, None, 30.0)
        if judge_metric("e2e", node, ref, s, st).verdict is Verdict.ABNORMAL:
            return round(f, 2)
        f *= STEP
    return None


def table(sigma: float, requests: int = 600) -> list[str]:
    """One line per server histogram and decade of medians (module docstring)."""
    out = [f"sigma={sigma:g}, {requests} requests per window: smallest whole-distribution slow-down"
           " flagged (worst..best over the medians of each decade); '-' = none up to 10x"]
    for name, d in SERVERS.items():
        for which in ("e2e", "ttft", "itl"):
            h = getattr(d, which)
            if h is None:
                continue
            bounds = [b for b in h.bounds_s if b > 0]
            lo_dec = math.floor(math.log10(bounds[0])) - 1
            hi_dec = math.floor(math.log10(bounds[-1]))
            for dec in range(lo_dec, hi_dec + 1):
                meds = [10.0 ** (dec + k / 20) for k in range(20)]
                fs = [smallest_factor(bounds, m, sigma, requests) for m in meds]
                seen = [f for f in fs if f is not None]
                worst = "-" if len(seen) < len(fs) else f"{max(seen):.2f}"
                best = "-" if not seen else f"{min(seen):.2f}"
                out.append(f"{name:7s} {which:5s} median {10.0 ** dec:g}..{10.0 ** (dec + 1):g} s:"
                           f" worst {worst}x, best {best}x")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for sigma in [float(a) for a in args] or [0.3]:
        print("\n".join(table(sigma)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
