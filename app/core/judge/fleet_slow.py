"""The ``fleet_slow`` fleet event: every live node of a model far slower than its own baseline.

Owns the episode that says a fleet slowed down together, whatever its size (the relative
rules flag nobody then, and ``baseline_shift`` needs ``min_peers`` peers):

* a node's reference is its own P50 baseline (:mod:`tailguard.core.judge.own_history`, while
  the model has at most ``own_history_max`` peers) or else its hardware class's slow baseline
  (:mod:`tailguard.core.judge.baseline`), once either has enough ticks behind it;
* the live nodes are the pairs with a judged window this tick in the peers' signal (routed
  peers and pairs out of routing; never warming, gone or retired);
* ``fleet_slow`` opens when the live nodes (at least :data:`MIN_NODES`) all have a reference
  and every one's P50 is above ``relative_p50_factor ×`` it. The references are frozen at the
  opening (``ModelState.fleet_slow``); ``fleet_slow_end`` closes the episode when some node of
  it is back within :data:`CLEAR_FACTOR` of its frozen reference, when none is left, or when
  the model's signal changes.

A report only: it ejects, holds and lets back in nobody. Pure: no clock, ``now_s`` passed.
Rationale and the choice about quarantined nodes: docs/rules.md ("A fleet that slows
together").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import FleetEvent, HealthState, WindowSummary
from tailguard.core.judge.health import PairState
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.own_history import MIN_TICKS
from tailguard.core.judge.peers import SMALL_CLASS_MIN_TICKS, hw_class, median

MIN_NODES = 1
CLEAR_FACTOR = 1.25

_NOT_LIVE = (HealthState.WARMING, HealthState.GONE, HealthState.RETIRED, HealthState.UNKNOWN)


def live_p50s(by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
              signal: str | None, min_samples: int) -> dict[str, float]:
    """``{node: window P50}`` of the live nodes (see the module docstring) in ``signal``."""
    return dict(_live(by_node, pairs, signal, min_samples))


def _live(by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
          signal: str | None, min_samples: int) -> Iterator[tuple[str, float]]:
    """:func:`live_p50s` one node at a time (in ``by_node``'s order)."""
    for node, s in by_node.items():
        p = pairs.get(node)
        if (p is None or p.state in _NOT_LIVE or s.signal != signal or s.samples < min_samples
                or s.p50 is None or not s.p50 > 0 or not math.isfinite(s.p50)):
            continue
        yield node, s.p50


def reference(ms: ModelState, node: str, hardware: str | None, own_ok: bool) -> float | None:
    """``node``'s reference P50: its own baseline, else its class's, else None."""
    own = ms.own
    if own_ok and own.ticks.get(node, 0) >= MIN_TICKS:
        return math.exp(own.log_p50[node])
    c = hw_class(hardware)
    if c in ms.baseline_p50 and ms.baseline_ticks.get(c, 0) >= SMALL_CLASS_MIN_TICKS:
        return math.exp(ms.baseline_p50[c])
    return None


def fleet_slow(model: str, ms: ModelState, by_node: Mapping[str, WindowSummary],
               signal: str | None, now_s: float, st: DetectorSettings,
               own_ok: bool) -> FleetEvent | None:
    """The ``fleet_slow``/``fleet_slow_end`` event when the episode opens or closes
    (updates ``ms.fleet_slow``/``ms.fleet_slow_signal``); None otherwise."""
    if ms.fleet_slow:
        return _maybe_close(model, ms, live_p50s(by_node, ms.pairs, signal, st.min_samples),
                            signal, now_s)
    # The episode opens only when every live node is slow: the first one that is not ends
    # the look (most ticks, the first node).
    refs: dict[str, float] = {}
    for node, p50 in _live(by_node, ms.pairs, signal, st.min_samples):
        r = reference(ms, node, by_node[node].hardware, own_ok)
        if r is None or not p50 > st.relative_p50_factor * r:
            return None
        refs[node] = r
    if len(refs) < MIN_NODES:
        return None
    live = live_p50s(by_node, ms.pairs, signal, st.min_samples)
    ms.fleet_slow, ms.fleet_slow_signal = refs, signal
    factors = [live[n] / refs[n] for n in refs]
    fleet_p50, before = median(list(live.values())), median(list(refs.values()))
    out = sum(1 for n in live if not ms.pairs[n].routed)
    unjudged = sum(1 for n in ms.pairs.unrouted
                   if n not in live and ms.pairs[n].state not in _NOT_LIVE)
    return FleetEvent(
        ts=now_s, model=model, kind="fleet_slow", abnormal_nodes=len(refs),
        judged_nodes=len(live), fleet_p50=fleet_p50, baseline_p50=before, signal=signal,
        detail=(f"{len(refs)} of {len(live)} live nodes run far slower than their own "
                f"baselines: P50 x{median(factors):.1f} (x{min(factors):.1f} to "
                f"x{max(factors):.1f}; the limit is x{st.relative_p50_factor:g}, "
                f"relative_p50_factor), fleet P50 {fleet_p50:.1f} against {before:.1f} "
                f"before, in {signal}; {out} of them out of routing, and {unjudged} more out of "
                f"routing with no judged window. Nobody is ejected for it; "
                "a node out of routing comes back when it is no slower than its peers"))


def _maybe_close(model: str, ms: ModelState, live: Mapping[str, float], signal: str | None,
                 now_s: float) -> FleetEvent | None:
    refs = ms.fleet_slow
    judged = {n: live[n] / refs[n] for n in refs if n in live}
    if signal != ms.fleet_slow_signal:
        why = f"the judged signal changed ({ms.fleet_slow_signal} -> {signal})"
    elif not any(n in ms.pairs and ms.pairs[n].state not in _NOT_LIVE for n in refs):
        why = "no node of the episode is live any more"
    elif judged and min(judged.values()) < CLEAR_FACTOR:
        back = min(judged, key=judged.__getitem__)
        why = (f"{back} is back to x{judged[back]:.2f} of its baseline before the episode "
               f"(median of the episode's nodes x{median(list(judged.values())):.2f})")
    else:
        return None
    before = median(list(refs.values()))
    fleet_p50 = median(list(live.values())) if live else None
    ms.fleet_slow, ms.fleet_slow_signal = {}, None
    return FleetEvent(ts=now_s, model=model, kind="fleet_slow_end",
                      abnormal_nodes=sum(1 for f in judged.values() if f >= CLEAR_FACTOR),
                      judged_nodes=len(live), fleet_p50=fleet_p50, baseline_p50=before,
                      signal=signal, detail=f"the fleet slowdown is over: {why}")
