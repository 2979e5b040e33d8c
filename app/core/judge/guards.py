"""Fleet guards of stage 2: what no verdict may override, whatever the input.

Owns three decisions taken per model and tick after the per-pair rules:

* the ejection guard — at most ``floor(max_ejected_fraction × nodes)`` pairs out of routing
  (unhealthy-ejected, quarantined, retired), worst severity first, and never the last routed
  node; the rest stay unhealthy *and routed* (reason ``ejection_cap``) until room appears.
  Only admitted pairs count (:mod:`tailguard.core.judge.admission`): a new pair confirmed
  abnormal before it was ever routed is refused whatever the cap, and counts in neither;
* the load event — at least ``load_event_fraction`` of the peers (and at least ``min_peers``)
  abnormal in one tick: ``load_event`` opens the episode (``load_event_end`` closes it); no
  streak moves, nobody is ejected but a node whose fresh P50 is past the limit against its
  peers' fresh P50s, which move with the fleet (:func:`through_load`);
* the error storm — at least ``load_event_fraction`` of the routed pairs past
  ``max_error_share`` at once: ``error_storm`` opens the episode (``error_storm_end``
  closes it); nobody is ejected for it.

Guarantees: every fleet event marks a change of episode (one per opening, one per closing),
and the guard's transitions come out in a deterministic order (severity, then node id).
Rationale: docs/rules.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import (
    DiagnosticsRequest,
    FleetEvent,
    HealthState,
    Reason,
    Transition,
)
from tailguard.core.judge import health
from tailguard.core.judge.baseline import baseline_fleet_p50
from tailguard.core.judge.health import Judgement, PairState, Verdict
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.request_rules import ErrorReport


def eject_within_cap(model: str, pairs: dict[str, PairState], candidates: list[PairState],
                     now_s: float, st: DetectorSettings, transitions: list[Transition],
                     diagnostics: list[DiagnosticsRequest]) -> None:
    """Take confirmed-abnormal ``candidates`` out of routing, worst first, within the cap;
    keep the rest in (``ejection_cap``). Appends to ``transitions`` and ``diagnostics``."""
    # Gone pairs are in no count: the cap is a share of the nodes that are there. Pairs never
    # admitted are in none either: they were never capacity, and a crowd of ids must not move it.
    gone = HealthState.GONE
    n_nodes = out = 0
    for p in pairs.values():
        if p.admitted and p.state is not gone:
            n_nodes += 1
            out += not p.routed
    allowed_out = math.floor(st.max_ejected_fraction * n_nodes + 1e-9)
    routed = n_nodes - out
    candidates.sort(key=lambda p: (-p.severity, p.node_id))
    for p in candidates:
        refused = not p.admitted     # refused admission: it was never routed, counts nowhere
        if refused or (out < allowed_out and routed > 1):
            new, t = health.eject(p, now_s, st)
            if not refused:
                out += 1
                routed -= 1
            diagnostics.append(DiagnosticsRequest(ts=now_s, node_id=p.node_id, model=model,
                                                  reason=new.reason))
        else:
            why = ("the last routed node" if routed <= 1 else
                   f"{out} of {n_nodes} out already (max_ejected_fraction="
                   f"{st.max_ejected_fraction:g})")
            new, t2 = health.keep_in(p, now_s, f"confirmed abnormal, kept in: {why}")
            if t2 is None:
                pairs[p.node_id] = new
                continue
            t = t2
        pairs[p.node_id] = new
        transitions.append(t)


def load_event(model: str, ms: ModelState, abnormal: int, n_peers: int, now_s: float,
               fleet_p50: float | None, signal: str | None,
               st: DetectorSettings) -> tuple[bool, FleetEvent | None]:
    """Whether this tick is a load event, and the fleet event when the episode changes."""
    load = n_peers >= st.min_peers and abnormal >= st.load_event_fraction * n_peers
    if load == ms.load_event:
        return load, None
    ms.load_event = load
    return load, FleetEvent(
        ts=now_s, model=model, kind="load_event" if load else "load_event_end",
        abnormal_nodes=abnormal, judged_nodes=n_peers, fleet_p50=fleet_p50,
        baseline_p50=baseline_fleet_p50(ms), signal=signal,
        detail=(f"{abnormal} of {n_peers} judged nodes abnormal in one tick: "
                "nobody is ejected while it lasts") if load else None)


def through_load(judgements: Mapping[str, Judgement],
                 st: DetectorSettings) -> dict[str, Judgement]:
    """Of a load event's verdicts, those that stand: abnormal with a fresh P50 (the last
    tick's samples) past ``relative_p50_factor ×`` the peers' fresh P50 (same class), as a
    ``relative_p50`` verdict. The rest are dropped (no streak moves)."""
    f50 = st.relative_p50_factor
    out: dict[str, Judgement] = {}
    for node, j in judgements.items():
        ev = j.evidence
        if (j.verdict is not Verdict.ABNORMAL or ev is None or ev.fresh_p50 is None
                or ev.peers_fresh_p50 is None or not ev.fresh_p50 > f50 * ev.peers_fresh_p50):
            continue
        out[node] = dataclasses.replace(
            j, reason=Reason.RELATIVE_P50.value, detail=(
                f"p50 of the last {st.tick_interval_s:g} s {ev.fresh_p50:.1f} > {f50:g} x "
                f"peers' {ev.peers_fresh_p50:.1f}, during a load event (the peers' fresh "
                f"P50s move with the fleet); {j.detail}"))
    return out


def error_storm(model: str, ms: ModelState, errors: ErrorReport, now_s: float,
                signal: str | None, st: DetectorSettings) -> FleetEvent | None:
    """The fleet event when an error storm opens or closes."""
    failing, counted = errors.failing, errors.counted
    storm = counted >= st.min_peers and failing >= st.load_event_fraction * counted
    if storm == ms.error_storm:
        return None
    ms.error_storm = storm
    ref = errors.ref                    # a median: only when an event says it
    return FleetEvent(
        ts=now_s, model=model, kind="error_storm" if storm else "error_storm_end",
        abnormal_nodes=failing, judged_nodes=counted, signal=signal,
        detail=(f"{failing} of {counted} nodes failed more than "
                f"{st.max_error_share:.0%} of their requests since the last tick "
                f"(median share {ref:.1%}): nobody is ejected for it")
        if storm and ref is not None else None)
