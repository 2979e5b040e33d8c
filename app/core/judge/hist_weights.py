"""Routing weights of histogram pairs: how much slower a node is than its peers, from buckets.

Owns the target weights of a histogram model's peers at one tick (:func:`targets`, the
:class:`~tailguard.core.contract.types.WeightEvidence` that :func:`tailguard.core.judge.weights.weigh_model`
confirms and guards as for sample pairs). An interpolated P50 is no measure here: inside a
bucket 2.5x wide a node 1.05x slower can read 1.3x. Instead, per metric and hardware class,
each node's slow-down against the peers' median CDF is estimated from the bounds where that
CDF is inside [``EDGE``, 1 - ``EDGE``] (at least two: :func:`log_shift`): at each bound the
gap between the two CDFs in probit units, weighted by its binomial information on the node's
requests, divided by the reference's probit slope in log latency. Exact for a lognormal at
any bucket widths, within 6 % for Weibull shapes; its standard error comes from the counts.

Guarantees: pure; no estimate (so no weight: held at 1.0) for a node whose class has fewer
than ``min_peers`` windows of the same bounds, or whose reference spans fewer than two bounds
(a narrow distribution inside one wide bucket: the buckets cannot tell) of those the node has
(a node with other buckets is estimated on the bounds it shares, or, sharing fewer than two,
against the reference read at its own bounds: :func:`cdf_at`); the noise band is at
least ``NOISE_K`` times the peers' robust spread of estimates and the node's own standard
error, as for sample pairs. Rationale and resolution: docs/rules.md (Routing weights).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Set
from statistics import NormalDist
from typing import Final

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WeightEvidence
from tailguard.core.judge.hist_rules import HIST_SIGNAL, rebucket, reference, windows_of
from tailguard.core.judge.peers import PeerSet, hw_class, median
from tailguard.core.judge.weights import BAND_FLOOR, NOISE_K, log_spread, target_weight
from tailguard.core.window.hist_window import PREFERENCE, US_PER_S, HistWindow

# Bounds where the reference CDF is within [EDGE, 1 - EDGE] carry the estimate.
EDGE: Final = 0.05
_N = NormalDist()


def log_shift(bounds_s: tuple[float, ...], ref_cdf: tuple[float, ...], w: HistWindow,
              ) -> tuple[float, float] | None:
    """``(log factor, its standard error)`` of ``w`` against the reference CDF (module
    docstring); None when fewer than two bounds carry it or the reference does not rise."""
    idx = [j for j, r in enumerate(ref_cdf) if EDGE <= r <= 1.0 - EDGE]
    if len(idx) < 2:
        return None
    xs = [math.log(bounds_s[j]) for j in idx]
    zr = [_N.inv_cdf(ref_cdf[j]) for j in idx]
    mx, mz = sum(xs) / len(xs), sum(zr) / len(zr)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (z - mz) for x, z in zip(xs, zr, strict=True)) / sxx
    if not slope > 0:
        return None
    n = max(1, min(w.requests, w.observations))     # requests: a request's tokens are not independent
    eps = 0.5 / n
    obs = w.observations
    num = den = 0.0
    acc = 0
    cum = []
    for c in w.counts[:-1]:
        acc += c
        cum.append(acc / obs)
    for j, z_ref in zip(idx, zr, strict=True):
        f = min(1.0 - eps, max(eps, cum[j]))
        z = _N.inv_cdf(f)
        info = n * _N.pdf(z) ** 2 / (f * (1.0 - f))
        num += info * (z_ref - z)
        den += info
    return num / den / slope, 1.0 / math.sqrt(den) / slope


def targets(peers: PeerSet, st: DetectorSettings, want: Set[str] = frozenset()) -> dict[str, WeightEvidence]:
    """The target weight and evidence of every histogram peer slower than its class's noise
    band floor, and of the peers in ``want`` (those with a weight state) that have an estimate.
    Per signal and class, on the signal's metric, or, when its buckets give fewer than
    ``min_peers`` estimates (a narrow ITL inside one wide bucket), on every other metric that
    gives them, each node's lowest target (a node slower in decode only shows it in e2e, not in
    ttft); the evidence's ``signal`` names the metric used."""
    groups: dict[tuple[str, str], list[tuple[str, dict[str, HistWindow], int]]] = {}
    for node, s in zip(peers.nodes, peers.summaries, strict=True):
        wins = windows_of(s)
        if wins is not None and s.signal.endswith(HIST_SIGNAL):
            groups.setdefault((s.signal, hw_class(s.hardware)), []).append((node, wins, s.samples))
    out: dict[str, WeightEvidence] = {}
    for (signal, _cls), members in groups.items():
        first = signal.removesuffix(HIST_SIGNAL)
        got = _class_targets(first, members, st, want)
        if got is None:
            got = {}
            for metric in (m for m in PREFERENCE if m != first):
                for node, ev in (_class_targets(metric, members, st, want) or {}).items():
                    if node not in got or ev.target < got[node].target:
                        got[node] = ev
        out.update(got)
    return out


def _class_targets(metric: str, members: list[tuple[str, dict[str, HistWindow], int]],
                   st: DetectorSettings, want: Set[str]) -> dict[str, WeightEvidence] | None:
    """:func:`targets` of one class on one metric's windows; None when the buckets give fewer
    than ``min_peers`` estimates (no reference, or a reference inside too few bounds)."""
    signal = metric + HIST_SIGNAL
    rows = [(node, w, samples) for node, wins, samples in members
            if (w := wins.get(metric)) is not None and w.bounds_s and w.requests >= st.min_samples]
    bounds = _common_bounds(rows) if rows else ()
    others = [r for r in rows if r[1].bounds_s != bounds]
    rows = [r for r in rows if r[1].bounds_s == bounds]
    ref = reference([w for _, w, _ in rows]) if len(rows) >= st.min_peers else None
    if ref is None:
        return None
    est = {node: (e, samples) for node, w, samples in rows
           if (e := log_shift(bounds, ref.cdf, w)) is not None}
    if len(est) < st.min_peers:
        return None
    centre = median([lf for (lf, _), _ in est.values()])
    spread = log_spread([math.exp(lf - centre) for (lf, _), _ in est.values()])
    floor = max(BAND_FLOOR, NOISE_K * spread)
    ref_us = _ref_p50_us(ref.bounds_s, ref.cdf)
    # Nodes with other buckets (another server version): on the bounds they share with the
    # reference, against the same centre and band.
    for node, w, samples in others:
        if (e := _shift_on_shared(ref.bounds_s, ref.cdf, w)) is not None:
            est[node] = (e, samples)
    out: dict[str, WeightEvidence] = {}
    for node, ((lf, se), samples) in sorted(est.items()):
        rel = lf - centre
        if rel <= floor and node not in want:
            continue
        band = math.exp(max(floor, NOISE_K * se))
        value = ref_us * math.exp(rel)
        out[node] = WeightEvidence(signal=signal, value=value, ref=ref_us, band=band,
                                   target=target_weight(value, ref_us, band, st.min_weight),
                                   samples=samples, peers=len(est))
    return out


def _shift_on_shared(ref_bounds_s: tuple[float, ...], ref_cdf: tuple[float, ...], w: HistWindow,
                     ) -> tuple[float, float] | None:
    """:func:`log_shift` of ``w`` on the bounds it shares with the reference (exact subsets of
    both); with fewer than two shared (TGI's 1.5^k grid beside vLLM's), against the reference
    read at ``w``'s own bounds (:func:`cdf_at`). None when too few bounds carry it."""
    shared = tuple(sorted(set(ref_bounds_s) & set(w.bounds_s)))
    if len(shared) < 2:
        return log_shift(w.bounds_s, cdf_at(ref_bounds_s, ref_cdf, w.bounds_s), w)
    cdf = tuple(ref_cdf[ref_bounds_s.index(b)] for b in shared)
    return log_shift(shared, cdf, rebucket(w, shared))


def cdf_at(bounds_s: tuple[float, ...], cdf: tuple[float, ...], at_s: tuple[float, ...]) -> tuple[float, ...]:
    """The CDF given at ``bounds_s`` read at the bounds ``at_s``: exact at a shared bound, between
    two bounds interpolated linearly in probit units over log latency (exact for a lognormal);
    NaN (no estimate there: :func:`log_shift` skips it) outside ``bounds_s`` or next to a
    bound where the CDF is 0 or 1 (no probit)."""
    out = []
    for b in at_s:
        k = bisect.bisect_left(bounds_s, b)
        if k < len(bounds_s) and bounds_s[k] == b:
            out.append(cdf[k])
        elif 0 < k < len(bounds_s) and cdf[k - 1] > 0.0 and cdf[k] < 1.0:
            lo, hi = math.log(bounds_s[k - 1]), math.log(bounds_s[k])
            z_lo, z_hi = _N.inv_cdf(cdf[k - 1]), _N.inv_cdf(cdf[k])
            out.append(_N.cdf(z_lo + (z_hi - z_lo) * (math.log(b) - lo) / (hi - lo)))
        else:
            out.append(math.nan)
    return tuple(out)


def _common_bounds(rows: list[tuple[str, HistWindow, int]]) -> tuple[float, ...]:
    tally: dict[tuple[float, ...], int] = {}
    for _, w, _ in rows:
        tally[w.bounds_s] = tally.get(w.bounds_s, 0) + 1
    return max(sorted(tally), key=lambda b: tally[b])


def _ref_p50_us(bounds_s: tuple[float, ...], cdf: tuple[float, ...]) -> float:
    """The reference's median for people (µs): the log-latency where its probit line through
    the two bounds around 0.5 crosses zero, within that bucket."""
    k = next((j for j, f in enumerate(cdf) if f >= 0.5), len(cdf) - 1)
    lo = max(k - 1, 0)
    hi = lo + 1 if lo + 1 < len(cdf) else lo
    f_lo, f_hi = (min(1 - 1e-6, max(1e-6, cdf[j])) for j in (lo, hi))
    z_lo, z_hi = _N.inv_cdf(f_lo), _N.inv_cdf(f_hi)
    if hi == lo or z_hi <= z_lo:
        return bounds_s[k] * US_PER_S
    x = math.log(bounds_s[lo]) + (math.log(bounds_s[hi]) - math.log(bounds_s[lo])) * (-z_lo) / (z_hi - z_lo)
    top = bounds_s[k]
    bottom = bounds_s[k - 1] if k > 0 else bounds_s[0] / 2.0
    return min(top, max(bottom, math.exp(x))) * US_PER_S
