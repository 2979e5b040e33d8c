"""One tick of stage 2, as a plain object: judge, apply operators, publish, write routing.

:class:`Stage2Ticker` owns what happens each tick after the stage-2 agent has filled
:class:`~tailguard.streaming.stage2.Stage2` with summaries: it asks :class:`Ownership` which
partitions this worker owns (``None`` while faust rebalances), lets ``Stage2.tick`` judge the
owned models, applies the mode and the operator overrides (:class:`~tailguard.streaming.edge.OperatorEdge`,
read each tick from an :class:`OperatorSource`), publishes health changes, fleet events and
diagnostics requests through an :class:`EventPublisher`, writes each model's routing through a
:class:`RoutingSink` and offers retired nodes to the replace hook. Every one of these is
injected, so unit tests drive a tick without faust, Kafka or Redis
(tests/service/test_stage2_ticker.py); :func:`tailguard.streaming.service.create_app` wires the
faust side.

Guarantees: at least once — what a failed publish left behind is published first at the next
tick (consumers drop repeats by event_id), bounded by ``MAX_UNPUBLISHED_TICKS`` model-ticks
(the oldest dropped first); a failing operator read keeps the last overrides in force; one
model's failing routing write never stops the others.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka.partitioner import murmur2

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import Extras
from tailguard.routing.operators import OperatorState, Override
from tailguard.streaming.edge import EdgeInput, EdgeOutput, OperatorEdge
from tailguard.streaming.ingest import next_boundary
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage2 import ModelOutput, Stage2, state_key
from tailguard.streaming.wire import dumps

log = logging.getLogger(__name__)

MAX_UNPUBLISHED_TICKS = 10_000   # model-ticks kept for re-publishing while Kafka is down


class RoutingSink(Protocol):
    """Where verdicts go: ``tailguard.routing.writer.RoutingWriter`` or a test fake."""

    async def apply(self, tick: ModelTick, extras: Extras = ...) -> bool: ...


class OperatorSource(Protocol):
    """Where operator overrides and modes come from (Redis: ``service.RedisOperators``)."""

    async def read(self) -> OperatorState: ...

    async def delete_expired(self, override: Override) -> None: ...


class EventPublisher(Protocol):
    """The output topics. ``send`` queues one record and returns its delivery future;
    ``flush`` waits until everything queued is sent."""

    async def send(self, topic: str, key: bytes, value: bytes) -> Awaitable[Any]: ...

    async def flush(self) -> None: ...


class ReplaceOffers(Protocol):
    """The replace hook's intake (:class:`~tailguard.streaming.replace.ReplaceHook`)."""

    def offer(self, statuses: Iterable[NodeStatus]) -> int: ...


@dataclass(frozen=True)
class Assignment:
    """What this worker owns of the stage-2 input topic at one tick."""

    topic: str                 # the stage-2 input topic (node-window-stats)
    generation: int
    owned: frozenset[int]
    partitions: int            # of the topic (the partitioner's modulus)


class Ownership(Protocol):
    """The consumer group's view: ``None`` while a rebalance or a table recovery runs."""

    async def assignment(self) -> Assignment | None: ...


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (aiokafka's, Java's) picks for ``key``."""
    return int((murmur2(key) & 0x7FFFFFFF) % partitions)


# The EventPublisher topics a tick writes (names of the roles, not of the Kafka topics).
HEALTH, FLEET, DIAGNOSTICS = "health", "fleet", "diagnostics"


class Stage2Ticker:
    """One stage-2 tick at a time (see the module docstring); :meth:`tick` is the whole of it."""

    def __init__(self, *, stage2: Stage2, edge: OperatorEdge, routing: RoutingSink,
                 publisher: EventPublisher, ownership: Ownership, metrics: WorkerMetrics,
                 tick_s: float, max_ejected_fraction: float,
                 operators: OperatorSource | None = None, hook: ReplaceOffers | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.stage2, self.edge, self.routing, self.publisher = stage2, edge, routing, publisher
        self.ownership, self.metrics, self.operators, self.hook = ownership, metrics, operators, hook
        self.tick_s, self.max_ejected_fraction, self.clock = tick_s, max_ejected_fraction, clock
        self.last_assignment: tuple[int, frozenset[int]] | None = None
        self.gauged_models: set[str] = set()
        self.dropped_reported: dict[str, int] = {}   # stage2.dropped exported so far
        self.unpublished: list[EdgeOutput] = []
        self.operator_state = OperatorState()

    async def tick(self) -> list[ModelOutput]:
        """Judge the owned models now, then act on the verdicts; the models' outputs."""
        current = await self.ownership.assignment()
        if current is None:
            log.info("stage-2 tick skipped: rebalancing")
            return []
        now_s = self.clock()
        outputs = self.judge(current, now_s)
        edged = await self.at_the_edge(outputs, now_s)
        # At least once: what a failed publish left behind goes out first at the next tick
        # (consumers drop the repeats by event_id); bounded, the oldest are dropped first.
        pending = [*self.unpublished, *edged][-MAX_UNPUBLISHED_TICKS:]
        self.unpublished = pending
        await self.publish(pending)
        self.unpublished = []
        await self.write_routing(pending)
        if self.hook is not None:   # level-triggered: every retired status, every tick (replace.py)
            # Observe mode acts on nothing: its models' retired nodes are not replaced.
            self.hook.offer(s for d in edged if d.mode == "enforce" for s in d.tick.statuses)
        return outputs

    def judge(self, current: Assignment, now_s: float) -> list[ModelOutput]:
        """Stage 2's evaluation of the models whose partitions ``current`` owns, with its metrics."""
        metrics, stage2 = self.metrics, self.stage2
        assignment = (current.generation, current.owned)
        if self.last_assignment != assignment:
            log.info("stage 2 owns %s partitions %s (generation %s)", current.topic,
                     sorted(current.owned), current.generation)
            stage2.on_assignment_changed()
            self.last_assignment = assignment
            metrics.owned_models.set(0)
        t0 = time.perf_counter()
        failures_before = stage2.write_failures
        outputs = stage2.tick(
            now_s, lambda model: partition_for(state_key(model), current.partitions) in current.owned,
            hints_for_s=next_boundary(now_s, self.tick_s))
        metrics.tick_seconds.observe(time.perf_counter() - t0)
        metrics.table_write_failures.inc(stage2.write_failures - failures_before)
        for reason, count in stage2.dropped.items():
            if count > self.dropped_reported.get(reason, 0):
                metrics.summaries_dropped.labels(reason=reason).inc(count - self.dropped_reported.get(reason, 0))
                self.dropped_reported[reason] = count
        metrics.owned_models.set(len(outputs))
        now_owned = {o.tick.model for o in outputs}
        for gone in self.gauged_models - now_owned:
            metrics.forget_model(gone)
            self.edge.forget_model(gone)
        self.gauged_models = now_owned
        metrics.last_tick_ts.set(now_s)
        return outputs

    async def at_the_edge(self, outputs: list[ModelOutput], now_s: float) -> list[EdgeOutput]:
        """Mode and operator overrides on each verdict (tailguard.streaming.edge)."""
        operators = self.operators
        if operators is not None and outputs:
            try:
                self.operator_state = await operators.read()
            except Exception as e:  # Redis down: the last overrides read stay in force
                self.metrics.operator_read_failures.inc()
                log.warning("reading operator overrides failed (%s: %s); keeping the last ones",
                            type(e).__name__, e)
        ops = self.operator_state
        for bad in ops.bad:
            log.warning("ignoring an operator setting in Redis: %s", bad)
        edged = [self.edge.apply(EdgeInput(o.tick, o.transitions, o.summaries, o.streaks), ops, now_s)
                 for o in outputs]
        for done in edged:
            self.metrics.set_operator_view(done.tick.model, done.mode, done.overrides.values(),
                                           done.tick, max_ejected_fraction=self.max_ejected_fraction)
            for o in done.expired:
                if operators is not None:
                    try:
                        await operators.delete_expired(o)
                    except Exception:
                        log.exception("deleting an expired override of %r failed", o.node_id)
        return edged

    async def publish(self, outputs: list[EdgeOutput]) -> None:
        """Health changes, fleet events and diagnostics requests of ``outputs``, all delivered."""
        metrics, publisher = self.metrics, self.publisher
        futs = []
        for out in outputs:
            tick = out.tick
            key = state_key(tick.model)
            for ev in out.health_events:
                futs.append(await publisher.send(HEALTH, key, dumps(ev)))
                if "operator" not in ev:    # a drain or pin is no state transition
                    metrics.transitions.labels(to=str(ev["to"])).inc()
            for f in tick.fleet_events:
                futs.append(await publisher.send(FLEET, key, dumps(f.to_event())))
                metrics.fleet_events.labels(model=tick.model, kind=f.kind).inc()
            for r in tick.diagnostics:
                futs.append(await publisher.send(DIAGNOSTICS, r.node_id.encode(), dumps(r.to_event())))
            counts: collections.Counter[HealthState] = collections.Counter(
                s.state for s in tick.statuses)
            metrics.set_node_states(tick.model, dict(counts))
            metrics.set_cluster_latency(tick.model, tick.fleet_latency_p50_us,
                                        tick.fleet_latency_p99_us)
        await asyncio.gather(*futs)
        if outputs:
            await publisher.flush()

    async def write_routing(self, outputs: list[EdgeOutput]) -> None:
        """Each model's routing set (and its extras) to the routing sink, one model at a time."""
        for out in outputs:
            try:
                await self.routing.apply(out.tick, out.extras)
            except Exception:  # a malformed verdict: never stop the other models
                log.exception("routing write of model %r failed", out.tick.model)
