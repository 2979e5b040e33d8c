"""The faust app: topics, the stage-1 ingestion service, stage-2 agents, tables, ticks.

:func:`create_app` builds one :class:`faust.App` from :class:`~tailguard.settings.Settings` (no
module-level app, nothing read from the environment here); :func:`runtime_of` gives its
:class:`Runtime`. One worker process runs (in detail: docs/operations.md, "Running the worker"):

* stage-1 ingestion (:class:`~tailguard.streaming.ingest.IngestService`): ``latency-events`` →
  windows; every ``tick_interval_s`` summaries and cluster digests → ``node-window-stats``;
* the stage-2 agent over ``node-window-stats`` and the stage-2 tick, :func:`stage2_offset_s`
  after each stage-1 tick: it evaluates the owned models, stores their state in the ``health``
  table, publishes, writes Redis after the operator edge (:mod:`tailguard.streaming.edge`) and offers
  retired nodes to the replace hook;
* the ``judge_since`` GlobalTable (stage 2's hints for every stage 1) and the status page.

Guarantees: a model is evaluated by the one worker that owns its partition; a restarted or
replacement worker restores the model's state from the changelog before evaluating it;
nothing it buffers is unbounded (see stage1/stage2/ingest); bad input is counted, logged
with its coordinates and dead-lettered; a failing Redis never stops evaluation (the writer
retries the latest verdict in the background).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import faust
from aiokafka.partitioner import murmur2
from mode import Service
from prometheus_client import CollectorRegistry

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.ids import Allowlist
from tailguard.core.contract.types import ModelTick, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import WindowStore
from tailguard.routing.apply_script import Extras
from tailguard.routing.keys import Keys
from tailguard.routing.operators import (
    OperatorState,
    Override,
    delete_if_unchanged,
    read_operator_state,
)
from tailguard.security import faust_broker_credentials
from tailguard.settings import Settings, redact_url
from tailguard.streaming import allowlist
from tailguard.streaming.deadletter import DeadLetter
from tailguard.streaming.edge import EdgeInput, EdgeOutput, OperatorEdge
from tailguard.streaming.ingest import IngestService, next_boundary, sleep_until
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.publisher import Publisher, tick_messages
from tailguard.streaming.replace import ReplaceHook, build_hook
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.stage2 import ModelOutput, Stage2, StageHints, decode_hints, state_key
from tailguard.streaming.wire import (
    ClusterDigest,
    DiagnosticsResult,
    decode_stage2,
    dumps,
    encode_cluster,
    encode_diagnostics,
    encode_summary,
)

log = logging.getLogger(__name__)

STAGE2_TAKE = 2000
STAGE2_OFFSET_MAX_S = 5.0
# Of each stage-2 tick, the share that publishing to Kafka may take after the routing write.
PUBLISH_BUDGET_FRACTION = 0.25


class RoutingSink(Protocol):
    """Where verdicts go: ``tailguard.routing.writer.RoutingWriter`` or a test fake."""

    async def apply(self, tick: ModelTick, extras: Extras = ...) -> bool: ...


class OperatorSource(Protocol):
    """Where operator overrides and modes come from (Redis: :class:`RedisOperators`)."""

    async def read(self) -> OperatorState: ...

    async def delete_expired(self, override: Override) -> None: ...


class RedisOperators:
    """:class:`OperatorSource` on the Redis that holds the routing keys."""

    def __init__(self, redis: Any, key_prefix: str) -> None:
        self.redis, self.keys = redis, Keys(key_prefix)

    async def read(self) -> OperatorState:
        return await read_operator_state(self.redis, self.keys)

    async def delete_expired(self, override: Override) -> None:
        await delete_if_unchanged(self.redis, self.keys, override)


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (aiokafka's, Java's) picks for ``key``."""
    return int((murmur2(key) & 0x7FFFFFFF) % partitions)


def stage2_offset_s(tick_interval_s: float) -> float:
    """How long after a stage-1 tick stage 2 evaluates (summaries must arrive first)."""
    return min(tick_interval_s / 2.0, STAGE2_OFFSET_MAX_S)


def data_dir_for(settings: Settings) -> str:
    """faust's data directory: ``TAILGUARD_DATA_DIR``, else a temp dir per app id and process.

    Tables live in memory and are rebuilt from their Kafka changelogs at start,
    so a fresh directory loses nothing.
    """
    if settings.data_dir:
        return settings.data_dir
    return os.path.join(tempfile.gettempdir(), f"tailguard-{settings.app_id}-{os.getpid()}")


@dataclass
class Runtime:
    """The worker's parts, reachable as ``app.tailguard`` (tests and the benchmark use it)."""

    settings: Settings
    metrics: WorkerMetrics
    stage1: Stage1
    stage2: Stage2
    evaluator: FleetEvaluator
    writer: RoutingSink | None
    ingest: IngestService | None = None
    last_assignment: tuple[int, frozenset[int]] | None = None
    stage2_tick: Callable[[], Awaitable[list[ModelOutput]]] | None = None
    gauged_models: set[str] = field(default_factory=set)
    dropped_reported: dict[str, int] = field(default_factory=dict)   # stage2.dropped exported
    replace_hook: ReplaceHook | None = None
    publisher: Publisher | None = None
    edge: OperatorEdge | None = None
    operators: OperatorSource | None = None
    operator_state: OperatorState = field(default_factory=OperatorState)


class _ByModel(Protocol):
    @property
    def model(self) -> str: ...


class _FaustSink:
    """Stage 1's output through faust's producer.

    ``track`` runs before every send (a no-op once the producer tracks them): it
    keeps the topics written here in the producer's metadata refreshes
    (:func:`track_topic_metadata`), so a batch waiting for its partition's leader
    is never stranded.
    """

    def __init__(self, stats: Any, dlq: Any, track: Callable[[], Awaitable[None]]) -> None:
        self.stats, self.dlq, self.track = stats, dlq, track

    async def _to_stage2(self, items: Sequence[_ByModel], encode: Callable[[Any], bytes]) -> None:
        """Each item onto ``node-window-stats``, keyed by its model (its stage-2 owner)."""
        await self.track()
        futs = [await self.stats.send(key=state_key(i.model), value=encode(i)) for i in items]
        await asyncio.gather(*futs)

    async def send_summaries(self, summaries: Sequence[WindowSummary]) -> None:
        await self._to_stage2(summaries, encode_summary)

    async def send_cluster(self, digests: Sequence[ClusterDigest]) -> None:
        await self._to_stage2(digests, encode_cluster)

    async def send_diagnostics(self, results: Sequence[DiagnosticsResult]) -> None:
        await self._to_stage2(results, encode_diagnostics)

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> None:
        await self.track()
        futs = []
        for d in letters:
            key, value, headers = d.out_record()
            futs.append(await self.dlq.send(key=key, value=value, headers=headers))
        await asyncio.gather(*futs)


def create_app(settings: Settings, *, writer: RoutingSink | None = None,
               clock: Callable[[], float] = time.time,
               registry: CollectorRegistry | None = None,
               operators: OperatorSource | None = None) -> Any:
    """Build the worker's faust app (see the module docstring).

    ``writer``: the routing sink; default a :class:`~tailguard.routing.writer.RoutingWriter`
    on ``settings.redis_url`` whose lifetime is the app's. ``operators``: where
    overrides and modes are read each tick; default the same Redis as the
    writer's (none when a ``writer`` is given: no overrides, ``TAILGUARD_MODE``). ``registry``: the
    Prometheus registry (default a fresh one). ``clock``: wall time in seconds.
    """
    det = settings.detector
    tick_s = det.tick_interval_s
    topics = settings.topics
    metrics = WorkerMetrics(registry if registry is not None else CollectorRegistry())
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{h.strip()}" for h in settings.kafka_bootstrap.split(",")],
        broker_credentials=faust_broker_credentials(settings),
        store="memory://",
        autodiscover=False,
        datadir=data_dir_for(settings),
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.replication_factor or 1,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=settings.web_port != 0,
        web_port=settings.web_port or 6066,
        web_bind=settings.web_host,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        stream_wait_empty=False,
        logging_config=None,
    )
    n_parts = settings.topic_partitions
    stats = app.topic(topics.window_stats, partitions=n_parts, key_type=bytes, value_type=bytes)
    health = app.topic(topics.health_changes, partitions=n_parts)
    fleet = app.topic(topics.fleet_events, partitions=n_parts)
    diag_req = app.topic(topics.diagnostics_requests, partitions=n_parts)
    dlq = app.topic(topics.dead_letter, partitions=n_parts)
    replacements = app.topic(topics.replacements, partitions=n_parts)
    state_table = app.Table("health", partitions=n_parts, use_partitioner=True,
                            key_type=bytes)
    hints_table = app.GlobalTable("judge_since", partitions=n_parts, use_partitioner=True,
                                  key_type=bytes)

    evaluator = FleetEvaluator(det)
    stage1 = Stage1(WindowStore(det), det, metrics)
    stage2 = Stage2(evaluator, state_table, hints=hints_table, stale_after_s=1.5 * tick_s,
                    on_diagnostics_dropped=lambda why: metrics.diagnostics_dropped.labels(
                        reason=why).inc())
    owns_writer = writer is None
    redis_client: Any = None
    if writer is None:
        from tailguard.routing.client import connect_for
        from tailguard.routing.writer import RoutingWriter

        redis_client = connect_for(settings)
        writer = RoutingWriter(redis_client, settings.key_prefix, metrics=metrics,
                               where=f"{redact_url(settings.redis_url)} (TAILGUARD_REDIS_URL)")
        if operators is None:
            operators = RedisOperators(redis_client, settings.key_prefix)
    routing: RoutingSink = writer
    edge = OperatorEdge(det, settings.mode, history_len=settings.history_ticks,
                        diagnose_in_observe=settings.diagnose_in_observe)
    rt = Runtime(settings, metrics, stage1, stage2, evaluator, writer, edge=edge,
                 operators=operators)
    setattr(app, _RUNTIME_ATTR, rt)
    by_name = {t.get_topic_name(): t for t in (health, fleet, diag_req)}

    async def send(topic: str, key: bytes | None, value: bytes) -> Any:
        return await by_name[topic].send(key=key, value=value)
    publisher = rt.publisher = Publisher(
        send, max_bytes=settings.publish_backlog_bytes,
        on_dropped=lambda topic, n: metrics.publish_dropped.labels(topic=topic).inc(n))
    changelogs = [t.changelog_topic.get_topic_name() for t in (state_table, hints_table)]
    written = [t.get_topic_name() for t in (stats, health, fleet, diag_req, dlq, replacements)] + changelogs

    tracked: list[Any] = []    # the aiokafka producer already tracking ``written``

    async def track_written_metadata() -> None:
        """Once per aiokafka producer (a tracked topic stays tracked): faust may replace it."""
        faust_producer: Any = await app.maybe_start_producer()
        producer = faust_producer._ensure_producer()
        if tracked and tracked[0] is producer:
            return
        await track_topic_metadata(producer, written)
        tracked[:] = [producer]

    sink = _FaustSink(stats, dlq, track_written_metadata)

    async def publish_replacement(event: dict[str, Any]) -> None:
        await track_written_metadata()
        await (await replacements.send(key=event["node_id"].encode(), value=dumps(event)))

    hook, hook_redis = build_hook(settings, publish_replacement, clock)
    rt.replace_hook = hook

    def hints() -> StageHints:
        return decode_hints(list(hints_table.items()))

    allow_redis: Any = None
    load_allowlist: Callable[[], Awaitable[Allowlist]] | None = None
    if settings.allowlist_on:
        if settings.allowlist_redis_key:
            from tailguard.routing.client import connect_for

            allow_redis = connect_for(settings)

        async def load_allowlist() -> Allowlist:
            return await allowlist.load(settings, allow_redis)

    class _Ingest(IngestService):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(settings=settings, stage1=stage1, sink=sink, metrics=metrics,
                             clock=clock, hints=hints, allowlist=load_allowlist, **kwargs)
            rt.ingest = self

    class _Lifecycle(Service):
        """Metrics endpoint and the owned Redis writer's retry task."""

        async def on_start(self) -> None:
            metrics.serve(settings.metrics_port, settings.metrics_host)
            enter = getattr(writer, "__aenter__", None)
            if owns_writer and enter is not None:
                await enter()

        async def on_stop(self) -> None:
            if hook is not None:
                await hook.aclose()
                await hook_redis.aclose()
            if owns_writer:
                close = getattr(writer, "aclose", None)
                if close is not None:
                    await close()
                if redis_client is not None:
                    await redis_client.aclose()
            if allow_redis is not None:
                await allow_redis.aclose()
            metrics.close()

    app.service(_Lifecycle)
    app.service(_Ingest)
    if settings.web_port != 0:
        from tailguard.streaming import page

        page.register(app, lambda: redis_client, settings.key_prefix, settings.mode, clock)

    @app.agent(stats, name="tailguard-stage2")
    async def stage2_agent(stream: Any) -> None:
        async for values in stream.take(STAGE2_TAKE, within=0.2):
            for raw in values:
                try:
                    msg = decode_stage2(raw)
                except BadEvent as e:
                    metrics.bad_events.labels(topic=topics.window_stats, reason=e.reason).inc()
                    log.warning("dropping bad stage-2 message (%s): %s", e.reason, e)
                    continue
                if isinstance(msg, DiagnosticsResult):
                    stage2.on_diagnostics(msg)
                elif isinstance(msg, ClusterDigest):
                    stage2.on_cluster(msg)
                else:
                    stage2.on_summary(msg)

    def owned_stats_partitions() -> frozenset[int]:
        return frozenset(tp.partition for tp in app.consumer.assignment()
                         if tp.topic == topics.window_stats)

    async def stage2_tick() -> list[ModelOutput]:
        if app.rebalancing or app.in_recovery:
            log.info("stage-2 tick skipped: rebalancing")
            return []
        await track_written_metadata()
        owned = owned_stats_partitions()
        assignment = (app.consumer_generation_id, owned)
        if rt.last_assignment != assignment:
            log.info("stage 2 owns %s partitions %s (generation %s)", topics.window_stats,
                     sorted(owned), app.consumer_generation_id)
            stage2.on_assignment_changed()
            rt.last_assignment = assignment
            metrics.owned_models.set(0)
        n = app.consumer.topic_partitions(topics.window_stats) or n_parts
        now_s = clock()
        t0 = time.perf_counter()
        failures_before = stage2.write_failures
        outputs = stage2.tick(
            now_s, lambda model: partition_for(state_key(model), n) in owned,
            hints_for_s=next_boundary(now_s, tick_s))
        metrics.tick_seconds.observe(time.perf_counter() - t0)
        metrics.table_write_failures.inc(stage2.write_failures - failures_before)
        for reason, count in stage2.dropped.items():
            if count > rt.dropped_reported.get(reason, 0):
                metrics.summaries_dropped.labels(reason=reason).inc(count - rt.dropped_reported.get(reason, 0))
                rt.dropped_reported[reason] = count
        metrics.owned_models.set(len(outputs))
        now_owned = {o.tick.model for o in outputs}
        for gone in rt.gauged_models - now_owned:
            metrics.forget_model(gone)
            edge.forget_model(gone)
        rt.gauged_models = now_owned
        metrics.last_tick_ts.set(now_s)
        edged = await at_the_edge(outputs, now_s)
        # Redis first, every tick: routing never waits on Kafka. The tick's messages then go
        # to a backlog bounded in bytes, published within a budget and retried (publisher).
        await write_routing(edged)
        publisher.add(tick_messages(edged, topics.health_changes, topics.fleet_events,
                                    topics.diagnostics_requests, metrics))
        await publisher.publish(PUBLISH_BUDGET_FRACTION * tick_s)
        metrics.publish_backlog_bytes.set(publisher.nbytes)
        if hook is not None:   # level-triggered: every retired status, every tick (replace.py)
            # Observe mode acts on nothing: its models' retired nodes are not replaced.
            hook.offer(s for d in edged if d.mode == "enforce" for s in d.tick.statuses)
        return outputs

    async def at_the_edge(outputs: list[ModelOutput], now_s: float) -> list[EdgeOutput]:
        """Mode and operator overrides on each verdict (tailguard.streaming.edge)."""
        if operators is not None and outputs:
            try:
                rt.operator_state = await operators.read()
            except Exception as e:  # Redis down: the last overrides read stay in force
                metrics.operator_read_failures.inc()
                log.warning("reading operator overrides failed (%s: %s); keeping the last ones",
                            type(e).__name__, e)
        ops = rt.operator_state
        for bad in ops.bad:
            log.warning("ignoring an operator setting in Redis: %s", bad)
        edged = [edge.apply(EdgeInput(o.tick, o.transitions, o.summaries, o.streaks), ops, now_s)
                 for o in outputs]
        for done in edged:
            metrics.set_operator_view(done.tick.model, done.mode, done.overrides.values(),
                                      done.tick, max_ejected_fraction=det.max_ejected_fraction)
            for o in done.expired:
                if operators is not None:
                    try:
                        await operators.delete_expired(o)
                    except Exception:
                        log.exception("deleting an expired override of %r failed", o.node_id)
        return edged

    async def write_routing(outputs: list[EdgeOutput]) -> None:
        for out in outputs:
            try:
                await routing.apply(out.tick, out.extras)
            except Exception:  # a malformed verdict: never stop the other models
                log.exception("routing write of model %r failed", out.tick.model)

    @app.task  # type: ignore[untyped-decorator]
    async def stage2_loop() -> None:
        offset = stage2_offset_s(tick_s)
        while not app.should_stop:
            await sleep_until(next_boundary(clock(), tick_s, offset), clock)
            try:
                await stage2_tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stage-2 tick failed; what was not published is retried next tick")

    @app.task  # type: ignore[untyped-decorator]
    async def replace_loop() -> None:
        if hook is not None:
            await hook.run()

    rt.stage2_tick = stage2_tick
    return app


async def track_topic_metadata(producer: Any, topics: Iterable[str]) -> None:
    """Keep ``topics`` in every metadata refresh of an aiokafka ``producer``; wait until known.

    aiokafka fetches metadata of all topics only while it tracks none; once it
    tracks some (a send to a topic it did not know yet adds that topic), each
    refresh fetches just those, and an untracked topic drops out of the cache
    even though the producer writes to it. Two failures followed, both seen in
    CI: faust's ``use_partitioner`` table write (``key_partition`` reads the
    cache, never fetches) raised; and a batch already queued for a dropped
    topic waited for a leader that no refresh would bring, stalling every send
    behind it. Call it with every topic the producer writes to, before sending.
    Cheap when the topics are already tracked.
    """
    for topic in topics:
        await producer.client.add_topic(topic)
        await producer.partitions_for(topic)


_RUNTIME_ATTR = "_tailguard_runtime"


def runtime_of(app: Any) -> Runtime:
    """The :class:`Runtime` of an app built by :func:`create_app`."""
    rt = getattr(app, _RUNTIME_ATTR, None)
    if not isinstance(rt, Runtime):
        raise TypeError("not an app built by tailguard.streaming.service.create_app")
    return rt

