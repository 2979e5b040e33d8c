"""A model's peers at one tick and the references ("norms") the rules compare against.

Owns :class:`Peer` (a routed, warmed-up pair with judged data), the
per-tick references built from the peers — :class:`Norms` (fleet and
per-hardware-class medians of P50 and P99, the tail limit, the fleet's
movement against its slow baseline) for window and for fresh P50s — and
:class:`Limits`, one hardware class's references times the relative
factors, computed once per class per tick.

Guarantees: pure functions of the peers, the settings and the slow baseline
they are given; nothing here changes state. Below ``min_peers`` peers there
is no relative reference (``Norms.enough_peers`` is False, ``p50_ref`` and
``p99_ref`` are None) and the tail limit is ``ratio_threshold``. A class too
small for its own median is referenced by its slow baseline moved with the
fleet, once that baseline has :data:`SMALL_CLASS_MIN_TICKS` ticks; until
then it has no P50 reference.

Rationale: docs/rules.md.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import NamedTuple, overload

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.health import PairState
from tailguard.core.judge.peer_sort import sort_columns
from tailguard.core.judge.tail_noise import noise_below

# A hardware class with fewer than min_peers peers is judged by P50 against its own baseline
# (moved with the fleet) once that baseline has this many ticks behind it.
SMALL_CLASS_MIN_TICKS = 4
# The tail limit is at least this many robust standard deviations (1.4826 x MAD) of the
# peers' log P99/P50 above their median (see tail_limit).
TAIL_NOISE_K = 4.0


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (mean of the middle two when even)."""
    return median_sorted(sorted(values))


def median_sorted(s: Sequence[float]) -> float:
    """:func:`median` of a non-empty sequence already sorted."""
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def hw_class(hardware: str | None) -> str:
    """The hardware class a pair is compared within ("" when it reports none)."""
    return hardware if hardware is not None else ""


class Peer(NamedTuple):
    """A routed, warmed-up pair with judged data: its window's P50 and P99/P50.

    Immutable; a ``NamedTuple`` rather than a frozen dataclass for the reason
    :class:`~tailguard.core.contract.types.WindowSummary` is one: one per series per tick.
    """

    node_id: str
    summary: WindowSummary
    p50: float
    ratio: float


# A peer as a plain tuple (what Peer holds, without making one).
PeerRow = tuple[str, WindowSummary, float, float]


class PeerSet(Sequence[Peer]):
    """The peers of one tick (:func:`gather_peers`), kept as columns: a sequence of
    :class:`Peer` made on first use (most ticks need only the columns; a ``Peer`` per
    pair per tick costs more than all the rules of a quiet one). Also the peers whose pair
    is not healthy or has an abnormal streak (``unsettled``: a normal verdict moves them)
    and the positions of those with a fresh-tail count (``fresh_over_at``:
    ``WindowSummary.fresh_over``).
    Read-only once built."""

    __slots__ = ("_peers", "fresh_over_at", "nodes", "p50s", "ratios", "summaries", "unsettled")

    def __init__(self, nodes: list[str], summaries: list[WindowSummary], p50s: list[float],
                 ratios: list[float], unsettled: list[str], fresh_over_at: list[int]) -> None:
        self.nodes = nodes
        self.summaries = summaries
        self.p50s = p50s
        self.ratios = ratios
        self.unsettled = unsettled
        self.fresh_over_at = fresh_over_at
        self._peers: list[Peer] | None = None

    @property
    def peers(self) -> list[Peer]:
        if self._peers is None:
            # Peer(...) without NamedTuple's Python-level __new__.
            self._peers = list(map(tuple.__new__, itertools.repeat(Peer), self.rows()))
        return self._peers

    def rows(self) -> Iterator[PeerRow]:
        """The peers as plain ``(node, summary, p50, ratio)`` tuples (no ``Peer`` made)."""
        return zip(self.nodes, self.summaries, self.p50s, self.ratios, strict=True)

    def __len__(self) -> int:
        return len(self.nodes)

    @overload
    def __getitem__(self, i: int) -> Peer: ...
    @overload
    def __getitem__(self, i: slice) -> list[Peer]: ...
    def __getitem__(self, i: int | slice) -> Peer | list[Peer]:
        if self._peers is None and isinstance(i, int):     # one peer: make only that one
            return Peer(self.nodes[i], self.summaries[i], self.p50s[i], self.ratios[i])
        return self.peers[i]

    def __iter__(self) -> Iterator[Peer]:
        return iter(self.peers)


def gather_peers(by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                 min_samples: int, rare: AbstractSet[str] | None = None,
                 streaked: AbstractSet[str] | None = None) -> PeerSet:
    """The peers among ``by_node`` (in its order), as a :class:`PeerSet`: routed pairs past
    warm-up with at least ``min_samples`` judged samples and a positive P50, all in one
    signal's units.

    Stage-1 workers choose the signal per model from the series they hold; when their
    choices differ (several workers, a fleet half of which sends token counts), the peers
    are the summaries of the signal most of them carry (ties: the most judged samples,
    then the name): a node is never compared with peers in other units, and one in a
    minority signal is not judged by the relative rules that tick.

    ``rare``: the nodes whose pair is not healthy and routed (``PairTable.rare``), if known;
    ``streaked``: those whose pair has an abnormal streak (``PairTable.streaked``), if known."""
    if rare is not None and by_node and by_node.keys().isdisjoint(rare):
        settled = _settled_peers(by_node, pairs, min_samples, streaked)
        if settled is not None:
            return settled
    nodes: list[str] = []
    sums: list[WindowSummary] = []
    p50s: list[float] = []
    ratios: list[float] = []
    unsettled: list[str] = []
    over: list[int] = []
    first: str | None = None
    mixed = False
    warming, healthy = HealthState.WARMING, HealthState.HEALTHY
    add_node, add_summary, add_p50, add_ratio = nodes.append, sums.append, p50s.append, ratios.append
    for node, s in by_node.items():
        p = pairs[node]
        state = p.state
        if not p.routed or state is warming:
            continue
        p50, p99 = s.p50, s.p99
        if s.samples >= min_samples and p50 is not None and p99 is not None and p50 > 0:
            add_node(node)
            add_summary(s)
            add_p50(p50)
            add_ratio(p99 / p50)
            if state is not healthy or p.abnormal_streak:
                unsettled.append(node)
            if s.fresh_over:
                over.append(len(nodes) - 1)
            if first is None:
                first = s.signal
            elif s.signal != first:
                mixed = True
    if mixed:
        tally: dict[str, list[int]] = {}
        for s in sums:
            t = tally.setdefault(s.signal, [0, 0])
            t[0] += 1
            t[1] += s.samples
        chosen = max(sorted(tally), key=lambda k: (tally[k][0], tally[k][1]))
        keep = [s.signal == chosen for s in sums]
        kept = set(itertools.compress(nodes, keep))
        at = list(itertools.accumulate(keep, initial=-1))   # at[i + 1]: i's kept position
        return PeerSet(list(itertools.compress(nodes, keep)), list(itertools.compress(sums, keep)),
                       list(itertools.compress(p50s, keep)), list(itertools.compress(ratios, keep)),
                       [n for n in unsettled if n in kept], [at[i + 1] for i in over if keep[i]])
    return PeerSet(nodes, sums, p50s, ratios, unsettled, over)


def summary_field(name: str) -> operator.itemgetter[int]:
    """A getter of one :class:`WindowSummary` field by position (faster than by name)."""
    return operator.itemgetter(WindowSummary._fields.index(name))


_P50 = summary_field("p50")
_P99 = summary_field("p99")
_SAMPLES = summary_field("samples")
_SIGNAL = summary_field("signal")
_FRESH_OVER = summary_field("fresh_over")
_HARDWARE = summary_field("hardware")
_FRESH_P50 = summary_field("fresh_p50")
_FRESH_SAMPLES = summary_field("fresh_samples")
_STREAK = operator.attrgetter("abnormal_streak")


def _settled_peers(by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                   min_samples: int, streaked: AbstractSet[str] | None) -> PeerSet | None:
    """:func:`gather_peers` of pairs all healthy and routed, column by column: the same
    peers when every window qualifies (enough samples, positive P50, a P99) in one signal;
    None otherwise (the pair-by-pair look decides)."""
    sums = list(by_node.values())
    p50s = list(map(_P50, sums))
    p99s = list(map(_P99, sums))
    try:
        total = sum(p50s) + sum(p99s)
    except TypeError:                       # some window without a P50 or a P99
        return None
    if (total != total or not min(p50s) > 0 or min(map(_SAMPLES, sums)) < min_samples
            or len(set(map(_SIGNAL, sums))) > 1):
        return None
    nodes = list(by_node)
    # The pairs with a streak: from the index when given (most ticks none: no pair read).
    unsettled = ([] if streaked is not None and not streaked else list(itertools.compress(
        nodes, map(_STREAK, map(pairs.__getitem__, nodes)) if streaked is None
        else map(streaked.__contains__, nodes))))
    return PeerSet(nodes, sums, p50s, list(map(operator.truediv, p99s, p50s)), unsettled,
                   list(itertools.compress(range(len(nodes)), map(_FRESH_OVER, sums))))


def signal_of(peers: Sequence[Peer]) -> str | None:
    if isinstance(peers, PeerSet):       # no Peer made
        return peers.summaries[0].signal if peers.summaries else None
    return peers[0].summary.signal if peers else None


class Norms(NamedTuple):
    """The model's reference numbers at one tick. Immutable; a ``NamedTuple`` (as
    :class:`Peer`): two are made per model per tick (docs/performance.md, session 9)."""

    enough_peers: bool
    fleet_p50: float | None
    class_p50: Mapping[str, float]    # classes whose median is trusted
    multi_class: bool
    tail_limit: float                 # max(ratio_threshold, fleet_ratio_factor × median ratio)
    fleet_p99: float | None = None
    class_p99: Mapping[str, float] = MappingProxyType({})   # (read-only)
    movement: float | None = None     # median of P50 / own class baseline over the peers
    fleet_ratio: float | None = None  # the peers' median P99/P50 (with enough peers)

    def p50_ref(self, hardware: str | None) -> float | None:
        if not self.enough_peers:
            return None
        if self.multi_class:
            return self.class_p50.get(hw_class(hardware))
        return self.fleet_p50

    def p99_ref(self, hardware: str | None) -> float | None:
        if not self.enough_peers:
            return None
        if self.multi_class:
            return self.class_p99.get(hw_class(hardware))
        return self.fleet_p99


class Limits(NamedTuple):
    """One hardware class's references at one tick and the relative rules' denominators
    (the factor × the reference; 0 when there is none: the rule does not apply). Immutable
    (a ``NamedTuple``, as :class:`Norms`)."""

    ref: float | None
    d50: float
    ref99: float | None
    d99: float
    fresh_ref: float | None
    dfresh: float


def limits(norms: Norms, fresh: Norms | None, hardware: str | None,
           st: DetectorSettings) -> Limits:
    ref = norms.p50_ref(hardware)
    ref99 = norms.p99_ref(hardware)
    fresh_ref = None if fresh is None else fresh.p50_ref(hardware)
    f50, f99 = st.relative_p50_factor, st.relative_p99_factor
    return Limits(ref, f50 * ref if ref is not None and ref > 0 else 0.0,
                  ref99, f99 * ref99 if ref99 is not None and ref99 > 0 else 0.0,
                  fresh_ref, f50 * fresh_ref if fresh_ref is not None and fresh_ref > 0 else 0.0)


def window_norms(peers: Sequence[Peer], base_p50: Mapping[str, float],
          base_ticks: Mapping[str, int], st: DetectorSettings) -> Norms:
    """The window references over ``peers``; ``base_p50``/``base_ticks``: the slow baseline
    (log P50 and ticks per class)."""
    if len(peers) < st.min_peers:
        return Norms(False, median([p.p50 for p in peers]) if peers else None, {}, False,
                     st.ratio_threshold)
    p50s = [p.p50 for p in peers]
    ratios = [p.ratio for p in peers]
    p99s = [a * r for a, r in zip(p50s, ratios, strict=True)]
    fleet_p50 = median(p50s)
    multi = len(classes_of(peers)) > 1
    moved = movement([(p.summary, p.p50) for p in peers], base_p50, st.min_peers)
    class_p50: dict[str, float] = {}
    class_p99: dict[str, float] = {}
    if multi:
        classes: dict[str, list[float]] = {}
        classes99: dict[str, list[float]] = {}
        for p, p99 in zip(peers, p99s, strict=True):
            c = hw_class(p.summary.hardware)
            classes.setdefault(c, []).append(p.p50)
            classes99.setdefault(c, []).append(p99)
        class_p50 = class_p50_refs(classes, moved, base_p50, base_ticks, st.min_peers)
        class_p99 = {c: median(v) for c, v in classes99.items() if len(v) >= st.min_peers}
    return Norms(True, fleet_p50, class_p50, multi, tail_limit(ratios, st),
                 median(p99s), class_p99, moved, median(ratios))


def classes_of(peers: Sequence[Peer]) -> set[str]:
    """The hardware classes among ``peers``."""
    return {hw_class(h) for h in {p.summary.hardware for p in peers}}


def fresh_norms(peers: Sequence[Peer], base_p50: Mapping[str, float],
                base_ticks: Mapping[str, int], st: DetectorSettings) -> Norms | None:
    """The reference for fresh P50s: the same choice as for window P50s (fleet median,
    class median, small class's moved baseline), made over the peers' fresh P50s of at least
    ``min_samples`` samples (a fresh P50 of fewer is judged, never a reference).
    ``None`` when fewer than ``min_peers`` peers have one. P50 references only."""
    min_peers, full = st.min_peers, st.min_samples
    fresh = [(s, f) for p in peers if (f := (s := p.summary).fresh_p50) is not None and f > 0
             and s.fresh_samples >= full]
    if len(fresh) < min_peers:
        return None
    multi = len({hw_class(h) for h in {s.hardware for s, _ in fresh}}) > 1
    class_p50: dict[str, float] = {}
    if multi:
        classes: dict[str, list[float]] = {}
        for s, p50 in fresh:
            classes.setdefault(hw_class(s.hardware), []).append(p50)
        small = any(len(v) < min_peers for v in classes.values())
        moved = movement(fresh, base_p50, min_peers) if small else None
        class_p50 = class_p50_refs(classes, moved, base_p50, base_ticks, min_peers)
    return Norms(True, median([p50 for _, p50 in fresh]), class_p50, multi, math.inf)


class PeerNorms(NamedTuple):
    """Everything one tick takes from the peers' numbers, computed together
    (:func:`norms_of`): each list sorted once, shared by the norms, the slow baseline and
    the quiet check of the rules (:func:`tailguard.core.judge.rules.quiet_below`). Immutable
    (a ``NamedTuple``, as :class:`Norms`)."""

    window: Norms                    # as window_norms
    fresh: Norms | None              # as fresh_norms
    class_p50: dict[str, float]      # every class's median P50, in order of first peer
    ratio: float | None              # the peers' median P99/P50 (None without peers)
    # The largest P50, P99/P50, P50 x P99/P50 and fresh P50 (None: none is fresh) of one
    # class's peers; no entry when some value is not finite (the rules judge those one by one).
    top: Mapping[str, tuple[float, float, float, float | None]] = MappingProxyType({})


def norms_of(ps: PeerSet, base_p50: Mapping[str, float], base_ticks: Mapping[str, int],
             st: DetectorSettings) -> PeerNorms:
    """:func:`window_norms` and :func:`fresh_norms` over ``peers``, the medians the slow
    baseline folds in (:func:`tailguard.core.judge.baseline.fold_baseline`) and each class's largest
    values; the same numbers as those functions, with each list sorted once."""
    sums, p50s, ratios = ps.summaries, ps.p50s, ps.ratios
    if not p50s:
        return PeerNorms(window_norms(ps, base_p50, base_ticks, st), None, {}, None)
    hardware = set(map(_HARDWARE, sums))
    total = sum(p50s) + sum(ratios)
    if (len(hardware) > 1 and len({hw_class(h) for h in hardware}) > 1) or not math.isfinite(total):
        return _norms_by_class(ps, base_p50, base_ticks, st)
    c = hw_class(next(iter(hardware)))
    min_peers = st.min_peers
    fp = list(map(_FRESH_P50, sums))
    try:
        fresh_total = sum(fp)
    except TypeError:                     # some peer without a fresh P50
        fp = [f for f in fp if f is not None]
        fresh_total = sum(fp)
    finite_fresh = math.isfinite(fresh_total)
    # Each list sorted once; the fresh P50s when finite, for the smallest, the largest (all
    # positive: equal floats are the same bits) and the median.
    sp, sr, p99s, fs = sort_columns(p50s, ratios, fp if finite_fresh else [])
    fleet_p50, median_ratio = median_sorted(sp.middle), median_sorted(sr)
    top_fresh = None
    fresh = None
    if fp:                                # some peer has a fresh P50
        if fs is not None and fs.low > 0.0:
            top_fresh = fs.high
        else:                                          # (a NaN is neither finite nor kept)
            top_fresh = max(fp)
            fp = [f for f in fp if f > 0]
            fs = None
        if min(map(_FRESH_SAMPLES, sums)) < st.min_samples:
            # A fresh P50 of fewer samples (a lagging or quieter node) is judged, never a reference.
            full = st.min_samples
            fp = [f for s in sums if (f := s.fresh_p50) is not None and f > 0
                  and s.fresh_samples >= full]
            fs = None
        if len(fp) >= min_peers:
            fresh = Norms(True, median(fp) if fs is None else median_sorted(fs.middle), {}, False,
                          math.inf)
    if len(p50s) < min_peers:
        top = max(map(operator.mul, p50s, ratios))
        return PeerNorms(Norms(False, fleet_p50, {}, False, st.ratio_threshold), fresh,
                         {c: fleet_p50}, median_ratio,
                         {c: (sp.high, sr[-1], top, top_fresh)} if finite_fresh else {})
    moved = None
    if c in base_p50:
        # P50 / baseline in P50 order is sorted too (division by a positive number keeps the
        # order): movement's median needs only the middle P50s.
        e = math.exp(base_p50[c])
        moved = median_sorted([p50 / e for p50 in sp.middle])
    return PeerNorms(Norms(True, fleet_p50, {}, False, tail_limit_sorted(sr, median_ratio, st),
                           median_sorted(p99s.middle), {}, moved, median_ratio),
                     fresh, {c: fleet_p50}, median_ratio,
                     {c: (sp.high, sr[-1], p99s.high, top_fresh)} if finite_fresh else {})


def _norms_by_class(ps: PeerSet, base_p50: Mapping[str, float],
                    base_ticks: Mapping[str, int], st: DetectorSettings) -> PeerNorms:
    """:func:`norms_of` for peers of several classes (or with a value not finite)."""
    peers = ps.peers
    classes: dict[str, list[PeerRow]] = {}
    for row in ps.rows():
        classes.setdefault(hw_class(row[1].hardware), []).append(row)
    top: dict[str, tuple[float, float, float, float | None]] = {}
    for c, rows in classes.items():
        _, sums, p50s, ratios = zip(*rows, strict=True)
        fp = [f for f in map(_FRESH_P50, sums) if f is not None]
        if math.isfinite(sum(p50s) + sum(ratios) + sum(fp)):
            top[c] = (max(p50s), max(ratios), max(map(operator.mul, p50s, ratios)),
                      max(fp) if fp else None)
    return PeerNorms(window_norms(peers, base_p50, base_ticks, st),
                     fresh_norms(peers, base_p50, base_ticks, st),
                     {c: median([p50 for _, _, p50, _ in rows]) for c, rows in classes.items()},
                     median(ps.ratios), top)


def movement(p50s: Sequence[tuple[WindowSummary, float]], base_p50: Mapping[str, float],
             min_peers: int) -> float | None:
    """Median over the peers (summary, P50) of P50 / own class baseline (None below
    min_peers of them)."""
    # exp() once per hardware value, not per peer (the same numbers).
    scale = {h: math.exp(base_p50[c]) if (c := hw_class(h)) in base_p50 else None
             for h in {s.hardware for s, _ in p50s}}
    rel = [p50 / e for s, p50 in p50s if (e := scale[s.hardware]) is not None]
    return median(rel) if len(rel) >= min_peers else None


def class_p50_refs(classes: Mapping[str, list[float]], moved: float | None,
                   base_p50: Mapping[str, float], base_ticks: Mapping[str, int],
                   min_peers: int) -> dict[str, float]:
    """Per hardware class, the P50 reference of its pairs: the median of its ``classes``
    values when it has at least ``min_peers``; else its slow baseline moved by ``moved``,
    once that baseline has ``SMALL_CLASS_MIN_TICKS`` ticks; else none."""
    out: dict[str, float] = {}
    for c, v in classes.items():
        if len(v) >= min_peers:
            out[c] = median(v)
        elif (moved is not None and c in base_p50
              and base_ticks.get(c, 0) >= SMALL_CLASS_MIN_TICKS):
            # Too few peers for a class median: the class's own slow baseline, moved
            # as the whole fleet moved since (so a fleet-wide change cancels out).
            out[c] = math.exp(base_p50[c]) * moved
    return out


def tail_limit(ratios: Sequence[float], st: DetectorSettings) -> float:
    """The tail rule's limit on P99/P50 given the peers' ratios.

    ``max(ratio_threshold, fleet_ratio_factor x median, noise limit)``; the noise limit is
    ``median x exp(TAIL_NOISE_K x 1.4826 x MAD)`` of the log ratios: the spread the peers'
    own windows show. The P99 of a window of a heavy-tailed workload is a noisy estimate
    (a few requests set it); among many nodes some healthy one sits far above the median,
    and at low rates its consecutive windows share most samples, so the excursion lasts.
    """
    s = sorted(ratios)
    return tail_limit_sorted(s, median_sorted(s), st)


def tail_limit_sorted(ratios: Sequence[float], median_ratio: float, st: DetectorSettings) -> float:
    """:func:`tail_limit` of ratios already sorted, ``median_ratio`` their median."""
    bound = max(st.ratio_threshold, st.fleet_ratio_factor * median_ratio)
    if noise_below(ratios, TAIL_NOISE_K * 1.4826, bound):     # most ticks: no log per ratio
        return bound
    logs = list(map(math.log, ratios))
    logs.sort()                     # sorted already unless log is not monotonic: a linear check
    mid = median_sorted(logs)
    # |log - mid| over sorted logs falls, then rises: two runs, which sort merges in one pass.
    mad = median_sorted(sorted(map(abs, map(operator.sub, logs, itertools.repeat(mid)))))
    return max(bound, math.exp(mid + TAIL_NOISE_K * 1.4826 * mad))
