"""The detector façade: stage 1 (windows) + stage 2 (evaluation) in one object.

:class:`Detector` is what a single process (``tailguard replay``, tests, a
one-worker service) drives: ``observe(events)`` feeds decoded events to the
:class:`~app.core.window.WindowStore`; ``evaluate(now_s)`` asks the evaluator
which samples to judge (warm-up, quarantine and probe-round cut-offs), lets the
store summarise every (node, model) at event time ``now_s`` and evaluates
every model. It composes, and adds no rule of its own.

Guarantees: pure and deterministic (time is ``now_s``; models are evaluated
in sorted order); ``snapshot()`` is plain JSON-able data and a detector
restored from it produces the same future as the original.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.config import DetectorSettings
from app.core.evaluate import FleetEvaluator
from app.core.events import Heartbeat, SampleBatch
from app.core.types import ModelTick, NodeStatus, TickResult, Transition
from app.core.window import WindowStore

SNAPSHOT_VERSION = 1


class Detector:
    """WindowStore + FleetEvaluator. Not thread-safe."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.store = WindowStore(self.settings)
        self.evaluator = FleetEvaluator(self.settings)
        self._last: dict[str, ModelTick] = {}

    def observe(self, events: Iterable[SampleBatch | Heartbeat]) -> None:
        store = self.store
        for ev in events:
            if isinstance(ev, Heartbeat):
                store.observe_heartbeat(ev)
            else:
                store.observe(ev)

    def evaluate(self, now_s: float, *, with_statuses: bool = True) -> TickResult:
        """One tick at event time ``now_s`` over every model known to either stage."""
        ev = self.evaluator
        summaries = self.store.summaries(now_s, ev.judge_since_all(now_s),
                                         out_of_fit=ev.out_of_fit_all())
        groups = {m: list(g) for m, g in itertools.groupby(summaries, key=lambda s: s.model)}
        models = sorted(groups.keys() | set(ev.models()))
        ticks = tuple(ev.evaluate(m, groups.get(m, ()), now_s, with_statuses=with_statuses)
                      for m in models)
        for t in ticks:
            self._last[t.model] = t
        return TickResult(ts=now_s, models=ticks)

    def apply_diagnostics(self, model: str, node_id: str, recoverable: bool,
                          now_s: float) -> list[Transition]:
        return self.evaluator.apply_diagnostics(model, node_id, recoverable, now_s)

    def statuses(self) -> list[NodeStatus]:
        """Per-(node, model) status as of the last tick (with statuses) of each model."""
        return [s for m in sorted(self._last) for s in self._last[m].statuses]

    def routing(self) -> dict[str, frozenset[str]]:
        return {m: t.routing for m, t in sorted(self._last.items())}

    def snapshot(self) -> dict[str, Any]:
        return {"version": SNAPSHOT_VERSION, "store": self.store.snapshot(),
                "evaluator": self.evaluator.snapshot()}

    def restore(self, data: Mapping[str, Any]) -> None:
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"detector snapshot version {data.get('version')!r} is not "
                             f"supported ({SNAPSHOT_VERSION})")
        self.store.restore(data["store"])
        self.evaluator.restore(dict(data["evaluator"]))
        self._last = {}
