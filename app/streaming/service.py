"""The faust app: topics, the stage-1 ingestion service, stage-2 agents, tables, ticks.

:func:`create_app` builds one :class:`faust.App` from :class:`~tailguard.settings.Settings` (no
module-level app, nothing read from the environment here); :func:`runtime_of` gives its
:class:`Runtime`. One worker process runs (in detail: docs/operations.md, "Running the worker"):

* stage-1 ingestion (:class:`~tailguard.streaming.ingest.IngestService`): ``latency-events`` →
  windows; every ``tick_interval_s`` summaries and cluster digests → ``node-window-stats``;
* the stage-2 agent over ``node-window-stats`` and the stage-2 tick, :func:`stage2_offset_s`
  after each stage-1 tick: a :class:`~tailguard.streaming.ticker.Stage2Ticker` (faust's topics,
  consumer and the Redis writer plugged in here) evaluates the owned models, stores their state in
  the ``health`` table, publishes, writes Redis after the operator edge
  (:mod:`tailguard.streaming.edge`) and offers retired nodes to the replace hook;
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import faust
from mode import Service
from prometheus_client import CollectorRegistry

from tailguard.collector import collect_if_due, collector_paused
from tailguard.core.contract.ids import Allowlist
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import WindowStore
from tailguard.routing.keys import Keys, as_keys
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
from tailguard.streaming.edge import OperatorEdge
from tailguard.streaming.hints_feed import feed_for
from tailguard.streaming.ingest import IngestService, next_boundary, sleep_until
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.publisher import Publisher
from tailguard.streaming.replace import ReplaceHook, build_hook
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.stage2 import Stage2, state_key
from tailguard.streaming.stage2_intake import Record, Stage2Intake, send_dead_letters
from tailguard.streaming.summary_batch import encode_by_model
from tailguard.streaming.ticker import (
    Assignment,
    OperatorSource,
    OutputTopics,
    RoutingSink,
    Stage2Ticker,
)
from tailguard.streaming.topics import MetadataTracker
from tailguard.streaming.turns import Turns
from tailguard.streaming.wire import (
    ClusterDigest,
    DiagnosticsResult,
    dumps,
    encode_cluster,
    encode_diagnostics,
)

log = logging.getLogger(__name__)

STAGE2_TAKE = 2000
# Middle passes of the collector since its last full pass that make one due after a stage-2 tick.
FULL_PASS_AFTER = 1
WRITE_RETRY_MAX_S = 10.0     # the routing writer's longest back-off (shorter with shorter ticks)
STAGE2_OFFSET_MAX_S = 5.0
# Changelog records of a table that faust buffers before applying them, where it reads them
# after the start: the hints GlobalTable's own partitions (faust reads them as "active": the
# recovery buffer) and the health table's replicas (standby). faust's default of 1000 holds the
# last 1000 decoded values — a flood's hints, each naming its ~1,000 new pairs — for as many
# ticks; 1 applies each record as it comes (docs/operating.md#floods).
CHANGELOG_BUFFER = 1


class RedisOperators:
    """:class:`OperatorSource` on the Redis that holds the routing keys."""

    def __init__(self, redis: Any, key_prefix: str | Keys) -> None:
        self.redis, self.keys = redis, as_keys(key_prefix)

    async def read(self) -> OperatorState:
        return await read_operator_state(self.redis, self.keys)

    async def delete_expired(self, override: Override) -> None:
        await delete_if_unchanged(self.redis, self.keys, override)


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
    ticker: Stage2Ticker
    ingest: IngestService | None = None
    replace_hook: ReplaceHook | None = None


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
        """As summary batches (:mod:`tailguard.streaming.summary_batch`): a few messages per
        model, not one per series (one message each topped out near 3,500 summaries/s)."""
        await self.track()
        with collector_paused():
            batches = encode_by_model(summaries)
        futs = [await self.stats.send(key=state_key(model), value=raw) for model, raw in batches]
        await asyncio.gather(*futs)

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
    """Build the worker's faust app (see the module docstring): faust wired to a :class:`Stage2Ticker`.

    ``writer``: the routing sink; default a :class:`~tailguard.routing.writer.RoutingWriter`
    on ``settings.redis_url`` whose lifetime is the app's. ``operators``: where
    overrides and modes are read each tick; default the same Redis as the
    writer's (none when a ``writer`` is given: no overrides, ``TAILGUARD_MODE``). ``registry``: the
    Prometheus registry (default a fresh one). ``clock``: wall time in seconds.
    """
    det = settings.detector
    metrics = WorkerMetrics(registry if registry is not None else CollectorRegistry())
    app = _faust_app(settings)
    t = _Topics.declare(app, settings)
    evaluator = FleetEvaluator(det)
    stage1 = Stage1(WindowStore(det, pause_collector=collector_paused), det, metrics)
    stage2 = Stage2(evaluator, t.state_table, hints=t.hints_table, stale_after_s=1.5 * det.tick_interval_s,
                    on_diagnostics_dropped=lambda why: metrics.diagnostics_dropped.labels(
                        reason=why).inc())
    redis = _RedisSide.open(settings, writer, operators, metrics)
    track = MetadataTracker(app, t.written())

    async def publish_replacement(event: dict[str, Any]) -> None:
        await track()
        await (await t.replacements.send(key=event["node_id"].encode(), value=dumps(event)))

    hook, hook_redis = build_hook(settings, publish_replacement, clock)
    turns = Turns(hold_s=stage2_offset_s(det.tick_interval_s))
    ticker = Stage2Ticker(
        stage2=stage2, routing=redis.writer, operators=redis.operators, hook=hook, metrics=metrics,
        edge=OperatorEdge(det, settings.mode, history_len=settings.history_ticks,
                          diagnose_in_observe=settings.diagnose_in_observe),
        publisher=_publisher(t, settings, metrics), ownership=_FaustOwnership(app, t, settings, track),
        topics=OutputTopics(settings.topics.health_changes, settings.topics.fleet_events,
                            settings.topics.diagnostics_requests),
        tick_s=det.tick_interval_s, max_ejected_fraction=det.max_ejected_fraction, clock=clock,
        turns=turns)
    rt = Runtime(settings, metrics, stage1, stage2, evaluator, redis.writer, ticker, replace_hook=hook)
    setattr(app, _RUNTIME_ATTR, rt)
    allow_redis, load_allowlist = _allowlist_loader(settings)
    sink = _FaustSink(t.stats, t.dlq, track)

    hints_feed, hints = feed_for(settings, t.hints_table, stage2.hinted_models,
                                 lambda why: metrics.bad_hints.labels(reason=why).inc())

    class _Ingest(IngestService):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(settings=settings, stage1=stage1, sink=sink, metrics=metrics, clock=clock,
                             hints=hints, allowlist=load_allowlist, turns=turns, **kwargs)
            rt.ingest = self

    app.service(_lifecycle(settings, metrics, redis, hook, hook_redis, allow_redis))
    app.service(hints_feed)
    app.service(_Ingest)
    if settings.web_port != 0:
        from tailguard.routing.client import keys_for
        from tailguard.streaming import page

        page.register(app, lambda: redis.client, keys_for(settings), settings.mode, clock)
    _stage2_agent(app, t.stats, Stage2Intake(stage2, metrics), sink)
    _stage2_loops(app, ticker, hook, clock, det.tick_interval_s)
    return app


def _faust_app(settings: Settings) -> Any:
    """The faust App of the worker: raw keys and values, in-memory tables, no autodiscovery."""
    return faust.App(
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


@dataclass(frozen=True)
class _Topics:
    """The worker's topics and stage 2's two tables, declared on the app."""

    stats: Any
    health: Any
    fleet: Any
    diag_req: Any
    dlq: Any
    replacements: Any
    state_table: Any
    hints_table: Any

    @classmethod
    def declare(cls, app: Any, settings: Settings) -> _Topics:
        topics, n_parts = settings.topics, settings.topic_partitions
        return cls(
            stats=app.topic(topics.window_stats, partitions=n_parts, key_type=bytes, value_type=bytes),
            health=app.topic(topics.health_changes, partitions=n_parts),
            fleet=app.topic(topics.fleet_events, partitions=n_parts),
            diag_req=app.topic(topics.diagnostics_requests, partitions=n_parts),
            dlq=app.topic(topics.dead_letter, partitions=n_parts),
            replacements=app.topic(topics.replacements, partitions=n_parts),
            state_table=app.Table("health", partitions=n_parts, use_partitioner=True, key_type=bytes,
                                  standby_buffer_size=CHANGELOG_BUFFER),
            hints_table=app.GlobalTable("judge_since", partitions=n_parts, use_partitioner=True,
                                        key_type=bytes, recovery_buffer_size=CHANGELOG_BUFFER),
        )

    def written(self) -> list[str]:
        """Every topic the worker's producer writes to, the tables' changelogs included."""
        changelogs = [t.changelog_topic.get_topic_name() for t in (self.state_table, self.hints_table)]
        return [t.get_topic_name() for t in (self.stats, self.health, self.fleet, self.diag_req, self.dlq,
                                             self.replacements)] + changelogs


def _publisher(t: _Topics, settings: Settings, metrics: WorkerMetrics) -> Publisher:
    """Stage 2's Kafka backlog (:mod:`tailguard.streaming.publisher`) on the app's output topics."""
    by_name = {x.get_topic_name(): x for x in (t.health, t.fleet, t.diag_req)}

    async def send(topic: str, key: bytes | None, value: bytes) -> Any:
        return await by_name[topic].send(key=key, value=value)

    return Publisher(send, max_bytes=settings.publish_backlog_bytes,
                     on_dropped=lambda topic, n: metrics.publish_dropped.labels(topic=topic).inc(n))


class _FaustOwnership:
    """:class:`~tailguard.streaming.ticker.Ownership` from the app's consumer; refreshes the
    producer's metadata first (a tick may write to every output topic)."""

    def __init__(self, app: Any, t: _Topics, settings: Settings, track: MetadataTracker) -> None:
        self.app, self.track = app, track
        self.topic, self.n_parts = settings.topics.window_stats, settings.topic_partitions

    async def assignment(self) -> Assignment | None:
        app = self.app
        if app.rebalancing or app.in_recovery:
            return None
        await self.track()
        owned = frozenset(tp.partition for tp in app.consumer.assignment() if tp.topic == self.topic)
        n = app.consumer.topic_partitions(self.topic) or self.n_parts
        return Assignment(self.topic, app.consumer_generation_id, owned, n)


@dataclass(frozen=True)
class _RedisSide:
    """The routing writer and the operator source; the Redis client when the app owns them."""

    writer: RoutingSink
    operators: OperatorSource | None
    client: Any = None     # set when the app made (and closes) the writer

    @classmethod
    def open(cls, settings: Settings, writer: RoutingSink | None, operators: OperatorSource | None,
             metrics: WorkerMetrics) -> _RedisSide:
        if writer is not None:
            return cls(writer, operators)
        from tailguard.routing.client import connect_for, keys_for
        from tailguard.routing.writer import RoutingWriter

        client, keys = connect_for(settings), keys_for(settings)
        # Retries at least once a tick: after a failover, writes resume within 2 ticks.
        owned = RoutingWriter(client, keys, metrics=metrics,
                              retry_max_s=max(0.25, min(WRITE_RETRY_MAX_S, settings.detector.tick_interval_s)),
                              where=f"{redact_url(settings.redis_url)} (TAILGUARD_REDIS_URL)")
        return cls(owned, operators if operators is not None else RedisOperators(client, keys),
                   client)


def _allowlist_loader(settings: Settings) -> tuple[Any, Callable[[], Awaitable[Allowlist]] | None]:
    """The allowlist's Redis client (None without a Redis key) and its loader (None when off)."""
    if not settings.allowlist_on:
        return None, None
    allow_redis: Any = None
    if settings.allowlist_redis_key:
        from tailguard.routing.client import connect_for

        allow_redis = connect_for(settings)

    async def load_allowlist() -> Allowlist:
        return await allowlist.load(settings, allow_redis)

    return allow_redis, load_allowlist


def _lifecycle(settings: Settings, metrics: WorkerMetrics, redis: _RedisSide, hook: ReplaceHook | None,
               hook_redis: Any, allow_redis: Any) -> type[Service]:
    """The service that serves the metrics, and starts and closes what the app owns."""

    class _Lifecycle(Service):
        """Metrics endpoint and the owned Redis writer's retry task."""

        async def on_start(self) -> None:
            metrics.serve(settings.metrics_port, settings.metrics_host)
            enter = getattr(redis.writer, "__aenter__", None)
            if redis.client is not None and enter is not None:
                await enter()

        async def on_stop(self) -> None:
            if hook is not None:
                await hook.aclose()
                await hook_redis.aclose()
            if redis.client is not None:
                close = getattr(redis.writer, "aclose", None)
                if close is not None:
                    await close()
                await redis.client.aclose()
            if allow_redis is not None:
                await allow_redis.aclose()
            metrics.close()

    return _Lifecycle


def _stage2_agent(app: Any, stats: Any, intake: Stage2Intake, sink: _FaustSink) -> None:
    """The agent that feeds stage 2 from ``node-window-stats`` (summaries, digests, results);
    what does not decode is dead-lettered (:mod:`tailguard.streaming.stage2_intake`)."""

    @app.agent(stats, name="tailguard-stage2")  # type: ignore[untyped-decorator]
    async def stage2_agent(stream: Any) -> None:
        async for events in stream.take_events(STAGE2_TAKE, within=0.2):
            with collector_paused():
                dead = intake.take([Record.of_message(e.message) for e in events])
            if dead:    # before the take's records are acked
                await send_dead_letters(sink.dead_letter, dead, lambda: bool(app.should_stop))


def _stage2_loops(app: Any, ticker: Stage2Ticker, hook: ReplaceHook | None, clock: Callable[[], float],
                  tick_s: float) -> None:
    """The stage-2 tick, :func:`stage2_offset_s` after each stage-1 tick, and the replace hook's loop."""

    @app.task  # type: ignore[untyped-decorator]
    async def stage2_loop() -> None:
        offset = stage2_offset_s(tick_s)
        while not app.should_stop:
            await sleep_until(next_boundary(clock(), tick_s, offset), clock)
            try:
                await ticker.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stage-2 tick failed; what was not published is retried next tick")
            # The collector's full pass (~1 s with 100,000 series) here, where stage 1's tick
            # and stage 2's Redis writes are done, after any tick that made a middle pass:
            # its own are rare in the worker (worker.FULL_COLLECTION_EVERY), and the cycles
            # a tick leaves are freed each tick, not let grow (docs/performance.md).
            collect_if_due(FULL_PASS_AFTER)

    @app.task  # type: ignore[untyped-decorator]
    async def replace_loop() -> None:
        if hook is not None:
            await hook.run()


_RUNTIME_ATTR = "_tailguard_runtime"


def runtime_of(app: Any) -> Runtime:
    """The :class:`Runtime` of an app built by :func:`create_app`."""
    rt = getattr(app, _RUNTIME_ATTR, None)
    if not isinstance(rt, Runtime):
        raise TypeError("not an app built by tailguard.streaming.service.create_app")
    return rt

