"""One tick of stage 2, as a plain object: judge, apply operators, write routing, keep books, publish.

:class:`Stage2Ticker` owns what happens each tick after the stage-2 agent has filled
:class:`~tailguard.streaming.stage2.Stage2` with summaries: it asks :class:`Ownership` which
partitions this worker owns (``None`` while faust rebalances), lets ``Stage2.tick`` judge the
owned models, applies the mode and the operator overrides (:class:`~tailguard.streaming.edge.OperatorEdge`,
read each tick from an :class:`OperatorSource`) and sends each model's routing write to a
:class:`RoutingSink` as soon as the model is judged (:class:`RoutingWrites`: Redis runs it while
the next model is judged), then each model's state, hints and explain history, hands the health
changes, fleet events and diagnostics requests to the publish backlog
(:class:`~tailguard.streaming.publisher.Publisher`) for at most a budget of the tick, and
offers retired nodes to the replace hook. Every one of these is injected, so unit tests drive
a tick without faust, Kafka or Redis (tests/service/test_stage2_ticker.py);
:func:`tailguard.streaming.service.create_app` wires the faust side.

Guarantees: routing never waits on Kafka or on bookkeeping — every model's routing write is
done before any state, hints or history write and any message of the tick, every tick; the
Kafka output is at least once and bounded in bytes (the publisher's guarantees); a failing
operator read keeps the last overrides in force; one model's failing routing write never
stops the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiokafka.partitioner import murmur2

from tailguard.collector import collector_paused
from tailguard.core.contract.types import ModelTick, NodeStatus
from tailguard.routing.apply_script import Extras
from tailguard.routing.operators import OperatorState, Override
from tailguard.routing.tasks import cancel_and_wait
from tailguard.streaming.edge import EdgeInput, EdgeOutput, OperatorEdge
from tailguard.streaming.ingest import next_boundary
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.publisher import Outgoing, Publisher, tick_messages
from tailguard.streaming.stage2 import ModelOutput, Stage2, state_key
from tailguard.streaming.turns import Turns

log = logging.getLogger(__name__)

# Of each stage-2 tick, the share that publishing to Kafka may take after the routing write.
PUBLISH_BUDGET_FRACTION = 0.25


class RoutingSink(Protocol):
    """Where verdicts go: ``tailguard.routing.writer.RoutingWriter`` or a test fake."""

    async def apply(self, tick: ModelTick, extras: Extras = ...) -> bool: ...

    async def write_history(self, model: str, history: Mapping[str, str]) -> bool: ...


class OperatorSource(Protocol):
    """Where operator overrides and modes come from (Redis: ``service.RedisOperators``)."""

    async def read(self) -> OperatorState: ...

    async def delete_expired(self, override: Override) -> None: ...


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


@dataclass(frozen=True)
class OutputTopics:
    """The Kafka topics a tick publishes to (their names, as the publisher's ``send`` knows them)."""

    health: str
    fleet: str
    diagnostics: str


class Stage2Ticker:
    """One stage-2 tick at a time (see the module docstring); :meth:`tick` is the whole of it."""

    def __init__(self, *, stage2: Stage2, edge: OperatorEdge, routing: RoutingSink,
                 publisher: Publisher, topics: OutputTopics, ownership: Ownership, metrics: WorkerMetrics,
                 tick_s: float, max_ejected_fraction: float,
                 operators: OperatorSource | None = None, hook: ReplaceOffers | None = None,
                 clock: Callable[[], float] = time.time, turns: Turns | None = None) -> None:
        self.stage2, self.edge, self.routing, self.publisher = stage2, edge, routing, publisher
        self.topics = topics
        self.ownership, self.metrics, self.operators, self.hook = ownership, metrics, operators, hook
        self.tick_s, self.max_ejected_fraction, self.clock = tick_s, max_ejected_fraction, clock
        self.last_assignment: tuple[int, frozenset[int]] | None = None
        self.gauged_models: set[str] = set()
        self.dropped_reported: dict[str, int] = {}   # stage2.dropped exported so far
        self.operator_state = OperatorState()
        # Between two models the loop runs other work, and a stage-1 tick goes first (turns.py).
        self.turns = turns if turns is not None else Turns()

    async def tick(self) -> list[ModelOutput]:
        """Judge the owned models now, then act on the verdicts; the models' outputs."""
        current = await self.ownership.assignment()
        if current is None:
            log.info("stage-2 tick skipped: rebalancing")
            return []
        now_s = self.clock()
        # Redis first, every tick: each model's routing write is sent as soon as the model is
        # judged and edged, and Redis runs it while the next model is judged; every write is
        # done before any bookkeeping (the state and hints tables, the explain history) and
        # before the tick's messages go to a backlog bounded in bytes, published within a
        # budget and retried (publisher).
        failures_before = self.stage2.write_failures
        writes = RoutingWrites(self.routing, self.turns)
        try:
            outputs, edged = await self.judge(current, now_s, writes)
            await writes.finish()
        finally:
            await writes.close()
        await self.after_the_edge(edged)
        messages = await self.keep_books(outputs, edged, next_boundary(now_s, self.tick_s))
        self.metrics.table_write_failures.inc(self.stage2.write_failures - failures_before)
        await self.publish(messages)
        if self.hook is not None:   # level-triggered: every retired status, every tick (replace.py)
            # Observe mode acts on nothing: its models' retired nodes are not replaced.
            self.hook.offer(s for d in edged if d.mode == "enforce" for s in d.tick.statuses)
        return outputs

    async def judge(self, current: Assignment, now_s: float,
                    writes: RoutingWrites) -> tuple[list[ModelOutput], list[EdgeOutput]]:
        """Stage 2's evaluation of the models whose partitions ``current`` owns, with its metrics,
        each model through the operator edge and its routing write handed to ``writes`` as soon as
        it is judged; the loop runs other work between two models, a stage-1 tick first (:mod:`.turns`)."""
        metrics, stage2 = self.metrics, self.stage2
        assignment = (current.generation, current.owned)
        if self.last_assignment != assignment:
            log.info("stage 2 owns %s partitions %s (generation %s)", current.topic,
                     sorted(current.owned), current.generation)
            stage2.on_assignment_changed()
            self.last_assignment = assignment
            metrics.owned_models.set(0)
        outputs: list[ModelOutput] = []
        edged: list[EdgeOutput] = []
        busy_s = 0.0    # the evaluation's own time, not the other work's between models
        cut = False
        steps = stage2.tick_models(
            now_s, lambda model: partition_for(state_key(model), current.partitions) in current.owned)
        while True:
            t0 = time.perf_counter()
            with collector_paused():    # one pass of the collector per model, not many
                o = next(steps, None)
            busy_s += time.perf_counter() - t0
            if o is None:
                break
            if not outputs:
                await self.read_operators()
            outputs.append(o)
            await self.turns.stage2_step()      # a stage-1 tick goes first after each phase
            edged.append(self.at_the_edge(o, now_s))
            writes.send(edged[-1])
            await self.turns.stage2_step()
            if await self.ownership.assignment() != current:
                # A rebalance began between two models: the rest wait for the next tick (and
                # its owner), their summaries kept; what was judged goes on to Redis.
                log.info("stage-2 tick cut short by a rebalance after %d models", len(outputs))
                steps.close()
                cut = True
                break
        metrics.tick_seconds.observe(busy_s)
        for reason, count in stage2.dropped.items():
            if count > self.dropped_reported.get(reason, 0):
                metrics.summaries_dropped.labels(reason=reason).inc(count - self.dropped_reported.get(reason, 0))
                self.dropped_reported[reason] = count
        if cut:     # the models not judged are not gone: the next tick tells
            return outputs, edged
        metrics.owned_models.set(len(outputs))
        now_owned = {o.tick.model for o in outputs}
        for gone in self.gauged_models - now_owned:
            metrics.forget_model(gone)
            self.edge.forget_model(gone)
        self.gauged_models = now_owned
        metrics.last_tick_ts.set(now_s)
        return outputs, edged

    async def read_operators(self) -> None:
        """The operator overrides and modes of this tick (at its first judged model)."""
        operators = self.operators
        if operators is not None:
            try:
                self.operator_state = await operators.read()
            except Exception as e:  # Redis down: the last overrides read stay in force
                self.metrics.operator_read_failures.inc()
                log.warning("reading operator overrides failed (%s: %s); keeping the last ones",
                            type(e).__name__, e)
        for bad in self.operator_state.bad:
            log.warning("ignoring an operator setting in Redis: %s", bad)

    def at_the_edge(self, out: ModelOutput, now_s: float) -> EdgeOutput:
        """Mode and operator overrides on one model's verdict (tailguard.streaming.edge)."""
        with collector_paused():
            return self.edge.apply(EdgeInput(out.tick, out.transitions, out.summaries, out.streaks),
                                   self.operator_state, now_s)

    async def after_the_edge(self, edged: list[EdgeOutput]) -> None:
        """The operator gauges of each model, and its expired overrides deleted."""
        operators = self.operators
        for done in edged:
            self.metrics.set_operator_view(done.tick.model, done.mode, done.overrides.values(),
                                           done.tick, max_ejected_fraction=self.max_ejected_fraction)
            for o in done.expired:
                if operators is not None:
                    try:
                        await operators.delete_expired(o)
                    except Exception:
                        log.exception("deleting an expired override of %r failed", o.node_id)

    async def keep_books(self, outputs: list[ModelOutput], edged: list[EdgeOutput],
                         hints_for_s: float) -> list[Outgoing]:
        """After every model's routing write, one model at a time: its state and stage-1
        hints to the tables (:meth:`Stage2.persist`), its explain history to Redis
        (:meth:`OperatorEdge.deferred_history`) and its Kafka messages built; the tick's
        messages. The tables before any message is queued, as before: a restart that
        loses this tick's messages (the backlog is in memory) loses its state too."""
        t = self.topics
        messages: list[Outgoing] = []
        for out, done in zip(outputs, edged, strict=True):
            model = out.tick.model
            with collector_paused():
                self.stage2.persist(out, hints_for_s)
                history = self.edge.deferred_history(model)
            if history is not None and not out.tick.forgotten:
                try:
                    await self.routing.write_history(model, history)
                except Exception:  # never stop the other models
                    log.exception("history write of model %r failed", model)
            with collector_paused():    # a first tick of many new nodes: a health change each
                messages += tick_messages((done,), t.health, t.fleet, t.diagnostics, self.metrics)
            await self.turns.stage2_step()
        return messages

    async def publish(self, messages: list[Outgoing]) -> None:
        """The tick's health changes, fleet events and diagnostics requests into the backlog,
        then publishing for at most ``PUBLISH_BUDGET_FRACTION`` of the tick."""
        self.publisher.add(messages)
        await self.publisher.publish(PUBLISH_BUDGET_FRACTION * self.tick_s)
        self.metrics.publish_backlog_bytes.set(self.publisher.nbytes)


class RoutingWrites:
    """One tick's routing writes, in flight while the tick judges on: :meth:`send` queues a
    model's write without waiting, one task awaits them through the sink in the order sent
    (one model at a time, as the writer's lock has them anyway), and :meth:`finish` returns
    once every write sent is done. A write that raises is logged and never stops the others
    (the sink's own retries and back-off are the sink's); :meth:`close` ends the task if the
    tick failed before :meth:`finish`."""

    def __init__(self, routing: RoutingSink, turns: Turns) -> None:
        self.routing, self.turns = routing, turns
        self._queue: asyncio.Queue[EdgeOutput | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name="tailguard-stage2-routing-writes")

    def send(self, out: EdgeOutput) -> None:
        self._queue.put_nowait(out)

    async def finish(self) -> None:
        self._queue.put_nowait(None)
        await self._task

    async def close(self) -> None:
        await cancel_and_wait([self._task])

    async def _run(self) -> None:
        while (out := await self._queue.get()) is not None:
            try:
                await self.routing.apply(out.tick, out.extras)
            except Exception:  # a malformed verdict: never stop the other models
                log.exception("routing write of model %r failed", out.tick.model)
            await self.turns.stage2_step()
