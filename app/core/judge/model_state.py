"""Stage 2's state of one model, and its snapshot as plain data.

Owns :class:`ModelState`: the :class:`~tailguard.core.judge.health.PairState` of every pair,
the slow baseline (:mod:`tailguard.core.judge.baseline`), the open fleet episodes and the
per-pair bookkeeping of the rules (onset credit, new-evidence clock, sample rate, error
counters, last sign of life of retired pairs), liveness and the pairs' own P50 baselines.
:class:`PairTable` (``ModelState.pairs``) is a dict that also keeps small derived indexes of
the pairs a common tick must look at (not healthy-and-routed, out of routing, routed with a
cut-off), so that a tick of a quiet fleet touches only them; never in a snapshot.

Guarantees:

* ``ModelState.from_dict(s.to_dict())`` equals ``s``, and the dict is plain JSON (sorted keys
  where order is free), so equal states give equal snapshots and a restored evaluator
  produces the same future.
* A snapshot carries ``version`` (:data:`SNAPSHOT_VERSION`); any other version, or a snapshot
  missing a field, raises :class:`ValueError` naming the problem: there are no defaults for
  absent fields, a snapshot is complete and current or refused.

Rationale: docs/rules.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Final

from tailguard.core.contract.types import HealthState
from tailguard.core.judge.health import PairState
from tailguard.core.judge.hist_baselines import HistBaselines
from tailguard.core.judge.hist_trend import HistTrend
from tailguard.core.judge.liveness import Liveness
from tailguard.core.judge.own_history import OwnBaselines
from tailguard.core.judge.weights import WeightState

SNAPSHOT_VERSION: Final = 4

_HEALTHY, _WARMING = HealthState.HEALTHY, HealthState.WARMING


class PairTable(dict[str, PairState]):
    """A model's pairs by node, with indexes kept in step with every change.

    A plain dict to read (and to compare, copy and snapshot). Every write goes through
    ``__setitem__``/``__delitem__``/``pop`` (the other mutators are built on them), which
    keep:

    * :attr:`rare` — nodes whose pair is not healthy-and-routed (warming, suspect, out of
      routing, ...): the only pairs a quiet tick must step, probe or report;
    * :attr:`unrouted` — nodes out of routing (a subset of ``rare``);
    * :attr:`streaked` — nodes whose pair has an abnormal streak (a healthy one may have one);
    * the routed pairs with a cut-off (``judge_since_ts``), for :meth:`cut_candidates`;
    * the insertion order of each node (:meth:`in_order`: the dict's own order);
    * the routing set (:meth:`routing`), rebuilt only after a change of membership.
    """

    __slots__ = ("_cut", "_cut_floor", "_next", "_routing", "_seq", "rare", "streaked", "unrouted")

    def __init__(self, pairs: Mapping[str, PairState] | Iterable[tuple[str, PairState]] = ()) -> None:
        super().__init__()
        self.rare: set[str] = set()
        self.unrouted: set[str] = set()
        self.streaked: set[str] = set()
        self._cut: dict[str, float] = {}       # routed, not warming: node -> judge_since_ts
        self._cut_floor = -math.inf             # _cut is exact for any now_s at or past this
        self._seq: dict[str, int] = {}
        self._next = 0
        self._routing: frozenset[str] | None = None
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        for node, p in items:
            self[node] = p

    def __setitem__(self, node: str, p: PairState) -> None:
        old = dict.get(self, node)
        dict.__setitem__(self, node, p)
        if old is None:
            self._seq[node] = self._next
            self._next += 1
            self._routing = None
        elif old.routed != p.routed:
            self._routing = None
        if p.abnormal_streak:
            self.streaked.add(node)
        elif old is not None and old.abnormal_streak:
            self.streaked.discard(node)
        if p.routed:
            self.unrouted.discard(node)
            if p.state is _HEALTHY:
                self.rare.discard(node)
            else:
                self.rare.add(node)
            since = p.judge_since_ts
            if since is not None and p.state is not _WARMING:
                self._cut[node] = since
            else:
                self._cut.pop(node, None)
        else:
            self.unrouted.add(node)
            self.rare.add(node)
            self._cut.pop(node, None)

    def __reduce__(self) -> tuple[type[PairTable], tuple[dict[str, PairState]]]:
        return PairTable, (dict(self),)     # copies and pickles rebuild the indexes

    def __delitem__(self, node: str) -> None:
        dict.__delitem__(self, node)
        self._drop(node)

    def pop(self, node: str, *default: Any) -> Any:
        if node in self:
            p = dict.pop(self, node)
            self._drop(node)
            return p
        if default:
            return default[0]
        raise KeyError(node)

    def popitem(self) -> tuple[str, PairState]:
        node, p = dict.popitem(self)
        self._drop(node)
        return node, p

    def setdefault(self, node: str, default: PairState) -> PairState:
        p = dict.get(self, node)
        if p is None:
            self[node] = p = default
        return p

    def update(self, *args: Any, **kw: PairState) -> None:
        for node, p in dict(*args, **kw).items():
            self[node] = p

    def __ior__(self, other: Any) -> PairTable:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        dict.clear(self)
        for d in (self.rare, self.unrouted, self.streaked, self._cut, self._seq):
            d.clear()
        self._routing = None

    def _drop(self, node: str) -> None:
        self.rare.discard(node)
        self.unrouted.discard(node)
        self.streaked.discard(node)
        self._cut.pop(node, None)
        del self._seq[node]
        self._routing = None

    def in_order(self, nodes: Set[str]) -> list[str]:
        """``nodes`` (all in the table) in the table's own iteration order."""
        if len(nodes) * 8 > len(self):      # many: one pass over the table beats a sort
            return [n for n in self if n in nodes]
        return sorted(nodes, key=self._seq.__getitem__)

    def routing(self) -> frozenset[str]:
        """The routed nodes (kept until a pair comes, goes, or changes its ``routed``)."""
        r = self._routing
        if r is None:
            unrouted = self.unrouted
            r = self._routing = (frozenset(self) if not unrouted
                                 else frozenset(n for n in self if n not in unrouted))
        return r

    def cut_candidates(self, now_s: float, max_age_s: float) -> Iterable[str]:
        """Routed pairs (not warming) whose cut-off the age bound may not cover at ``now_s``:
        a superset of those :func:`tailguard.core.judge.health.judge_since` gives one for. The ones it
        covers are dropped from the index, as they stay covered at any later ``now_s``."""
        cut = self._cut
        if now_s < self._cut_floor:
            return list(self)               # back in time: what was dropped may count again
        self._cut_floor = now_s
        stale = [n for n, since in cut.items() if now_s - since > max_age_s]
        for n in stale:
            del cut[n]
        return list(cut)


@dataclass(slots=True)
class ModelState:
    pairs: PairTable = field(default_factory=PairTable)
    baseline_p50: dict[str, float] = field(default_factory=dict)   # hardware class -> log p50
    baseline_ratio: float | None = None                          # log of the median ratio
    baseline_ts: float | None = None
    baseline_signal: str | None = None
    baseline_ticks: dict[str, int] = field(default_factory=dict)   # class -> updates so far
    load_event: bool = False
    shifted: bool = False
    error_storm: bool = False          # most routed pairs past max_error_share
    # Pairs whose relative severity at the last tick was in [ONSET_CREDIT_FRACTION, 1].
    elevated: dict[str, float] = field(default_factory=dict)
    # Per pair: the tick of the window that last advanced its abnormal streak, and the judged
    # sample rate (per s) last measured on a window not yet full (see rules.new_fraction).
    advanced_ts: dict[str, float] = field(default_factory=dict)
    rate_per_s: dict[str, float] = field(default_factory=dict)
    # Retired pairs: their last sign of life (sample or heartbeat; at least the retirement).
    retired_seen: dict[str, float] = field(default_factory=dict)
    # Per pair: stage 1's cumulative (requests, failed) at the last few ticks, oldest first,
    # flat, updated in place (request_rules.error_judgements); a list, or an IrregularCounts.
    counts: dict[str, list[int]] = field(default_factory=dict)
    # Last signs of life, gone pairs, restarts handled, telemetry loss (tailguard.core.judge.liveness).
    live: Liveness = field(default_factory=Liveness)
    # Per-pair P50 baselines: the reference below min_peers (tailguard.core.judge.own_history).
    own: OwnBaselines = field(default_factory=OwnBaselines)
    # The same for histogram pairs: per metric, their CDFs at the bounds (tailguard.core.judge.hist_own).
    hist_own: HistBaselines = field(default_factory=HistBaselines)
    # Histogram pairs' recent slow-down estimates, for their weights (tailguard.core.judge.hist_trend).
    hist_trend: HistTrend = field(default_factory=HistTrend)
    # The threshold stage 1 counts fresh samples above (rules.judge_fresh_tail): the peers'
    # P99 with a margin, in the signal's units; None without one (few peers, several classes).
    tail_ref: float | None = None
    # Routing weights of routed nodes slower than their peers (tailguard.core.judge.weights).
    weights: WeightState = field(default_factory=WeightState)
    # An open fleet_slow episode (tailguard.core.fleet_slow): node -> its reference P50 frozen at
    # the opening, in the units of fleet_slow_signal; empty when none is open.
    fleet_slow: dict[str, float] = field(default_factory=dict)
    fleet_slow_signal: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pairs, PairTable):
            self.pairs = PairTable(self.pairs)

    def forget_pair(self, node: str) -> None:
        """Drop everything kept about ``node``."""
        self.pairs.pop(node, None)
        for d in (self.retired_seen, self.advanced_ts, self.rate_per_s, self.elevated,
                  self.counts):
            d.pop(node, None)
        self.live.drop(node)
        self.own.drop(node)
        self.hist_own.drop(node)
        self.hist_trend.drop(node)

    def to_dict(self) -> dict[str, Any]:
        return {"version": SNAPSHOT_VERSION,
                "pairs": {n: p.to_dict() for n, p in sorted(self.pairs.items())},
                "baseline_p50": dict(sorted(self.baseline_p50.items())),
                "baseline_ratio": self.baseline_ratio, "baseline_ts": self.baseline_ts,
                "baseline_signal": self.baseline_signal,
                "baseline_ticks": dict(sorted(self.baseline_ticks.items())),
                "load_event": self.load_event, "shifted": self.shifted,
                "error_storm": self.error_storm,
                "elevated": dict(sorted(self.elevated.items())),
                "advanced_ts": dict(sorted(self.advanced_ts.items())),
                "rate_per_s": dict(sorted(self.rate_per_s.items())),
                "retired_seen": dict(sorted(self.retired_seen.items())),
                "counts": {n: list(c) for n, c in sorted(self.counts.items())},
                "live": self.live.to_dict(), "own": self.own.to_dict(), "tail_ref": self.tail_ref,
                "weights": self.weights.to_dict(),
                "fleet_slow": dict(sorted(self.fleet_slow.items())),
                "fleet_slow_signal": self.fleet_slow_signal,
                **({"hist_own": self.hist_own.to_dict()} if self.hist_own.nodes else {}),
                **({"hist_trend": self.hist_trend.to_dict()} if self.hist_trend.spread else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelState:
        check_version(d, "model state")
        try:
            return cls(
                pairs=PairTable((n, PairState.from_dict(p)) for n, p in d["pairs"].items()),
                baseline_p50={str(k): float(v) for k, v in d["baseline_p50"].items()},
                baseline_ratio=d["baseline_ratio"], baseline_ts=d["baseline_ts"],
                baseline_signal=d["baseline_signal"],
                baseline_ticks={str(k): int(v) for k, v in d["baseline_ticks"].items()},
                load_event=bool(d["load_event"]), shifted=bool(d["shifted"]),
                error_storm=bool(d["error_storm"]),
                elevated={str(k): float(v) for k, v in d["elevated"].items()},
                advanced_ts={str(k): float(v) for k, v in d["advanced_ts"].items()},
                rate_per_s={str(k): float(v) for k, v in d["rate_per_s"].items()},
                retired_seen={str(k): float(v) for k, v in d["retired_seen"].items()},
                counts={str(k): _counts(v) for k, v in d["counts"].items()},
                live=Liveness.from_dict(d["live"]), own=OwnBaselines.from_dict(d["own"]),
                tail_ref=None if d["tail_ref"] is None else float(d["tail_ref"]),
                weights=WeightState.from_dict(d["weights"]),
                fleet_slow={str(k): float(v) for k, v in d["fleet_slow"].items()},
                fleet_slow_signal=d["fleet_slow_signal"],
                hist_own=HistBaselines.from_dict(d.get("hist_own", {})),
                hist_trend=HistTrend.from_dict(d.get("hist_trend", {})))
        except KeyError as e:
            raise ValueError(f"model state snapshot (version {SNAPSHOT_VERSION}) lacks the "
                             f"field {e.args[0]!r}; cannot restore") from None
        except (TypeError, AttributeError, IndexError, ValueError) as e:
            raise ValueError(f"model state snapshot (version {SNAPSHOT_VERSION}) is malformed "
                             f"({e}); cannot restore") from None


class IrregularCounts(list[int]):
    """A pair's counters (``ModelState.counts``, a plain list otherwise) with a tick whose failed
    count moved while its requests did not (a new stage 1 with as many requests), or, restored,
    requests that go back: a history whose first and last ticks do not tell that every tick
    between holds the same counters (``request_rules.error_judgements``). Equal to the list of
    the same counters; a restart of the counters makes a plain list again."""

    __slots__ = ()


def _counts(v: Any) -> list[int]:
    """A pair's stored counters: (requests, failed) pairs, flat (older versions kept one)."""
    out = [int(x) for x in v]
    if not out or len(out) % 2:
        raise TypeError(f"counts {v!r} are not (requests, failed) pairs")
    ticks = zip(out[::2], out[1::2], strict=True)
    if any(r > r2 or (r == r2 and f != f2) for (r, f), (r2, f2) in pairwise(ticks)):
        return IrregularCounts(out)
    return out


def check_version(data: Any, what: str) -> None:
    """Raise :class:`ValueError` unless ``data`` is a dict of the current snapshot version."""
    version = data.get("version") if isinstance(data, dict) else None
    if version != SNAPSHOT_VERSION:
        raise ValueError(f"{what} snapshot version {version!r} is not supported "
                         f"({SNAPSHOT_VERSION}); cannot restore")
