"""Stage-1 ingestion: an aiokafka consumer run as a faust (mode) Service in the worker.

:class:`IngestService` reads ``latency-events`` and ``node-diagnostics-results`` with its own
consumer group (``<app_id>-stage1``), in bulk (``getmany()``), hands each poll to
:class:`~tailguard.streaming.stage1.Stage1` and sends its summaries and cluster digests each
tick. Why not a faust agent, and each guarantee in full: docs/operations.md, docs/operating.md.

Guarantees:

* **Bounded.** At most ``max_poll_records`` records a poll; the next poll starts only after
  this one is decoded, windowed and its dead letters are sent.
* **At least once for dead letters.** Offsets are committed only after the records before
  them were processed and their dead letters acknowledged; ingestion waits rather than drop.
* **Ownership.** Each tick summarizes the series of the partitions assigned now only.
* **Known series first, on time.** Summaries go oldest-admitted series first; what is not
  sent within :data:`SEND_BUDGET_FRACTION` of the tick is dropped and counted.
* **Any producer, no stall.** Every Kafka codec (:func:`missing_codecs`), committed records
  only; a record aiokafka cannot decode is dead-lettered and passed (:mod:`.salvage`).
* **Allowlist** (optional): nothing is consumed before it is first read. **Only new
  diagnostics results**: a results partition without a committed offset is read from its end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import codec as kafka_codec
from aiokafka.abc import ConsumerRebalanceListener
from mode import Service

from tailguard.collector import collector_paused
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.ids import Allowlist
from tailguard.core.contract.types import WindowSummary
from tailguard.security import kafka_client_options
from tailguard.settings import Settings
from tailguard.streaming.deadletter import DeadLetter
from tailguard.streaming.hints import StageHints
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.salvage import UNDECODABLE, salvage
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.turns import Turns
from tailguard.streaming.wire import ClusterDigest, DiagnosticsResult, parse_diagnostics_result

log = logging.getLogger(__name__)

MAX_POLL_RECORDS = 5000
COMMIT_INTERVAL_S = 1.0
LAG_INTERVAL_S = 2.0
# How old the consumer's topic metadata may get: partitions added to latency-events are
# consumed at most this long after they appear (aiokafka's default is 5 minutes).
METADATA_MAX_AGE_MS = 10_000
# Summaries are sent in slices of this many (each slice a few summary batches, one message per
# model and up to summary_batch.MAX_ROWS); those left when SEND_BUDGET_FRACTION of the tick
# interval has passed since the tick began are dropped (counted): the next tick stays on time.
SEND_SLICE = 20_000
SEND_BUDGET_FRACTION = 0.5


def missing_codecs() -> list[str]:
    """Kafka compression codecs this process cannot decompress (empty when all four work)."""
    have = {"snappy": kafka_codec.has_snappy(), "lz4": kafka_codec.has_lz4(),
            "zstd": kafka_codec.has_zstd()}
    return [name for name, ok in have.items() if not ok]


class Stage1Sink(Protocol):
    """Where stage 1 sends its output (faust topics in the service, lists in tests)."""

    async def send_summaries(self, summaries: Sequence[WindowSummary]) -> None: ...

    async def send_cluster(self, digests: Sequence[ClusterDigest]) -> None: ...

    async def send_diagnostics(self, results: Sequence[DiagnosticsResult]) -> None: ...

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> None: ...


def next_boundary(now_s: float, interval_s: float, offset_s: float = 0.0) -> float:
    """The first wall-clock instant ``k * interval_s + offset_s`` strictly after ``now_s``."""
    k = (now_s - offset_s) // interval_s + 1
    return k * interval_s + offset_s


async def sleep_until(ts: float, clock: Callable[[], float],
                      sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
    while (left := ts - clock()) > 0:
        await sleep(min(left, 1.0))


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commits before a rebalance; forgets the series of the partitions that went elsewhere.

    aiokafka rebalances eagerly: every partition is revoked, then the new
    assignment comes. A rebalance that gives a worker its partitions back (one
    worker, partitions added to the topic, a worker that joins and owns other
    ones) must not empty their windows, so series are forgotten only for the
    partitions revoked and not assigned again.
    """

    def __init__(self, owner: IngestService, consumer: Any = None) -> None:
        self.owner = owner
        self.consumer = consumer
        self.revoked: set[int] = set()

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.owner.commit()
        self.revoked |= {tp.partition for tp in revoked if tp.topic == self.owner.topic}
        for tp in revoked:
            label = (tp.topic, str(tp.partition))
            if label in self.owner.lag_labels:
                self.owner.lag_labels.discard(label)
                self.owner.metrics.consumer_lag.remove(*label)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        owner = self.owner
        if self.consumer is not None:
            await owner.skip_old_diagnostics(self.consumer, [
                tp for tp in assigned if tp.topic == owner.diagnostics_topic != owner.topic])
        now = {tp.partition for tp in assigned if tp.topic == owner.topic}
        gone, self.revoked = self.revoked - now, set()
        if gone:
            forgotten = owner.stage1.revoke(gone)
            for offsets in (owner._next_offsets, owner._committed):
                for tp in [tp for tp in offsets if tp.topic == owner.topic and tp.partition in gone]:
                    del offsets[tp]
            log.info("stage 1 gave up %s partitions %s (%d series)", owner.topic, sorted(gone),
                     forgotten)
        log.info("stage 1 owns %s partitions %s", owner.topic, sorted(now))


class IngestService(Service):
    """Consumes ``latency-events`` into :class:`Stage1`; sends summaries each tick."""

    def __init__(self, *, settings: Settings, stage1: Stage1, sink: Stage1Sink,
                 metrics: WorkerMetrics, clock: Callable[[], float] = time.time,
                 hints: Callable[[], StageHints] | None = None,
                 max_poll_records: int = MAX_POLL_RECORDS, source: str | None = None,
                 allowlist: Callable[[], Awaitable[Allowlist]] | None = None,
                 turns: Turns | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.load_allowlist = allowlist
        self.source = source or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.settings = settings
        self.topic = settings.topics.latency_events
        self.diagnostics_topic = settings.topics.diagnostics_results
        self.stage1 = stage1
        self.sink = sink
        self.metrics = metrics
        self.clock = clock
        self.max_poll_records = max_poll_records
        self.hints = hints
        self.lag_labels: set[tuple[str, str]] = set()
        self._consumer: AIOKafkaConsumer | None = None
        self._next_offsets: dict[Any, int] = {}
        self._bad_seen: Counter[str] = Counter()    # dead letters by reason (for the log)
        self._committed: dict[Any, int] = {}
        self._last_commit = 0.0
        self._last_lag = 0.0
        self._turn = asyncio.Lock()     # polls and ticks take turns (module docstring)
        self.turns = turns if turns is not None else Turns()   # a tick before stage 2's steps

    @property
    def group_id(self) -> str:
        return f"{self.settings.app_id}-stage1"

    async def on_start(self) -> None:
        if self.load_allowlist is not None:   # nothing is consumed before the first list
            delay_s = 0.5
            while not await self._refresh_allowlist():
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 10.0)
        c = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.group_id,
            client_id=f"{self.settings.app_id}-stage1",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            metadata_max_age_ms=METADATA_MAX_AGE_MS,
            max_partition_fetch_bytes=4 << 20,
            fetch_max_bytes=16 << 20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=3_000,
            **kafka_client_options(self.settings),
        )
        c.subscribe(list(dict.fromkeys([self.topic, self.diagnostics_topic])),
                    listener=_Listener(self, c))
        await c.start()
        self._consumer = c

    async def skip_old_diagnostics(self, c: Any, partitions: Iterable[Any]) -> None:
        """Start results partitions this group never committed at their end, not the earliest.

        A result written before this group existed answers no request of its (their episodes
        are over); the end is committed with the next commit, so that results written while
        the worker is down are read after a restart. A committed offset is kept.
        """
        fresh = [tp for tp in partitions if await c.committed(tp) is None]
        if fresh:
            await c.seek_to_end(*fresh)
            for tp in fresh:   # committed with the next commit: a restart resumes there
                self._next_offsets[tp] = await c.position(tp)
            log.info("stage 1 reads %s partitions %s from their end (no committed offset)",
                     self.diagnostics_topic, sorted(tp.partition for tp in fresh))

    async def _refresh_allowlist(self) -> bool:
        """Read the allowlist again; on failure keep the last one (a warning). True when read."""
        assert self.load_allowlist is not None
        try:
            new = await self.load_allowlist()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("cannot read the node-id allowlist (%s); %s", e,
                        "keeping the last one" if self.stage1.allowlist is not None
                        else "not consuming until it can be read")
            return False
        old = self.stage1.allowlist
        if old is None or old.ids != new.ids:
            log.info("node-id allowlist: %d ids%s%s", len(new.ids),
                     f" (+{len(new.ids - old.ids)} -{len(old.ids - new.ids)})" if old else "",
                     ", and the pattern" if new.pattern else "")
        self.stage1.allowlist = new
        return True

    @Service.task
    async def _allowlist_refresher(self) -> None:
        if self.load_allowlist is None:
            return
        while not self.should_stop:
            await asyncio.sleep(self.settings.allowlist_refresh_s)
            await self._refresh_allowlist()

    async def on_stop(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            try:
                await self._commit(c)
            finally:
                await c.stop()

    def owned_partitions(self) -> set[int]:
        c = self._consumer
        if c is None:
            return set()
        return {tp.partition for tp in c.assignment() if tp.topic == self.topic}

    async def commit(self) -> None:
        if self._consumer is not None:
            await self._commit(self._consumer)

    async def _commit(self, c: AIOKafkaConsumer) -> None:
        owned = c.assignment()
        offsets = {tp: off for tp, off in self._next_offsets.items()
                   if tp in owned and self._committed.get(tp) != off}
        if offsets:
            try:
                await c.commit(offsets)
                self._committed.update(offsets)
            except Exception as e:  # a rebalance in progress; the next commit retries
                log.info("stage-1 offset commit deferred: %s", e)
        self._last_commit = time.monotonic()

    async def poll_once(self, timeout_ms: int = 200) -> int:
        """One poll → windows (+ dead letters); returns the records handled."""
        c = self._consumer
        assert c is not None, "IngestService not started"
        try:
            batches = await c.getmany(timeout_ms=timeout_ms, max_records=self.max_poll_records)
            dead: list[DeadLetter] = []
        except UNDECODABLE as e:
            batches, dead = await salvage(c, e, self._next_offsets, self.max_poll_records, self.metrics)
        now_s = self.clock()
        n = 0
        done: dict[Any, int] = {}
        results: list[DiagnosticsResult] = []
        for tp, recs in batches.items():
            if not recs:
                continue
            if tp.topic == self.diagnostics_topic and tp.topic != self.topic:
                dead.extend(self._diagnostics(recs, results))
            else:
                with collector_paused():
                    dead.extend(self.stage1.ingest(tp.partition, recs, now_s))
            done[tp] = recs[-1].offset + 1
            n += len(recs)
        if results:   # re-keyed by model for stage 2, before their offsets count as done
            await self._send_retrying(self.sink.send_diagnostics, results, "diagnostics results")
        for d in dead:  # an undecodable record was skipped: its partition goes on after it
            if d.reason == "undecodable":
                tp = TopicPartition(d.topic, d.partition)
                done[tp] = max(done.get(tp, 0), d.offset + 1)
        if dead:
            for d in dead:
                self._bad_seen[d.reason] += 1
                d.log(self._bad_seen[d.reason])
            await self._dead_letter(dead)
        self._next_offsets.update(done)
        mono = time.monotonic()
        if mono - self._last_commit >= COMMIT_INTERVAL_S:
            await self._commit(c)
        if mono - self._last_lag >= LAG_INTERVAL_S:
            self._update_lag(c)
            self._last_lag = mono
        return n

    def _diagnostics(self, recs: Sequence[Any], out: list[DiagnosticsResult]) -> list[DeadLetter]:
        """Validate ``node-diagnostics-results`` records into ``out``; return the bad ones."""
        dead: list[DeadLetter] = []
        for rec in recs:
            ts_ms = getattr(rec, "timestamp", None)   # when it arrived (stage 2 compares)
            arrived_ts = ts_ms / 1000.0 if isinstance(ts_ms, int) and ts_ms > 0 else None
            try:
                out.append(parse_diagnostics_result(rec.value, arrived_ts))
            except BadEvent as e:
                dead.append(DeadLetter.of(rec, e.reason, str(e)))
                self.metrics.bad_events.labels(topic=rec.topic, reason=e.reason).inc()
        return dead

    async def _dead_letter(self, dead: list[DeadLetter]) -> None:
        await self._send_retrying(self.sink.dead_letter, dead, "dead letters")

    async def _send_retrying(self, send: Callable[[Any], Awaitable[None]], items: Sequence[Any],
                             what: str) -> None:
        # Blocks ingestion until the broker takes them: backpressure, never a silent loss.
        delay_s = 0.5
        while True:
            try:
                await send(items)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self.should_stop:
                    raise
                log.warning("cannot write %d %s (%s); retrying in %.1f s",
                            len(items), what, e, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 10.0)

    def _update_lag(self, c: AIOKafkaConsumer) -> None:
        for tp in c.assignment():
            high = c.highwater(tp)
            pos = self._next_offsets.get(tp)
            if high is None or pos is None:
                continue
            label = (tp.topic, str(tp.partition))
            self.lag_labels.add(label)
            self.metrics.consumer_lag.labels(*label).set(max(0, high - pos))

    @Service.task
    async def _consume(self) -> None:
        while not self.should_stop:
            try:
                async with self._turn:
                    await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one poll kill ingestion; the error is logged
                log.exception("stage-1 poll failed; retrying in 1 s")
                await asyncio.sleep(1.0)

    async def tick(self, due_s: float | None = None) -> int:
        """Send the cluster digests, then one summary per owned series, to stage 2.

        ``due_s``: the tick's boundary (clock time; default now): what is not sent by
        ``due_s + SEND_BUDGET_FRACTION × tick_interval_s`` is dropped (module docstring),
        so a tick that started late still ends in time for the next. Returns how many
        summaries were sent.
        """
        t0 = time.monotonic()
        if due_s is not None:
            t0 -= max(0.0, self.clock() - due_s)
        with collector_paused():    # one pass of the collector after the tick's allocations
            hints = self.hints() if self.hints is not None else StageHints()
            now_s = self.clock()
            self.stage1.forget_silent(now_s)
            summaries = self.stage1.summaries(now_s, self.owned_partitions(), hints.judge_since,
                                              hints.out_of_fit, hints.tail_refs, hints.signals)
            digests = self.stage1.cluster_digests(now_s, self.source)
        if digests:
            await self.sink.send_cluster(digests)
        deadline = t0 + SEND_BUDGET_FRACTION * self.settings.detector.tick_interval_s
        sent = 0
        while sent < len(summaries) and (sent == 0 or time.monotonic() < deadline):
            await self.sink.send_summaries(summaries[sent:sent + SEND_SLICE])
            sent = min(len(summaries), sent + SEND_SLICE)
        if sent < len(summaries):
            late = len(summaries) - sent
            self.metrics.summaries_dropped.labels(reason="send_deadline").inc(late)
            log.warning("stage 1 sent %d of this tick's %d summaries within %.0f%% of the tick"
                        " interval; the %d of the most recently admitted series were dropped"
                        " (a flood of new node ids, or more series than one worker can send"
                        " per tick: add workers or raise TAILGUARD_TICK_INTERVAL_S)", sent,
                        len(summaries), 100 * SEND_BUDGET_FRACTION, late)
        self.metrics.stage1_tick_seconds.observe(time.monotonic() - t0)
        return sent

    @Service.task
    async def _ticker(self) -> None:
        interval = self.settings.detector.tick_interval_s
        while not self.should_stop:
            due_s = next_boundary(self.clock(), interval)
            await sleep_until(due_s, self.clock)
            try:
                async with self.turns.stage1_tick(), self._turn:
                    await self.tick(due_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stage-1 tick failed")


__all__ = ["IngestService", "Stage1Sink", "TopicPartition", "missing_codecs", "next_boundary",
           "sleep_until"]
