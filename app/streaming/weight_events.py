"""Routing-weight changes as health-change events, at most one per node per interval.

:class:`WeightAnnouncer` turns each model's tick (its routing weights,
:attr:`~tailguard.core.contract.types.ModelTick.weights`, and the core's changes with their evidence) into
``{"type": "weight", ...}`` documents for the health-change topic (docs/contracts.md).

Guarantees, per model and node:

* Every published event moves the weight from the last published one (``previous_weight``)
  to the current one; a node whose weight is back at 1.0, or leaves 1.0, is announced at once.
* Otherwise at most one event per ``interval_s``: a change within it is published at the first
  tick after it (with the weight then), so the last weight is always announced.
* A node that leaves routing is forgotten without an event (its transition says it); it
  comes back at 1.0.
* ``event_id`` is a function of (model, node, weight, ts): the same event derived twice by a new
  owner of the model carries the same id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from tailguard.core.contract.types import ModelTick, WeightChange

WEIGHT_EVENT_INTERVAL_S = 60.0


class WeightAnnouncer:
    """What weight events to publish, per model (one owner per model, like the edge)."""

    def __init__(self, interval_s: float = WEIGHT_EVENT_INTERVAL_S) -> None:
        if not interval_s >= 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s!r}")
        self.interval_s = interval_s
        self._last: dict[str, dict[str, tuple[float, float]]] = {}   # model -> node -> (ts, w)

    def forget_model(self, model: str) -> None:
        self._last.pop(model, None)

    def events(self, tick: ModelTick, routing: AbstractSet[str], written: Mapping[str, float],
               enforced: bool, now_s: float) -> list[dict[str, Any]]:
        """The weight events of ``tick``; ``routing``: the set written, ``written``: the
        weights written (a node in neither has its weight published as not ``enforced``)."""
        last = self._last.setdefault(tick.model, {})
        changes = {c.node_id: c for c in tick.weight_changes}
        out: list[dict[str, Any]] = []
        for node in sorted(tick.weights.keys() | last.keys()):
            if node not in routing:
                last.pop(node, None)
                continue
            w = tick.weights.get(node, 1.0)
            at, before = last.get(node, (None, 1.0))
            if w == before:
                continue
            if (at is not None and now_s - at < self.interval_s and w < 1.0
                    and before < 1.0):
                continue            # within the interval: announced at a later tick
            c = changes.get(node)
            reason = (c.reason if c is not None
                      else "slower_than_peers" if w < before else "recovering")
            d = WeightChange(now_s, node, tick.model, w, before, reason,
                             None if c is None else c.evidence).to_event()
            d["enforced"] = enforced and (node in written or w == 1.0)
            key = f"{tick.model}\x1f{node}\x1fweight\x1f{w!r}\x1f{now_s!r}"
            d["event_id"] = hashlib.sha256(key.encode()).hexdigest()[:32]
            out.append(d)
            if w < 1.0:
                last[node] = (now_s, w)
            else:
                del last[node]
        return out
