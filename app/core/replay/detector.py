"""The detector façade: stage 1 (windows) + stage 2 (evaluation) in one object.

:class:`Detector` is what a single process (``tailguard replay``, tests, a
one-worker service) drives: ``observe(events)`` feeds decoded events to the
:class:`~tailguard.core.window.window.WindowStore`; ``evaluate(now_s)`` asks the evaluator
which samples to judge (warm-up, quarantine and probe-round cut-offs), lets the
store summarise every (node, model) at event time ``now_s`` and evaluates
every model. It composes, and adds no rule of its own. Each evaluated model's
tick also carries the cluster-wide raw-latency P50/P99
(``ModelTick.fleet_latency_p50_us``/``_p99_us``): exact quantiles of the
model's pool (``WindowStore.model_pools``: an even thinning of every node's
judged samples, ``fleet_digest_per_series`` per series at most; 0 turns them
off and leaves the fields None). ``fleet_digests`` gives the same pools as
mergeable t-digest dicts, built on first access and kept until the next tick. ``unresolved``:
every (model, metric) a tick found its buckets cannot resolve (hist_resolution), for reports.

Guarantees: pure and deterministic (time is ``now_s``; models are evaluated
in sorted order); ``snapshot()`` is plain JSON-able data and a detector
restored from it produces the same future as the original.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Event, Heartbeat
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.contract.types import ModelTick, NodeStatus, TickResult, Transition, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import POOL_SAMPLES_PER_SERIES, WindowStore

SNAPSHOT_VERSION = 1
FLEET_QUANTILES = (0.5, 0.99)
_MODEL = operator.attrgetter("model")


class Detector:
    """WindowStore + FleetEvaluator. Not thread-safe."""

    fleet_digest_per_series = POOL_SAMPLES_PER_SERIES

    def __init__(self, settings: DetectorSettings | None = None, *,
                 pause_collector: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        """``pause_collector``: entered around each whole tick (:meth:`evaluate`) and, by the
        :class:`~tailguard.core.window.window.WindowStore`, around stage 1's summary pass
        (nested in the tick's) — the collector then never walks the tick's summaries, which
        are freed before it runs again."""
        self.settings = settings or DetectorSettings()
        self.pause_collector = pause_collector
        self.store = WindowStore(self.settings, pause_collector=pause_collector)
        self.evaluator = FleetEvaluator(self.settings)
        self._last: dict[str, ModelTick] = {}
        # What the last tick's cluster-wide pools were built from (its time, per_series and
        # models), and their digests once asked for.
        self._pools_of: tuple[float, int, tuple[str, ...]] | None = None
        self._digests: dict[str, dict[str, Any]] | None = None
        # (model, metric) -> the first bucket bound (s) at the latest tick that marked it.
        self.unresolved: dict[tuple[str, str], float] = {}

    def observe(self, events: Iterable[Event]) -> None:
        store = self.store
        for ev in events:
            if isinstance(ev, Heartbeat):
                store.observe_heartbeat(ev)
            elif isinstance(ev, HistogramBatch):
                store.observe_histogram(ev)
            else:
                store.observe(ev)

    def evaluate(self, now_s: float, *, with_statuses: bool = True) -> TickResult:
        """One tick at event time ``now_s`` over every model known to either stage, with the
        collector paused (``pause_collector``) until the tick's summaries are freed."""
        with self.pause_collector():
            return self._evaluate(now_s, with_statuses)

    def _evaluate(self, now_s: float, with_statuses: bool) -> TickResult:
        ev = self.evaluator
        forget_s = self.settings.forget_after_s
        if forget_s > 0:
            self.store.forget_silent(now_s - forget_s)
        summaries = self.store.summaries(now_s, ev.judge_since_all(now_s),
                                         out_of_fit=ev.out_of_fit_all(), tail_refs=ev.tail_refs())
        groups = _by_model(summaries)
        models = sorted(groups.keys() | set(ev.models()))
        per_series = self.fleet_digest_per_series
        pools = (self.store.model_pools(now_s, per_series=per_series, models=groups.keys(),
                                        qs=FLEET_QUANTILES)
                 if per_series > 0 else {})
        self._pools_of = (now_s, per_series, tuple(groups)) if per_series > 0 else None
        self._digests = None
        ticks = []
        for m in models:
            pool = pools.get(m)
            fleet = pool.quantiles(FLEET_QUANTILES) if pool is not None else (None, None)
            ticks.append(ev.evaluate(m, groups.get(m, ()), now_s, with_statuses=with_statuses,
                                     fleet_latency_us=(fleet[0], fleet[1])))
        for t in ticks:
            self._last[t.model] = t
            self.unresolved.update(((t.model, metric), b) for metric, b in t.unresolved)
        return TickResult(ts=now_s, models=tuple(ticks))

    @property
    def fleet_digests(self) -> dict[str, dict[str, Any]]:
        """The last tick's cluster-wide pool of each model as a t-digest dict
        (``ModelPool.digest_dict``: mergeable across workers with ``merge_digests``).

        Built on first access from the windows (the tick keeps no pool: 512 B per series):
        the tick's own pools when nothing was observed since, else the pools of the windows
        as they are, at the tick's time."""
        if self._digests is None:
            if self._pools_of is None:
                self._digests = {}
            else:
                now_s, per_series, models = self._pools_of
                self._digests = self.store.model_digests(now_s, per_series=per_series, models=models)
        return self._digests

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


def _by_model(summaries: list[WindowSummary]) -> dict[str, list[WindowSummary]]:
    """Each model's summaries. ``summaries`` is sorted by model (``WindowStore.summaries``), so
    each model's run is found by bisection instead of a look at every summary."""
    out: dict[str, list[WindowSummary]] = {}
    i, n = 0, len(summaries)
    while i < n:
        m = summaries[i].model
        j = bisect.bisect_right(summaries, m, lo=i, key=_MODEL)
        out[m] = summaries[i:j]
        i = j
    return out
