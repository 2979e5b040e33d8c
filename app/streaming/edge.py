"""Stage 2's operator edge: the mode, operator overrides and the explain history.

:class:`OperatorEdge` sits between the core's verdict (a :class:`EdgeInput`) and what is
written and published (:class:`EdgeOutput`). The core never sees the mode or the overrides:
its state, streaks, ejection cap and probe rounds are as without them (docs/operating.md).

Guarantees, per model and tick:

* **Mode.** ``enforce`` writes the core's routing set; ``observe`` keeps every known node in it
  except ``gone`` and not-yet-admitted ones. Either way the would-be set is the shadow set.
* **Diagnostics requests** go out in ``enforce``, and in ``observe`` only with
  ``TAILGUARD_DIAGNOSE_IN_OBSERVE`` (the checks load a node that observe keeps serving).
* **Overrides** (:mod:`tailguard.routing.operators`), after the mode: drained nodes leave the
  routing set, pinned ones stay; the drain that would empty it (the one set last) is refused
  (``drain_refused``). The held-out set is the core's plus the drained nodes. A new, changed
  or ended override publishes one health change; expired ones go to :attr:`EdgeOutput.expired`.
* **Weights** only with ``TAILGUARD_WEIGHTS=enforce`` in ``enforce`` mode (pinned: full, drained:
  none), else emptied; changes published as rate-limited ``weight`` events either way.
* **History**: each node's last ``history_len`` ticks, ``P:history:<m>``, made after the
  routing write (:meth:`OperatorEdge.deferred_history`; the routing write never carries it).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import (
    FleetEvent,
    HealthState,
    ModelTick,
    NodeStatus,
    Transition,
    WindowSummary,
    utc_text,
)
from tailguard.core.window.signals import LOCAL_KEY
from tailguard.routing.apply_script import Extras
from tailguard.routing.keys import held_out
from tailguard.routing.operators import OperatorState, Override
from tailguard.streaming.tickstats import Counts, rule_stats, sig4, stats_dict
from tailguard.streaming.weight_events import WeightAnnouncer

log = logging.getLogger(__name__)

HISTORY_LEN = 10
OPERATOR_REASONS = {"drain": "operator_drain", "pin": "operator_pin"}
RELEASE_REASON = "operator_release"
# Fleet events that hold every node of the model while open (kind → its closing kind).
HOLDING_EVENTS = {"load_event": "load_event_end", "error_storm": "error_storm_end"}


@dataclass(frozen=True, slots=True)
class EdgeInput:
    """One model's tick as stage 2 produced it."""

    tick: ModelTick
    transitions: tuple[Transition, ...]          # diagnostics' and the tick's
    summaries: tuple[WindowSummary, ...] = ()
    streaks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EdgeOutput:
    """What to publish and write for one model's tick."""

    tick: ModelTick                              # routing = the set to write
    extras: Extras
    health_events: tuple[dict[str, Any], ...]    # health-change JSON documents, in order
    mode: str
    expired: tuple[Override, ...] = ()
    overrides: Mapping[str, Override] = field(default_factory=dict)


try:
    import orjson

    def _dumps(obj: Any) -> str:
        """Compact JSON (orjson: a 10,000-node tick serializes its history in ~0.1 s)."""
        return orjson.dumps(obj).decode()
except ImportError:  # pragma: no cover - orjson is a declared dependency
    def _dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


_Nodes = frozenset[str] | set[str]


class OperatorEdge:
    """Applies mode and overrides to verdicts; keeps what was announced and the history."""

    def __init__(self, settings: DetectorSettings, default_mode: str = "enforce", *,
                 history_len: int = HISTORY_LEN, diagnose_in_observe: bool = False) -> None:
        if default_mode not in ("observe", "enforce"):
            raise ValueError(f"default_mode must be observe or enforce, got {default_mode!r}")
        if history_len < 0:
            raise ValueError(f"history_len must be >= 0, got {history_len!r}")
        self.settings = settings
        self.default_mode = default_mode
        self.history_len = history_len
        self.diagnose_in_observe = diagnose_in_observe
        # model -> node -> (override, refused) as last announced
        self._announced: dict[str, dict[str, tuple[Override, bool]]] = {}
        # Per model and node: the last ticks' entries as JSON (serialized once), each with a
        # small marker (idle?, where the node was) for folding idle ticks (see _record).
        self._history: dict[str, dict[str, collections.deque[tuple[tuple[Any, ...], str]]]] = {}
        self._counts: dict[str, Counts] = {}
        self._holding: dict[str, set[str]] = {}
        self._weights = WeightAnnouncer()
        # model -> its history rows still to make (by deferred_history, after the routing write)
        self._deferred: dict[str, Callable[[], Mapping[str, Iterable[tuple[tuple[Any, ...], str]]]]] = {}

    def forget_model(self, model: str) -> None:
        """Another worker owns the model now."""
        for d in (self._announced, self._history, self._counts, self._holding, self._deferred):
            d.pop(model, None)
        self._weights.forget_model(model)

    def apply(self, inp: EdgeInput, ops: OperatorState, now_s: float) -> EdgeOutput:
        """One model's verdict through the mode and the overrides: what to write and publish.
        Its history rows are made by :meth:`deferred_history`, after the routing write (call
        it before the model's next :meth:`apply`, or that tick's rows are never made)."""
        tick = inp.tick
        model = tick.model
        mode = ops.mode_of(model, self.default_mode)
        enforced = mode == "enforce"
        statuses = {s.node_id: s for s in tick.statuses}
        known = {n for n, s in statuses.items() if s.state is not HealthState.UNKNOWN}
        known |= tick.routing
        active, expired = self._overrides(ops, model, known, now_s)
        routing, shadow, refused = self._routing(tick, enforced, statuses, known, active)
        pinned = {n for n, o in active.items() if o.action == "pin"}
        written = self._written_weights(tick, enforced, frozenset(routing), pinned)
        events = [self._event(t, enforced) for t in inp.transitions]
        events += self._announce(model, active, statuses, routing, refused, now_s)
        events += self._weights.events(tick, frozenset(routing), written,
                                       enforced and self.settings.weights == "enforce", now_s)
        self._follow_holding(model, tick.fleet_events)
        self._deferred[model] = functools.partial(self._history_of, inp, model, now_s, mode,
                                                  statuses, routing, active, refused)
        drained = {n for n, o in active.items() if o.action == "drain"}
        return EdgeOutput(
            # A node in the written routing set is not quarantined for probers and LBs.
            tick=replace(tick, routing=frozenset(routing), quarantine={
                n: ts for n, ts in tick.quarantine.items() if n not in routing},
                diagnostics=tick.diagnostics if enforced or self.diagnose_in_observe else ()),
            extras=self._page(tick, mode, statuses, routing, shadow, active, refused, drained, events,
                              written, _local_signal(inp.summaries)),
            health_events=tuple(events), mode=mode, expired=expired, overrides=active)

    def deferred_history(self, model: str) -> dict[str, str] | None:
        """The history of the model's last :meth:`apply` (each node's rows as one JSON array,
        what ``P:history:<m>`` holds); ``None`` when there is none to write (called twice)."""
        rows = self._deferred.pop(model, None)
        return None if rows is None else _history_json(rows())

    # --- the steps of apply --------------------------------------------------
    @staticmethod
    def _overrides(ops: OperatorState, model: str, known: set[str] | frozenset[str],
                   now_s: float) -> tuple[dict[str, Override], tuple[Override, ...]]:
        """The overrides in force on the model's known nodes, and those that just expired."""
        active = {n: o for n, o in ops.for_model(model).items() if n in known}
        expired = tuple(o for o in active.values() if o.expired(now_s))
        return {n: o for n, o in active.items() if not o.expired(now_s)}, expired

    @staticmethod
    def _routing(tick: ModelTick, enforced: bool, statuses: Mapping[str, NodeStatus],
                 known: set[str] | frozenset[str],
                 active: Mapping[str, Override]) -> tuple[_Nodes, _Nodes, set[str]]:
        """The routing set to write (mode and overrides), the shadow set, the refused drains."""
        model = tick.model
        drained = {n for n, o in active.items() if o.action == "drain"}
        pinned = {n for n, o in active.items() if o.action == "pin"}
        shadow = (tick.routing - drained) | pinned
        # Observe keeps every node the core knows routed, except the gone (silent) ones: a
        # dead node must not stay routed. (On telemetry loss the core marks nobody gone.) The
        # core's own set is always kept: observe never routes fewer nodes than enforce.
        gone = {n for n, s in statuses.items() if s.state is HealthState.GONE
                or (s.state is HealthState.WARMING and not s.routed)}   # (or not admitted yet)
        base = tick.routing if enforced else frozenset(known - gone) | tick.routing
        routing = (base - drained) | pinned
        refused: set[str] = set()
        if not routing and base:
            # Refuse the drain set last (the one that would empty the set); the earlier
            # ones stay applied. (Nothing is pinned here: a pin would be routed.)
            last = max(drained & base, key=lambda n: (active[n].set_ts, n))
            refused = {last}
            routing = frozenset(refused)
            log.warning("model %r: refusing the drain of %r, it would empty the routing set",
                        model, last)
        if not shadow and known:
            shadow = tick.routing | pinned
        return routing, shadow, refused

    def _follow_holding(self, model: str, fleet_events: Iterable[FleetEvent]) -> None:
        """Which fleet-wide holds (load event, telemetry loss, …) are on, from their events."""
        for f in fleet_events:
            holding = self._holding.setdefault(model, set())
            if f.kind in HOLDING_EVENTS:
                holding.add(f.kind)
            for kind, end in HOLDING_EVENTS.items():
                if f.kind == end:
                    holding.discard(kind)

    def _history_of(self, inp: EdgeInput, model: str, now_s: float, mode: str,
                    statuses: Mapping[str, NodeStatus], routing: frozenset[str] | set[str],
                    active: Mapping[str, Override],
                    refused: set[str]) -> dict[str, collections.deque[tuple[tuple[Any, ...], str]]]:
        """Each node's last ticks for the page (empty with ``history_len`` 0)."""
        if not self.history_len:
            return {}
        stats, counts = rule_stats(inp.summaries, inp.tick.statuses, self.settings,
                                   self._counts.get(model, {}))
        self._counts[model] = counts
        return self._record(model, now_s, mode, statuses, stats, inp.streaks, routing, active, refused)

    @staticmethod
    def _page(tick: ModelTick, mode: str, statuses: Mapping[str, NodeStatus], routing: frozenset[str] | set[str],
              shadow: frozenset[str] | set[str], active: Mapping[str, Override], refused: set[str],
              drained: set[str], events: list[dict[str, Any]],
              written: dict[str, float], local: frozenset[str] = frozenset()) -> Extras:
        """What the routing write carries for the page and ``tailguard status``, as JSON
        (``signal_local``: the node's signal was chosen by its worker's share alone)."""
        annotations = {n: {"mode": mode, "routed_by_rules": n in tick.routing,
                           "override": None if n not in active else active[n].to_dict(),
                           "drain_refused": n in refused, "signal_local": n in local}
                       for n in statuses}
        page_events = [_dumps(e) for e in events]
        page_events += [_dumps(f.to_event()) for f in tick.fleet_events]
        return Extras(shadow=frozenset(shadow), annotations=annotations,
                      events=tuple(page_events),
                      held_out=held_out(tick.statuses, routing) | (drained - routing),
                      weights=written)

    # --- internals -----------------------------------------------------------
    def _written_weights(self, tick: ModelTick, enforced: bool, routing: frozenset[str],
                         pinned: set[str]) -> dict[str, float]:
        """The weights load balancers read: the core's, in enforce mode only (weights and
        model), for the nodes routed and not pinned."""
        if not (enforced and self.settings.weights == "enforce"):
            return {}
        return {n: w for n, w in tick.weights.items() if n in routing and n not in pinned}

    @staticmethod
    def _event(t: Transition, enforced: bool) -> dict[str, Any]:
        d = t.to_event()
        d["enforced"] = enforced
        return d

    def _announce(self, model: str, active: dict[str, Override],
                  statuses: Mapping[str, NodeStatus], routing: frozenset[str] | set[str],
                  refused: set[str], now_s: float) -> list[dict[str, Any]]:
        before = self._announced.get(model, {})
        out: list[dict[str, Any]] = []

        def event(node: str, o: Override, reason: str, detail: str) -> dict[str, Any]:
            s = statuses.get(node)
            state = s.state if s is not None else HealthState.UNKNOWN
            t = Transition(ts=now_s, node_id=node, model=model, from_state=state, to_state=state,
                           routed=node in routing, reason=reason, detail=detail,
                           hardware=None if s is None else s.hardware)
            d = self._event(t, True)
            d["operator"] = o.to_dict()
            # Of the override, not of the tick: a new owner of the model (a rebalance, a
            # restart) announcing the same override again repeats the same id.
            key = f"{model}\x1f{node}\x1f{reason}\x1f{o.set_ts!r}\x1f{o.until_ts!r}\x1f{node in refused}"
            d["event_id"] = hashlib.sha256(key.encode()).hexdigest()[:32]
            return d

        for node in sorted(before.keys() - active.keys()):
            o = before[node][0]
            why = (f"{o.action} ended: until {utc_text(o.until_ts)} passed"
                   if o.expired(now_s) else f"{o.action} released by an operator")
            out.append(event(node, o, RELEASE_REASON, why))
        now = {node: (o, node in refused) for node, o in active.items()}
        for node in sorted(active):
            if before.get(node) != now[node]:
                o = active[node]
                text = o.reason or f"{o.action} by an operator"
                if node in refused:
                    text += f"; refused: it would leave model {model!r} with no routed node"
                out.append(event(node, o, OPERATOR_REASONS[o.action], text))
        self._announced[model] = now
        return out

    def _record(self, model: str, now_s: float, mode: str, statuses: Mapping[str, NodeStatus],
                stats: Mapping[str, Any], streaks: Mapping[str, int],
                routing: frozenset[str] | set[str], active: Mapping[str, Override],
                refused: set[str]) -> dict[str, collections.deque[tuple[tuple[Any, ...], str]]]:
        hist = self._history.setdefault(model, {})
        for gone in hist.keys() - statuses.keys():
            del hist[gone]
        holding = sorted(self._holding.get(model, ()))
        for node, s in statuses.items():
            guards = list(holding)
            if s.reason == "ejection_cap":
                guards.append("ejection_cap")
            if mode == "observe" and not s.routed and node in routing:
                guards.append("observe_mode")
            if node in active:
                guards.append(OPERATOR_REASONS[active[node].action])
            if node in refused:
                guards.append("drain_refused")
            entry = {
                "ts": now_s, "state": str(s.state), "routed": node in routing,
                "rules_routed": s.routed, "reason": s.reason, "streak": streaks.get(node, 0),
                "samples": s.samples, "stats": stats_dict(stats[node]) if node in stats else {},
                "guards": guards, "probe_after": s.probe_after_ts,
                "lat": [sig4(s.latency_p50_us), sig4(s.latency_p99_us)], "mode": mode,
                "weight": s.weight,
            }
            q = hist.get(node)
            if q is None:
                q = hist[node] = collections.deque(maxlen=self.history_len)
            marker = (_idle(entry), entry["state"], entry["routed"], entry["rules_routed"],
                      tuple(guards), mode)
            if q and marker[0] and q[-1][0] == marker:
                q[-1] = (marker, _dumps(entry))   # idle twice in the same place: one row, so
            else:                                 # the ticks that decided (before a
                q.append((marker, _dumps(entry)))  # quarantine) stay in the capped history
        return hist


def _history_json(history: Mapping[str, Iterable[tuple[tuple[Any, ...], str]]]) -> dict[str, str]:
    """Each node's rows as the JSON array the history hash holds."""
    return {n: "[" + ",".join(j for _, j in h) + "]" for n, h in history.items()}


def _idle(entry: Mapping[str, Any]) -> bool:
    """No latency statistic of the node itself was judged at this tick."""
    return all(v[0] is None for k, v in entry["stats"].items() if k != "err")


def _local_signal(summaries: Iterable[WindowSummary]) -> frozenset[str]:
    """The nodes whose signal their stage 1 chose alone (no stage-2 choice for the model yet)."""
    return frozenset(s.node_id for s in summaries if s.extra.get(LOCAL_KEY))
