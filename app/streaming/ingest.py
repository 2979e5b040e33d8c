"""Stage-1 ingestion: an aiokafka consumer run as a faust (mode) Service in the worker.

Why not a faust agent: faust hands every message from its consumer thread to
the agent one by one. ``python -m bench.bench_streaming --quick`` on the
2-core development machine (real broker, single-event form, same decode and
window code): a faust agent over ``stream.take(2000)`` did ~9,000 events/s,
this aiokafka ``getmany()`` path ~100,000/s (the target is 10,000 single
events/s per worker); with 100-sample batch messages 260k vs 530k samples/s.
So stage 1 reads ``latency-events`` with its own consumer group
(``<app_id>-stage1``), in bulk, and hands each poll to
:class:`~app.streaming.stage1.Stage1`. Stage 2 (state, evaluation) stays in
faust agents and changelog-backed tables.

Guarantees:

* **Bounded.** One poll returns at most ``max_poll_records`` records, and the
  next poll starts only after this one is decoded, windowed and its dead
  letters are sent; the consumer's prefetch is bounded by its fetch sizes.
* **At least once for dead letters.** Offsets are committed (about every
  second) only after the records before them were processed and their dead
  letters acknowledged by the broker; while the dead-letter topic cannot be
  written, ingestion waits (retrying with back-off) rather than drop them. Windows are memory only: after a
  restart they refill from new traffic (and from the uncommitted tail).
* **Ownership.** The series summarized at each tick are those of the
  partitions assigned now (``Stage1.summaries``); revoked ones stop at once.
* Consumer lag per owned partition is exported (``tailguard_consumer_lag``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from mode import Service

from app.core.types import WindowSummary
from app.settings import Settings
from app.streaming.deadletter import DeadLetter
from app.streaming.metrics import WorkerMetrics
from app.streaming.stage1 import Stage1
from app.streaming.stage2 import StageHints

log = logging.getLogger(__name__)

MAX_POLL_RECORDS = 5000
COMMIT_INTERVAL_S = 1.0
LAG_INTERVAL_S = 2.0


class Stage1Sink(Protocol):
    """Where stage 1 sends its output (faust topics in the service, lists in tests)."""

    async def send_summaries(self, summaries: Sequence[WindowSummary]) -> None: ...

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
    def __init__(self, owner: IngestService) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.owner.commit()
        gone = [tp.partition for tp in revoked if tp.topic == self.owner.topic]
        forgotten = self.owner.stage1.revoke(gone)
        if gone:
            log.info("stage 1 gave up %s partitions %s (%d series)", self.owner.topic,
                     sorted(gone), forgotten)
        for tp in revoked:
            label = (tp.topic, str(tp.partition))
            if label in self.owner.lag_labels:
                self.owner.lag_labels.discard(label)
                self.owner.metrics.consumer_lag.remove(*label)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("stage 1 owns %s partitions %s", self.owner.topic,
                 sorted(tp.partition for tp in assigned))


class IngestService(Service):
    """Consumes ``latency-events`` into :class:`Stage1`; sends summaries each tick."""

    def __init__(self, *, settings: Settings, stage1: Stage1, sink: Stage1Sink,
                 metrics: WorkerMetrics, clock: Callable[[], float] = time.time,
                 hints: Callable[[], StageHints] | None = None,
                 max_poll_records: int = MAX_POLL_RECORDS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.topic = settings.topics.latency_events
        self.stage1 = stage1
        self.sink = sink
        self.metrics = metrics
        self.clock = clock
        self.max_poll_records = max_poll_records
        self.hints = hints
        self.lag_labels: set[tuple[str, str]] = set()
        self._consumer: AIOKafkaConsumer | None = None
        self._next_offsets: dict[Any, int] = {}
        self._committed: dict[Any, int] = {}
        self._last_commit = 0.0
        self._last_lag = 0.0

    @property
    def group_id(self) -> str:
        return f"{self.settings.app_id}-stage1"

    async def on_start(self) -> None:
        c = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.group_id,
            client_id=f"{self.settings.app_id}-stage1",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 << 20,
            fetch_max_bytes=16 << 20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=3_000,
        )
        c.subscribe([self.topic], listener=_Listener(self))
        await c.start()
        self._consumer = c

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
        batches = await c.getmany(timeout_ms=timeout_ms, max_records=self.max_poll_records)
        now_s = self.clock()
        n = 0
        dead: list[DeadLetter] = []
        done: dict[Any, int] = {}
        for tp, recs in batches.items():
            if not recs:
                continue
            dead.extend(self.stage1.ingest(tp.partition, recs, now_s))
            done[tp] = recs[-1].offset + 1
            n += len(recs)
        if dead:
            for d in dead:
                d.log()
            await self._dead_letter(dead)
        self._next_offsets.update(done)
        mono = time.monotonic()
        if mono - self._last_commit >= COMMIT_INTERVAL_S:
            await self._commit(c)
        if mono - self._last_lag >= LAG_INTERVAL_S:
            self._update_lag(c)
            self._last_lag = mono
        return n

    async def _dead_letter(self, dead: list[DeadLetter]) -> None:
        # Blocks ingestion until the broker takes them: backpressure, never a silent loss.
        delay_s = 0.5
        while True:
            try:
                await self.sink.dead_letter(dead)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self.should_stop:
                    raise
                log.warning("cannot write %d dead letters (%s); retrying in %.1f s",
                            len(dead), e, delay_s)
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
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one poll kill ingestion; the error is logged
                log.exception("stage-1 poll failed; retrying in 1 s")
                await asyncio.sleep(1.0)

    async def tick(self) -> int:
        """Send one summary per owned series to stage 2; returns how many."""
        hints = self.hints() if self.hints is not None else StageHints()
        summaries = self.stage1.summaries(self.clock(), self.owned_partitions(), hints.judge_since,
                                          hints.out_of_fit)
        if summaries:
            await self.sink.send_summaries(summaries)
        return len(summaries)

    @Service.task
    async def _ticker(self) -> None:
        interval = self.settings.detector.tick_interval_s
        while not self.should_stop:
            await sleep_until(next_boundary(self.clock(), interval), self.clock)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stage-1 tick failed")


__all__ = ["IngestService", "Stage1Sink", "TopicPartition", "next_boundary", "sleep_until"]
