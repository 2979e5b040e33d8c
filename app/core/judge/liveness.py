"""Liveness of a model's pairs: who is gone, who restarted, whether the telemetry is lost.

Owns :class:`Liveness` (each pair's last sign of life, event time) and :func:`step`, run
once per tick before any rule:

* restart — a routed pair whose summary shows a new ``instance`` or life resuming after a
  gap warms up again (``restarted``; :func:`tailguard.core.judge.health.restart`), as does a
  pair awaiting admission or a retired pair back as a new instance; when
  ``load_event_fraction`` of the live pairs resume together, or around a telemetry loss, only
  instance changes count; after ``CRASHLOOP_RESTARTS`` within ``CRASHLOOP_WINDOW_S`` further
  restarts are not acted on;
* gone — no sign of life for ``silent_after_s``: out of routing (``silent``), no ejection, no
  peer; back through warm-up when it reports again (``returned``; quarantined again if it was
  out). Pairs never admitted go when silent whatever the others do;
* telemetry lost — ``telemetry_loss_fraction`` of the live, non-warming pairs silent at once
  (with those one tick short, :func:`alongside_s`): nobody goes (fail open), and
  ``telemetry_lost`` opens an episode that ``telemetry_restored`` closes below half that
  share; a pair silent ``forget_after_s`` goes all the same, then is dropped (``forgotten``).

Pure: time is ``now_s``; the same inputs give the same transitions. Rationale: docs/rules.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import FleetEvent, HealthState, Reason, Transition, WindowSummary
from tailguard.core.judge import health
from tailguard.core.judge.health import PairState

_AWAY = (HealthState.GONE, HealthState.RETIRED)
# A crashloop: this many restarts acted on within CRASHLOOP_WINDOW_S; later ones are not.
CRASHLOOP_RESTARTS = 3
CRASHLOOP_WINDOW_S = 900.0
_WARMING = HealthState.WARMING
_RESTARTABLE = (HealthState.WARMING, HealthState.HEALTHY, HealthState.SUSPECT, HealthState.UNHEALTHY)


@dataclass(slots=True)
class Liveness:
    """One model's liveness record (plain data: :meth:`to_dict` / :meth:`from_dict`)."""

    seen: dict[str, float] = field(default_factory=dict)       # node -> last sign of life
    gone_seen: dict[str, float] = field(default_factory=dict)  # gone node -> its seen then
    restart_ts: dict[str, float] = field(default_factory=dict)  # node -> last restart handled
    telemetry_lost: bool = False
    loss_ended_ts: float | None = None     # when the last telemetry-loss episode ended
    # node -> its recent restarts acted on (at most CRASHLOOP_RESTARTS, within CRASHLOOP_WINDOW_S)
    restarts: dict[str, list[float]] = field(default_factory=dict)

    def drop(self, node: str) -> None:
        for d in (self.seen, self.gone_seen, self.restart_ts, self.restarts):
            d.pop(node, None)

    def to_dict(self) -> dict[str, Any]:
        return {"seen": dict(sorted(self.seen.items())), "gone_seen": dict(sorted(self.gone_seen.items())),
                "restart_ts": dict(sorted(self.restart_ts.items())), "telemetry_lost": self.telemetry_lost,
                "loss_ended_ts": self.loss_ended_ts,
                "restarts": {n: list(v) for n, v in sorted(self.restarts.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Liveness:
        return cls({str(k): float(v) for k, v in d["seen"].items()},
                   {str(k): float(v) for k, v in d["gone_seen"].items()},
                   {str(k): float(v) for k, v in d["restart_ts"].items()},
                   bool(d["telemetry_lost"]),
                   None if (e := d.get("loss_ended_ts")) is None else float(e),
                   {str(k): [float(t) for t in v] for k, v in d.get("restarts", {}).items()})


@dataclass(frozen=True, slots=True)
class Step:
    transitions: list[Transition]
    fleet_events: list[FleetEvent]
    forgotten: list[str]            # pairs to drop (their transitions are in ``transitions``)
    telemetry_lost: bool


def _signs_of_life(pairs: Mapping[str, PairState], live: Liveness, by_node: Mapping[str, WindowSummary],
                   now_s: float, st: DetectorSettings) -> tuple[list[str], list[str]]:
    """Record each node's last sign of life; the nodes silent for ``silent_after_s`` (any state,
    for now) and those with a restart on record (see :func:`_restarts`)."""
    seen = live.seen
    get = seen.get
    horizon = now_s - st.silent_after_s if st.silent_after_s > 0 else -math.inf
    quiet: list[str] = []
    restarted: list[str] = []
    for node, s in by_node.items():
        # A summary that does not say when its series was last seen is itself the sign of life.
        last = s.last_seen_ts
        if last is None:
            last = now_s
        prev = get(node)
        if prev is None or last > prev:
            seen[node] = prev = last
        if prev < horizon:
            quiet.append(node)
        if s.instance_ts is not None or s.resumed_ts is not None:
            restarted.append(node)         # few summaries, every tick: never restarted
    if len(pairs) > len(by_node):          # pairs whose series stage 1 no longer reports
        quiet += [n for n in pairs.keys() - by_node.keys() if get(n, pairs[n].since_ts) < horizon]
    return quiet, restarted


def step(model: str, pairs: MutableMapping[str, PairState], live: Liveness,
         by_node: Mapping[str, WindowSummary], now_s: float, st: DetectorSettings) -> Step:
    """Apply restarts, returns, silences and forgetting to ``pairs`` (in place)."""
    seen = live.seen
    get = seen.get
    quiet, restarted = _signs_of_life(pairs, live, by_node, now_s, st)
    transitions: list[Transition] = []
    for node in sorted(live.gone_seen):
        p = pairs.get(node)
        if p is None or p.state is not HealthState.GONE:
            del live.gone_seen[node]
        elif get(node, -1.0) > live.gone_seen[node]:
            del live.gone_seen[node]
            pairs[node], t = health.come_back(p, seen[node], now_s, st)
            transitions.append(t)
    if restarted:                           # (most ticks: nobody restarted)
        transitions += _restarts(pairs, live, by_node, restarted, now_s, st)

    events: list[FleetEvent] = []
    forgotten: list[str] = []
    if st.silent_after_s <= 0:
        return Step(transitions, events, forgotten, False)
    silent = sorted(n for n in quiet if pairs[n].state not in _AWAY) if quiet else []
    forget = st.forget_after_s
    lost = False
    if silent or live.telemetry_lost:
        # Pairs never admitted are in no count (a crowd of one-event ids proves no telemetry
        # loss) and go when silent whatever the others do: they hold no place in routing.
        present = [n for n, p in pairs.items() if p.state not in _AWAY and p.admitted]
        new = {n for n in silent if not pairs[n].admitted}
        # Long silent (forget_after_s): gone whatever the others do; it proves no telemetry loss.
        lasting = {n for n in silent if n not in new and forget > 0
                   and get(n, pairs[n].since_ts) < now_s - forget}
        # Warming pairs prove nothing either way (a flood of new ids is all warming; an admitted
        # node warming after a restart is not counted either).
        recent = sum(1 for n in silent
                     if n not in lasting and n not in new and pairs[n].state is not _WARMING)
        counted = sum(1 for n in present if n not in lasting and pairs[n].state is not _WARMING)
        # Nodes silent almost as long stopped in the same outage if it is one: a fleet that
        # stopped together must not be split by a tick boundary into some gone now and the
        # rest "telemetry lost" a tick later.
        near = now_s - alongside_s(st)
        quiet_set = set(silent)
        alongside = sum(1 for n in present if n not in quiet_set and pairs[n].state is not _WARMING
                        and get(n, pairs[n].since_ts) < near)
        # Telemetry loss needs two nodes to tell it from a death; a lone node is simply never
        # taken out by silence (the last node of a model is never gone). Once lost, it lasts
        # until fewer than half that share are silent: nodes that resume a tick after the rest
        # are not taken for dead in between.
        share = st.telemetry_loss_fraction / (2.0 if live.telemetry_lost else 1.0)
        lost = counted >= 2 and recent > 0 and recent + alongside >= share * counted
        if lost != live.telemetry_lost:
            live.telemetry_lost = lost
            if not lost:
                live.loss_ended_ts = now_s
            events.append(FleetEvent(
                ts=now_s, model=model, kind="telemetry_lost" if lost else "telemetry_restored",
                abnormal_nodes=recent + alongside, judged_nodes=counted,
                detail=(f"{recent + alongside} of {counted} nodes sent nothing for "
                        f"{alongside_s(st):g} s or more ({recent} for silent_after_s="
                        f"{st.silent_after_s:g} s): the telemetry is lost, not the nodes; routing "
                        "stays as it is") if lost else None))
        go = [n for n in silent if not lost or n in lasting or n in new]
        staying = set(present).difference(go)
        if go and not any(pairs[n].routed for n in staying):
            # Silence never empties a routing set: the last routed nodes stay (whatever happened).
            go = [n for n in go if not pairs[n].routed]
    else:
        go = []
    for node in go:
        last = get(node, pairs[node].since_ts)
        pairs[node], t = health.go_silent(pairs[node], now_s, last)
        live.gone_seen[node] = last
        transitions.append(t)
    if forget > 0:
        for node in sorted(live.gone_seen):
            last = live.gone_seen[node]
            if last < now_s - forget:
                p = pairs.pop(node)
                live.drop(node)
                forgotten.append(node)
                transitions.append(Transition(
                    ts=now_s, node_id=node, model=model, from_state=HealthState.GONE,
                    to_state=HealthState.UNKNOWN, routed=False, reason=Reason.FORGOTTEN.value,
                    hardware=p.hardware, from_since_ts=p.since_ts,
                    detail=f"no sample or heartbeat for {now_s - last:.0f} s "
                                                f"(forget_after_s={forget:g})"))
    return Step(transitions, events, forgotten, lost)


def alongside_s(st: DetectorSettings) -> float:
    """How long a node must have been silent to count with the silent ones towards telemetry
    loss: one tick short of ``silent_after_s`` (at least half of it)."""
    return max(st.silent_after_s - st.tick_interval_s, st.silent_after_s / 2)


def _restarts(pairs: MutableMapping[str, PairState], live: Liveness,
              by_node: Mapping[str, WindowSummary], restarted: list[str], now_s: float,
              st: DetectorSettings) -> list[Transition]:
    """Routed pairs whose process restarted since the restart last handled: warming again.
    ``restarted``: the nodes of ``by_node`` (in its order) whose summary has a restart."""
    by_instance: dict[str, float] = {}
    by_gap: dict[str, float] = {}
    for node in restarted:
        s = by_node[node]
        p = pairs.get(node)
        if p is None:
            continue
        # A restart after the tick (a replay reads ahead to the tick's boundary) waits for its tick.
        done = max(p.first_seen_ts, p.since_ts if p.state is HealthState.RETIRED else -1.0,
                   live.restart_ts.get(node, -1.0))
        if p.state is HealthState.RETIRED:
            # A retired node back as a new process under its id (a replaced pod, a repaired
            # host) starts over; its old process, still reporting, does not.
            if s.instance_ts is not None and done < s.instance_ts <= now_s:
                by_instance[node] = s.instance_ts
            continue
        if p.state not in _RESTARTABLE or not (p.routed or p.state is HealthState.WARMING):
            continue                        # (a new pair's restart starts its warm-up over)
        if s.instance_ts is not None and done < s.instance_ts <= now_s:
            by_instance[node] = s.instance_ts
        if s.resumed_ts is not None and done < s.resumed_ts <= now_s:
            by_gap[node] = s.resumed_ts
    ended = live.loss_ended_ts
    after_loss = ended is not None and ended <= now_s <= ended + st.silent_after_s
    if by_gap and (live.telemetry_lost or after_loss):
        # Signs of life resuming during or just after a telemetry loss: the pipeline's gap
        # however the nodes' resumptions fall over ticks.
        for node, ts in by_gap.items():
            live.restart_ts[node] = max(ts, live.restart_ts.get(node, -1.0))
        by_gap = {}
    if len(by_gap) >= 2 and len(by_gap) >= st.load_event_fraction * sum(
            1 for p in pairs.values() if p.state not in _AWAY):
        for node, ts in by_gap.items():     # the pipeline's gap, not restarts: noted, not acted on
            live.restart_ts[node] = max(ts, live.restart_ts.get(node, -1.0))
        by_gap = {}
    out: list[Transition] = []
    for node in sorted(by_instance.keys() | by_gap.keys()):
        ts = max(by_instance.get(node, -1.0), by_gap.get(node, -1.0))
        live.restart_ts[node] = ts
        recent = [r for r in live.restarts.get(node, ()) if r > ts - CRASHLOOP_WINDOW_S]
        if len(recent) >= CRASHLOOP_RESTARTS and pairs[node].state is not HealthState.RETIRED:
            # A crashloop: its restarts no longer shield it from judgement (warm-up samples
            # and all), so a node that keeps restarting slow leaves routing.
            live.restarts[node] = recent
            continue
        live.restarts[node] = [*recent, ts][-CRASHLOOP_RESTARTS:]
        new, t = health.restart(pairs[node], ts, now_s, st)
        pairs[node] = new
        if len(recent) + 1 == CRASHLOOP_RESTARTS:
            t = _with_detail(t, f"restart {CRASHLOOP_RESTARTS} within {CRASHLOOP_WINDOW_S:g} s: "
                                "further restarts are judged, not warmed up")
        out.append(t if node in by_instance else _with_detail(t, "signs of life resumed after a gap"))
    return out


def _with_detail(t: Transition, why: str) -> Transition:
    return dataclasses.replace(t, detail=f"{why}; {t.detail}" if t.detail else why)


def waiting(pairs: Mapping[str, PairState], live: Liveness, now_s: float, st: DetectorSettings) -> bool:
    """True when some pair may still go silent or be forgotten with no new sample at all."""
    if st.silent_after_s <= 0:
        return False
    for node, p in pairs.items():
        age = now_s - live.seen.get(node, p.since_ts)
        if age < 0:       # signs of life already read beyond now (a replay reads ahead)
            continue
        if p.state is HealthState.GONE:
            if st.forget_after_s > 0 and age <= st.forget_after_s:
                return True
        elif p.state is not HealthState.RETIRED and (
                age <= st.silent_after_s or (st.forget_after_s > 0 and age <= st.forget_after_s)):
            return True             # (silent, but kept by a telemetry loss: may still go)
    return False
