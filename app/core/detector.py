"""The detector façade: stage 1 (windows) + stage 2 (evaluation) in one object.

:class:`Detector` is what a single process (``tailguard replay``, tests, a
one-worker service) drives: ``observe(events)`` feeds decoded events to the
:class:`~app.core.window.WindowStore`; ``evaluate(now_s)`` asks the evaluator
which samples to judge (warm-up, quarantine and probe-round cut-offs), lets the
store summarise every (node, model) at event time ``now_s`` and evaluates
every model. It composes, and adds no rule of its own. Each evaluated model's
tick also carries the cluster-wide raw-latency P50/P99
(``ModelTick.fleet_latency_p50_us``/``_p99_us``) from one t-digest per model
(``WindowStore.model_digests``, ``fleet_digest_per_series`` samples per
series at most; 0 turns them off and leaves the fields None); the digests
stay in ``fleet_digests`` until the next tick.

Guarantees: pure and deterministic (time is ``now_s``; models are evaluated
in sorted order); ``snapshot()`` is plain JSON-able data and a detector
restored from it produces the same future as the original.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.config import DetectorSettings
from app.core.evaluate import FleetEvaluator
from app.core.events import Heartbeat, SampleBatch
from app.core.quantiles import digest_from_dict, digest_quantiles
from app.core.types import ModelTick, NodeStatus, TickResult, Transition
from app.core.window import WindowStore

SNAPSHOT_VERSION = 1
FLEET_QUANTILES = (0.5, 0.99)


class Detector:
    """WindowStore + FleetEvaluator. Not thread-safe."""

    fleet_digest_per_series = 128

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.store = WindowStore(self.settings)
        self.evaluator = FleetEvaluator(self.settings)
        self._last: dict[str, ModelTick] = {}
        # The last tick's cluster-wide digests per model (WindowStore.model_digests).
        self.fleet_digests: dict[str, dict[str, Any]] = {}

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
        per_series = self.fleet_digest_per_series
        self.fleet_digests = (self.store.model_digests(now_s, per_series=per_series,
                                                       models=groups.keys())
                              if per_series > 0 else {})
        ticks = tuple(self._with_fleet_quantiles(
            ev.evaluate(m, groups.get(m, ()), now_s, with_statuses=with_statuses))
            for m in models)
        for t in ticks:
            self._last[t.model] = t
        return TickResult(ts=now_s, models=ticks)

    def _with_fleet_quantiles(self, tick: ModelTick) -> ModelTick:
        d = self.fleet_digests.get(tick.model)
        q = None if d is None else digest_quantiles(digest_from_dict(d), FLEET_QUANTILES)
        if q is None:
            return tick
        return dataclasses.replace(tick, fleet_latency_p50_us=q[0], fleet_latency_p99_us=q[1])

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
