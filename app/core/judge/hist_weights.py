"""Routing weights of histogram pairs: how much slower a node is than its peers, from buckets.

Owns the target weights of a histogram model's peers at one tick (:func:`targets`, the
:class:`~tailguard.core.contract.types.WeightEvidence` that :func:`tailguard.core.judge.weights.weigh_model`
confirms and guards as for sample pairs). No interpolated P50 (in a bucket 2.5x wide a node
1.05x slower can read 1.3x): per metric and hardware class, each node's slow-down against the
peers' median CDF from the bounds where that CDF is inside [``EDGE``, 1 - ``EDGE``] (at least
two: :func:`log_shift`): the CDFs' gaps in probit units, weighted by their binomial information,
over the reference's probit slope in log latency. Exact for a lognormal at any bucket widths,
within 6 % for Weibull shapes; standard error from the counts. Bucketless windows (Triton's
counters): their log mean against the peers'. With a :class:`~tailguard.core.judge.hist_trend.HistTrend`
a node's median over recent windows is judged too (buckets and means agreeing), the lower kept.

Guarantees: pure; no estimate (no weight: held at 1.0) below ``min_peers`` windows of the same
bounds in the class, or with a reference inside fewer than two bounds (the buckets cannot tell);
other buckets are estimated on shared bounds or against the reference read at their own
(:func:`cdf_at`); the band is at least ``NOISE_K`` times the peers' robust spread and the node's
own standard error; a single window's mean gives no target. Rationale, resolution and
measurements: docs/rules.md (Routing weights, Histogram models).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Set
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WeightEvidence
from tailguard.core.judge.hist_rules import HIST_SIGNAL, rebucket, reference, windows_of
from tailguard.core.judge.hist_trend import HistTrend, peer_spread, trend_noise
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


@dataclass(frozen=True, slots=True)
class _Estimates:
    """One class's slow-downs on one metric at one window."""

    signal: str
    rel: dict[str, tuple[float, float, int]]   # node -> (log slow-down against the centre, SE, samples)
    spread: float                               # the peers' robust spread of log slow-downs
    ref_us: float                               # the reference's median (bucketless: mean), µs
    kind: str = "buckets"                       # or "mean": of sums over requests

    @property
    def peers(self) -> int:
        return len(self.rel)


def targets(peers: PeerSet, st: DetectorSettings, want: Set[str] = frozenset(),
            trend: HistTrend | None = None, now_s: float | None = None,
            unresolved: Set[str] = frozenset()) -> dict[str, WeightEvidence]:
    """The target weight and evidence of every histogram peer slower than its class's noise
    band floor, and of the peers in ``want`` (those with a weight state) that have an estimate.
    Per signal and class, on the signal's metric, or, when its buckets give fewer than
    ``min_peers`` estimates (a narrow ITL inside one wide bucket), on every other metric that
    gives them, each node's lowest target (a node slower in decode only shows it in e2e, not in
    ttft); the evidence's ``signal`` names the metric used. With ``trend`` (and ``now_s``), each
    window's estimates are recorded in it and a node's mean over its recent windows is judged
    too (:mod:`tailguard.core.judge.hist_trend`), the lower target kept. On a metric in
    ``unresolved`` (hist_resolution) whose buckets give no estimate, the windows' means do."""
    groups: dict[tuple[str, str], list[tuple[str, dict[str, HistWindow], int]]] = {}
    for node, s in zip(peers.nodes, peers.summaries, strict=True):
        wins = windows_of(s)
        if wins is not None and s.signal.endswith(HIST_SIGNAL):
            groups.setdefault((s.signal, hw_class(s.hardware)), []).append((node, wins, s.samples))
    out: dict[str, WeightEvidence] = {}
    for (signal, cls), members in groups.items():
        first = signal.removesuffix(HIST_SIGNAL)
        est = _estimates(first, members, st, unresolved)
        found = ([est] if est is not None else
                 [e for m in PREFERENCE if m != first if (e := _estimates(m, members, st, unresolved)) is not None])
        got: dict[str, WeightEvidence] = {}
        for e in found:
            # A window's mean alone is no evidence: a few long requests move it (the trend's median).
            evs = _window_targets(e, st, want) if e.kind == "buckets" else {}
            if trend is not None and now_s is not None:
                evs = _lower(evs, _trend_of(e, members, cls, trend, now_s, st, want))
            got = _lower(got, evs)
        out.update(got)
    return out


def _trend_of(e: _Estimates, members: list[tuple[str, dict[str, HistWindow], int]], cls: str,
              trend: HistTrend, now_s: float, st: DetectorSettings, want: Set[str]) -> dict[str, WeightEvidence]:
    """The trend targets of ``e``'s metric: on bucket windows with sums, those of the buckets'
    estimates and of the means must agree (each node's higher target of the two: the buckets'
    estimate is no exact measure on a distribution that is no lognormal, and a mean is moved by
    a few long requests); bucketless windows have only the means."""
    metric = e.signal.removesuffix(HIST_SIGNAL)
    got = _trend_targets(e, f"{e.signal}|{cls}", trend, now_s, st, want)
    if e.kind == "mean":
        return got
    rows = [(node, w, samples) for node, wins, samples in members
            if node in e.rel and (w := wins.get(metric)) is not None]
    means = _mean_estimates(e.signal, rows, st) if all(w.sum_s is not None for _, w, _ in rows) else None
    if means is None:
        return got
    by_mean = _trend_targets(means, f"{e.signal}~mean|{cls}", trend, now_s, st, want)
    out = {}
    for node in got.keys() | by_mean.keys():
        a, b = got.get(node), by_mean.get(node)
        if a is not None and b is not None:
            out[node] = a if a.target >= b.target else b
        elif node in want and (ev := a if a is not None else b) is not None:
            out[node] = ev       # the other has no estimate of it this window
    return out


def _lower(a: dict[str, WeightEvidence], b: Mapping[str, WeightEvidence]) -> dict[str, WeightEvidence]:
    """Per node the evidence with the lower target (``a``'s on a tie)."""
    out = dict(a)
    for node, ev in b.items():
        if node not in out or ev.target < out[node].target:
            out[node] = ev
    return out


def _estimates(metric: str, members: list[tuple[str, dict[str, HistWindow], int]],
               st: DetectorSettings, unresolved: Set[str] = frozenset()) -> _Estimates | None:
    """Each node's log slow-down against its class on ``metric`` (module docstring); None when
    the buckets give fewer than ``min_peers`` estimates (no reference, or a reference inside
    too few bounds) unless ``metric`` is in ``unresolved``. Bucketless windows (Triton's
    counters) and those of an unresolved metric without estimates: :func:`_mean_estimates`."""
    signal = metric + HIST_SIGNAL
    rows = [(node, w, samples) for node, wins, samples in members
            if (w := wins.get(metric)) is not None and w.requests >= st.min_samples]
    bounds = _common_bounds(rows) if rows else ()
    if rows and not bounds:
        return _mean_estimates(signal, [r for r in rows if not r[1].bounds_s], st)
    rows = [r for r in rows if r[1].bounds_s]
    others = [r for r in rows if r[1].bounds_s != bounds]
    rows = [r for r in rows if r[1].bounds_s == bounds]
    ref = reference([w for _, w, _ in rows]) if len(rows) >= st.min_peers else None
    if ref is None:
        return None
    est = {node: (e, samples) for node, w, samples in rows
           if (e := log_shift(bounds, ref.cdf, w)) is not None}
    if len(est) < st.min_peers:
        # Most requests below the first bound: only the means tell the nodes apart (hist_mean).
        return _mean_estimates(signal, rows + others, st) if metric in unresolved else None
    centre = median([lf for (lf, _), _ in est.values()])
    spread = log_spread([math.exp(lf - centre) for (lf, _), _ in est.values()])
    # Nodes with other buckets (another server version): on the bounds they share with the
    # reference, against the same centre and band.
    for node, w, samples in others:
        if (e := _shift_on_shared(ref.bounds_s, ref.cdf, w)) is not None:
            est[node] = (e, samples)
    return _Estimates(signal, {node: (lf - centre, se, samples) for node, ((lf, se), samples) in est.items()},
                      spread, _ref_p50_us(ref.bounds_s, ref.cdf))


def _mean_estimates(signal: str, rows: list[tuple[str, HistWindow, int]],
                    st: DetectorSettings) -> _Estimates | None:
    """Bucketless windows: each node's log mean against the peers' median log mean; a node's
    standard error is the peers' robust spread of log means (windows of the class's median
    request count), scaled by ``sqrt(median count / its count)`` (a mean of n requests)."""
    logs = {node: (math.log(w.sum_s / w.observations), w.observations, samples)
            for node, w, samples in rows if w.sum_s is not None and w.sum_s > 0}
    if len(logs) < st.min_peers:
        return None
    centre = median([lm for lm, _, _ in logs.values()])
    spread = log_spread([math.exp(lm - centre) for lm, _, _ in logs.values()])
    n_mid = median([float(n) for _, n, _ in logs.values()])
    return _Estimates(signal, {node: (lm - centre, spread * math.sqrt(n_mid / n), samples)
                               for node, (lm, n, samples) in logs.items()},
                      spread, math.exp(centre) * US_PER_S, "mean")


def _window_targets(e: _Estimates, st: DetectorSettings, want: Set[str]) -> dict[str, WeightEvidence]:
    """The targets of one window's estimates: a node is noise within ``NOISE_K`` times the
    peers' spread and its own SE (and :data:`BAND_FLOOR`)."""
    floor = max(BAND_FLOOR, NOISE_K * e.spread)
    out: dict[str, WeightEvidence] = {}
    for node, (rel, se, samples) in sorted(e.rel.items()):
        if rel <= floor and node not in want:
            continue
        band = math.exp(max(floor, NOISE_K * se))
        value = e.ref_us * math.exp(rel)
        out[node] = WeightEvidence(signal=e.signal, value=value, ref=e.ref_us, band=band,
                                   target=target_weight(value, e.ref_us, band, st.min_weight),
                                   samples=samples, peers=e.peers)
    return out


def _trend_targets(e: _Estimates, key: str, trend: HistTrend, now_s: float, st: DetectorSettings,
                   want: Set[str]) -> dict[str, WeightEvidence]:
    """``e`` recorded in ``trend``; the targets of the nodes' means over their windows of the
    last ``max_sample_age_s`` (:func:`tailguard.core.judge.hist_trend.trend_noise`)."""
    trend.record(key, now_s, st.max_sample_age_s, {n: (rel, se) for n, (rel, se, _) in e.rel.items()}, e.spread)
    avgs = trend.averages(key, e.rel)
    spread, window = peer_spread(avgs), trend.window_noise(key)
    out: dict[str, WeightEvidence] = {}
    for node, a in sorted(avgs.items()):
        band = max(BAND_FLOOR, NOISE_K * trend_noise(a, spread, window))
        if a.rel <= band and node not in want:
            continue
        value = e.ref_us * math.exp(a.rel)
        out[node] = WeightEvidence(signal=e.signal, value=value, ref=e.ref_us, band=math.exp(band),
                                   target=target_weight(value, e.ref_us, math.exp(band), st.min_weight),
                                   samples=e.rel[node][2], peers=e.peers)
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
