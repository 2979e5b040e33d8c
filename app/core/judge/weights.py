"""Stage 2's routing weights: (0, 1] per routed node slower than its peers but not ejected.

Owns each routed peer's weight at one tick (:func:`weigh_model`): how much slower its window
P50 is than its peers' reference (:meth:`tailguard.core.judge.peers.Norms.p50_ref`), mapped to
a target (:func:`target_weight`), confirmed over ``confirm_windows`` windows, moved back up in
steps (:func:`step`), held above the model's total-weight share (:func:`guard`). Rationale
(the mapping, the band, the defaults): docs/rules.md ("Routing weights").

Guarantees:

* A node within the noise of its peers has target 1.0 (:func:`noise_band`: at least
  :data:`BAND_FLOOR` and :data:`NOISE_K` robust standard deviations).
* A weight is in ``[min_weight, 1]`` on a :data:`WEIGHT_STEP` grid; down only when the last
  ``confirm_windows`` targets are all :data:`DEAD_BAND` or more below it, up by at most
  :data:`UP_STEP` per tick; so a weight below 1.0 is at most 0.9.
* Nothing moves without evidence: below ``min_peers`` peers, on a load event, or for a node
  with no judged window this tick, weights and their confirmation are held.
* Only routed nodes have a weight (one back in routing starts at 1.0); the output holds the
  nodes below 1.0, whose weights with the others' sum to at least ``min_total_weight_share``
  of the routed nodes' number. Pure: ``weigh_model`` returns the new state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import NodeStatus, WeightChange, WeightEvidence
from tailguard.core.judge.peers import Norms, PeerSet, hw_class

# Target weight = (peers' reference x band / node's P50) ** WEIGHT_EXPONENT: a node k times
# slower than the band edge gets 1/k² of a healthy node's share (see docs/rules.md).
WEIGHT_EXPONENT = 2.0
# Weights live on this grid (fewer changes for load balancers, no churn on the last digit).
WEIGHT_STEP = 0.05
# The most a weight rises in one tick once its recovery is confirmed.
UP_STEP = 0.1
# A weight moves only when every recent target is at least this far from it (two grid steps):
# a window's P50 noise moves the target by about one step, and it must not move the weight.
DEAD_BAND = 0.1
# The noise band: at least this log factor (a node within 10 % of its peers is never weighted)…
BAND_FLOOR = math.log(1.1)
# …and at least this many robust standard deviations of the noise.
NOISE_K = 4.0
# A normal distribution's MAD x this = its standard deviation.
MAD_SIGMA = 1.4826
# log(P99/P50) of a lognormal = this x its sigma; a median of n samples has a standard error
# of sqrt(pi/2) x sigma / sqrt(n).
Z99 = 2.3263
MEDIAN_SE = math.sqrt(math.pi / 2.0)
_FLOOR_FACTOR = math.exp(BAND_FLOOR)


@dataclass(frozen=True, slots=True)
class NodeWeight:
    """One node's weight and the targets of its last windows (newest last, at most
    ``confirm_windows``): what confirms the next move."""

    weight: float = 1.0
    recent: tuple[float, ...] = ()

    def to_list(self) -> list[Any]:
        return [self.weight, list(self.recent)]

    @classmethod
    def from_list(cls, v: Any) -> NodeWeight:
        weight, recent = v
        w = float(weight)
        if not 0.0 < w <= 1.0:
            raise ValueError(f"weight {w!r} is not in (0, 1]")
        return cls(w, tuple(float(t) for t in recent))


@dataclass(frozen=True, slots=True)
class WeightState:
    """A model's weights between ticks: per routed node with a weight or a target below 1.0,
    its :class:`NodeWeight`; and the weights last output (after the guard; below 1.0 only)."""

    nodes: Mapping[str, NodeWeight] = field(default_factory=dict)
    out: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": {n: w.to_list() for n, w in sorted(self.nodes.items())},
                "out": dict(sorted(self.out.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WeightState:
        return cls({str(n): NodeWeight.from_list(v) for n, v in d["nodes"].items()},
                   {str(n): float(w) for n, w in d["out"].items()})


class WeightTick(NamedTuple):
    """One model's weights at one tick: the new state, the weights to publish (routed nodes
    below 1.0), the changes against the last tick's, and the evidence of every node judged
    below the band. Immutable (a ``NamedTuple``: one per model per tick)."""

    state: WeightState
    weights: Mapping[str, float]
    changes: tuple[WeightChange, ...] = ()
    evidence: Mapping[str, WeightEvidence] = MappingProxyType({})


NO_WEIGHTS = WeightState()


def quantize(w: float, min_weight: float) -> float:
    """``w`` on the :data:`WEIGHT_STEP` grid (nearest), within ``[min_weight, 1]``."""
    q = round(round(w / WEIGHT_STEP) * WEIGHT_STEP, 4)
    return min(1.0, max(min_weight, q))


def target_weight(value: float, ref: float, band: float, min_weight: float) -> float:
    """``(ref x band / value) ** WEIGHT_EXPONENT`` quantized; 1.0 within the band."""
    edge = ref * band
    if value <= edge:
        return 1.0
    return quantize((edge / value) ** WEIGHT_EXPONENT, min_weight)


def log_spread(values: Sequence[float]) -> float:
    """Robust standard deviation (``MAD_SIGMA x MAD``) of the logs of positive ``values``."""
    n = len(values)
    if n >= 256:                        # numpy's sort beats Python's from here on
        a = np.log(np.asarray(values, dtype=np.float64))
        return MAD_SIGMA * float(np.median(np.abs(a - np.median(a))))
    # log is monotonic: the median of the logs is the log of the (geometric) median, and
    # |log v - log m| orders as max(v/m, m/v): two sorts, three logs.
    s = sorted(values)
    half = n // 2
    m = s[half] if n % 2 else math.sqrt(s[half - 1] * s[half])
    d = sorted([v / m if v >= m else m / v for v in values])
    mad = math.log(d[half]) if n % 2 else 0.5 * (math.log(d[half - 1]) + math.log(d[half]))
    return MAD_SIGMA * mad


def noise_band(spread: float, ratio: float, samples: int) -> float:
    """The band (a factor of the reference) within which a node is noise: the largest of
    :data:`BAND_FLOOR`, ``NOISE_K`` x the peers' robust spread and ``NOISE_K`` x the
    standard error of the node's own log median (its dispersion from its P99/P50 as if
    lognormal, over its ``samples``)."""
    sigma = math.log(ratio) / Z99 if ratio > 1.0 else 0.0
    own = MEDIAN_SE * sigma / math.sqrt(max(samples, 1))
    return math.exp(max(BAND_FLOOR, NOISE_K * spread, NOISE_K * own))


def targets(peers: PeerSet, norms: Norms, st: DetectorSettings,
            want: Set[str] = frozenset()) -> dict[str, WeightEvidence]:
    """The target weight and its evidence of every peer above its class's band floor, and of
    the peers in ``want``. A peer whose class has no reference or fewer than ``min_peers``
    peers gets none (no evidence: its weight is held)."""
    if not norms.enough_peers or not peers.nodes:
        return {}
    nodes, sums, p50s = peers.nodes, peers.summaries, peers.p50s
    groups: list[Sequence[int]]
    if norms.multi_class:
        classes: dict[str, list[int]] = {}
        for i, s in enumerate(sums):
            classes.setdefault(hw_class(s.hardware), []).append(i)
        groups = list(classes.values())
    else:
        groups = [range(len(nodes))]
    # The peers in ``want`` (few: the nodes with a weight state), by position.
    wanted = ({i for i, n in enumerate(nodes) if n in want} if want else set())
    out: dict[str, WeightEvidence] = {}
    for idx in groups:
        if len(idx) < st.min_peers:
            continue
        ref = norms.p50_ref(sums[idx[0]].hardware)
        if ref is None or not ref > 0:
            continue
        # Most ticks no peer is above the smallest band: no spread to compute.
        lowest_edge = ref * _FLOOR_FACTOR
        whole = len(idx) == len(p50s)       # one class: every peer (no index to follow)
        pick = (set() if whole and max(p50s) <= lowest_edge
                else {i for i in idx if p50s[i] > lowest_edge})
        if wanted:
            pick |= wanted.intersection(idx)
        if not pick:
            continue
        spread = log_spread(p50s if whole else [p50s[i] for i in idx])
        floor = ref * math.exp(max(BAND_FLOOR, NOISE_K * spread))
        for i in sorted(pick):
            p50 = p50s[i]
            if p50 <= floor and i not in wanted:
                continue                    # within the noise whatever its own: target 1.0
            s = sums[i]
            band = floor / ref if p50 <= floor else noise_band(spread, peers.ratios[i],
                                                               s.samples)
            out[nodes[i]] = WeightEvidence(
                signal=s.signal, value=p50, ref=ref, band=band,
                target=target_weight(p50, ref, band, st.min_weight), samples=s.samples,
                peers=len(idx))
    return out


def step(nw: NodeWeight, target: float, confirm: int) -> NodeWeight:
    """One window's ``target`` into ``nw``: down to the highest of the last ``confirm``
    targets when all are at least :data:`DEAD_BAND` below the weight, up by at most
    :data:`UP_STEP` (to the lowest of them) when all are at least :data:`DEAD_BAND` above it
    (or all 1.0); else the weight stays."""
    recent = (*nw.recent, target)[-confirm:]
    w = nw.weight
    if len(recent) == confirm:
        hi = max(recent)
        if hi <= w - DEAD_BAND + 1e-9:
            return NodeWeight(hi, recent)
        lo = min(recent)
        if lo > w and lo >= min(1.0, w + DEAD_BAND) - 1e-9:
            return NodeWeight(min(lo, round(w + UP_STEP, 4)), recent)
    return NodeWeight(w, recent)


def guard(weights: Mapping[str, float], n_routed: int, share: float) -> dict[str, float]:
    """``weights`` (routed nodes below 1.0) raised together, each by the same share of its
    distance to 1.0 (then up to the grid), until the routed nodes' total weight is at least
    ``share`` of ``n_routed``."""
    missing = sum(1.0 - w for w in weights.values())
    allowed = (1.0 - share) * n_routed
    if missing <= allowed + 1e-9:
        return dict(weights)
    keep = allowed / missing            # the share of each node's reduction that is kept
    out: dict[str, float] = {}
    for n, w in weights.items():
        g = math.ceil(round((1.0 - keep * (1.0 - w)) / WEIGHT_STEP, 6)) * WEIGHT_STEP
        if g < 1.0:
            out[n] = round(g, 4)
    return out


def weigh_model(model: str, state: WeightState, peers: PeerSet, norms: Norms,
                routed: Iterable[str], now_s: float, st: DetectorSettings,
                *, hold: bool = False,
                evidence_of: Callable[[Set[str]], Mapping[str, WeightEvidence]] | None = None) -> WeightTick:
    """One tick of ``model``'s weights. ``routed``: the routing set after the tick (its nodes
    are the only ones with a weight); ``hold``: a load event or lost telemetry (no weight and
    no confirmation moves); ``evidence_of``: the targets (given the nodes with a weight state)
    when they are not the P50s' (histogram pairs: :mod:`tailguard.core.judge.hist_weights`)."""
    routed_set = routed if isinstance(routed, frozenset | set) else frozenset(routed)
    evidence = ({} if hold else targets(peers, norms, st, state.nodes.keys()) if evidence_of is None
                else evidence_of(state.nodes.keys()))
    if not evidence and not state.nodes and not state.out:
        # Nothing to weigh or step (most models, most ticks), and no weight below 1.0 for the
        # guard to raise (``min_total_weight_share`` is at most 1).
        return WeightTick(NO_WEIGHTS, {})
    nodes: dict[str, NodeWeight] = {}
    for node, nw in state.nodes.items():
        if node in routed_set:
            ev = evidence.get(node)
            nodes[node] = nw if ev is None else step(nw, ev.target, st.confirm_windows)
    for node, ev in evidence.items():
        if node not in nodes and ev.target < 1.0 and node in routed_set:
            nodes[node] = step(NodeWeight(), ev.target, st.confirm_windows)
    # A node back at 1.0 with nothing below 1.0 to confirm needs no state.
    nodes = {n: nw for n, nw in nodes.items() if nw.weight < 1.0 or min(nw.recent) < 1.0}
    raw = {n: nw.weight for n, nw in nodes.items() if nw.weight < 1.0}
    out = guard(raw, len(routed_set), st.min_total_weight_share)
    changes = []
    before = state.out
    for node in sorted(out.keys() | (before.keys() & routed_set)):
        w, prev = out.get(node, 1.0), before.get(node, 1.0)
        if w == prev:
            continue
        reason = ("total_weight_guard" if out.get(node, 1.0) != raw.get(node, 1.0)
                  else "slower_than_peers" if w < prev else "recovering")
        changes.append(WeightChange(now_s, node, model, w, prev, reason, evidence.get(node)))
    shown = {n: ev for n, ev in evidence.items() if ev.target < 1.0 or n in nodes}
    return WeightTick(WeightState(nodes, out), out, tuple(changes), shown)


def weigh_statuses(statuses: Iterable[NodeStatus], wt: WeightTick) -> tuple[NodeStatus, ...]:
    """``statuses`` with their routed nodes' weight (and why, below 1.0)."""
    out = []
    for s in statuses:
        if s.routed:
            w = wt.weights.get(s.node_id, 1.0)
            ev = wt.evidence.get(s.node_id)
            detail = None
            if w < 1.0 or ev is not None:
                nw = wt.state.nodes.get(s.node_id)
                detail = "; ".join(x for x in (
                    None if ev is None else ev.text(),
                    None if nw is None else "last targets " + ", ".join(f"{t:g}" for t in nw.recent),
                    "raised by the total-weight guard" if nw is not None and w > nw.weight else None)
                    if x)
            s = replace(s, weight=w, weight_detail=detail)
        out.append(s)
    return tuple(out)
