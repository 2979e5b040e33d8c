"""``LatencyEmitter``: publish per-request latencies to Kafka without slowing requests.

Owns a bounded in-memory buffer (:class:`~tailguard.emitter.buffer.SeriesBuffer`), one
background asyncio task (the *flusher*) and one aiokafka producer (built by :mod:`.kafka`;
options checked by :mod:`.options`, counters in :mod:`.stats`, back-off and log pacing in
:mod:`.pacing`): the flusher's send and retry states only make sense together. Entry points:
:meth:`LatencyEmitter.record`, :meth:`~LatencyEmitter.heartbeat`, ``start``/``stop`` (or
``async with``). Options and each guarantee in full: docs/emitter.md.

Guarantees:

* :meth:`LatencyEmitter.record` never awaits, never does I/O and never waits on Kafka; it may
  be called from any thread (``ValueError`` only for programming errors).
* Memory is bounded: at most ``max_buffered`` samples wait (the oldest dropped and counted)
  and ``max_in_flight`` messages are unacknowledged.
* A series is sent at ``max_batch`` samples or after ``linger_s`` (:mod:`tailguard.emitter.wire`).
* At least once within the buffer's bound (retriable errors re-buffer, with back-off); Kafka
  down at start does not fail :meth:`start`.
* ``recorded == sent + dropped + buffered + in_flight`` whenever idle (tested); time
  (``clock``, ``monotonic``) and the producer (``producer_factory``) are injectable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from tailguard.emitter.buffer import SeriesBuffer
from tailguard.emitter.kafka import Producer, aiokafka_producer, retriable, stop_quietly
from tailguard.emitter.options import check_options, positive
from tailguard.emitter.pacing import Backoff, LogLimiter
from tailguard.emitter.stats import EmitterStats
from tailguard.emitter.wire import (
    Sample,
    SeriesKey,
    WireFormat,
    check_series,
    encode_batches,
    encode_heartbeat,
    message_key,
    sample_values,
)

log = logging.getLogger("tailguard.emitter")

_LOG_EVERY_S: Final = 30.0


class LatencyEmitter:
    """Batches latency samples per (node, model) and sends them to Kafka.

    Use as ``async with LatencyEmitter("127.0.0.1:9092") as em: em.record(...)``,
    or call :meth:`start` / :meth:`stop`. See the module docstring for the
    guarantees.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic: str = "latency-events",
        max_batch: int = 500,
        linger_s: float = 0.25,
        max_buffered: int = 100_000,
        heartbeat_interval_s: float = 5.0,
        producer_factory: Callable[[], Producer] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        max_in_flight: int = 16,
        request_timeout_s: float = 10.0,
        retry_backoff_s: float = 0.2,
        max_retry_backoff_s: float = 5.0,
        close_timeout_s: float = 5.0,
        producer_options: Mapping[str, Any] | None = None,
        instance: str | None = None,
        wire_format: WireFormat = "binary",
    ) -> None:
        check_options(bootstrap_servers, topic, max_batch, max_buffered, linger_s, max_in_flight,
                      retry_backoff_s, max_retry_backoff_s, wire_format)
        self._wire_format: WireFormat = wire_format
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._heartbeat_interval_s = positive("heartbeat_interval_s", heartbeat_interval_s)
        self._request_timeout_s = positive("request_timeout_s", request_timeout_s)
        self._close_timeout_s = positive("close_timeout_s", close_timeout_s)
        self._max_in_flight = max_in_flight
        self._producer_options = dict(producer_options or {})
        self._factory = producer_factory or functools.partial(
            aiokafka_producer, bootstrap_servers, self._request_timeout_s, self._producer_options)
        self._clock = clock
        self._mono = monotonic
        # This process's id on every message: a new one tells tailguard the node restarted.
        self.instance = instance if instance is not None else uuid.uuid4().hex[:16]

        # Shared with record()/heartbeat() callers on any thread: guarded by _lock.
        self._lock = threading.Lock()
        self._buffer = SeriesBuffer(max_batch=max_batch, linger_s=float(linger_s), max_buffered=max_buffered)
        self._seq = 0
        self._recorded = 0
        self._sent = 0
        self._lost = 0              # dropped outside the buffer (see EmitterStats.dropped)
        self._send_errors = 0
        self._in_flight = 0
        self._heartbeats_sent = 0
        self._heartbeats: dict[SeriesKey, float] = {}   # series -> monotonic time of the next heartbeat
        self._closed = False        # no more samples accepted
        self._final = False         # stop() finished: failures are no longer re-queued
        self._validated: set[SeriesKey] = set()

        # Owned by the event loop that ran start().
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._idle = asyncio.Event()        # set while the flusher sleeps (a seam for tests)
        self._slots: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._flush_waiters: list[asyncio.Future[None]] = []
        self._first_producer: Producer | None = None
        self._connected = False
        self._backoff = Backoff(retry_backoff_s, max_retry_backoff_s, monotonic)
        self._say = LogLimiter(log, _LOG_EVERY_S, monotonic)
        self._logged_drops = 0

    # ------------------------------------------------------------------ request path

    def record(
        self,
        node_id: str,
        model: str,
        latency_us: float,
        *,
        ok: bool = True,
        ts: float | None = None,
        probe: bool = False,
        hardware: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        ttft_us: float | None = None,
    ) -> None:
        """Buffer one request's latency. Never blocks; thread-safe.

        ``ts`` defaults to ``clock()`` (seconds since the epoch). ``ok=False``
        marks a failed request (counted by the detector, kept out of its
        quantiles); ``probe=True`` marks synthetic probe traffic. The size
        fields are for LLM servers: prompt and generated token counts and the
        time to first token, all optional. Raises ValueError on values the
        contract forbids (``latency_us <= 0``, ``ttft_us > latency_us`` …).
        """
        series = (node_id, model, hardware)
        if series not in self._validated:
            check_series(node_id, model, hardware)
            self._validated.add(series)
        lat, ts_s, n_in, n_out, ttft = sample_values(latency_us, self._clock() if ts is None else ts,
                                                     input_tokens, output_tokens, ttft_us)
        t_in = self._mono()
        with self._lock:
            if self._closed:
                self._lost += 1
                return
            self._seq += 1
            self._recorded += 1
            wake = self._buffer.add(series, (self._seq, t_in, ts_s, lat, n_in, n_out, ttft, bool(ok), bool(probe)))
        if wake:
            self._wake_soon()

    def heartbeat(self, node_id: str, model: str, hardware: str | None = None) -> None:
        """Announce ``(node_id, model)`` now and every ``heartbeat_interval_s`` until stopped."""
        check_series(node_id, model, hardware)
        with self._lock:
            self._heartbeats[(node_id, model, hardware)] = -math.inf
        self._wake_soon()

    def stop_heartbeat(self, node_id: str, model: str, hardware: str | None = None) -> None:
        """Stop the heartbeats of a series (e.g. the server unloaded the model)."""
        with self._lock:
            self._heartbeats.pop((node_id, model, hardware), None)

    @property
    def stats(self) -> EmitterStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return EmitterStats(
                recorded=self._recorded, sent=self._sent, dropped=self._buffer.dropped + self._lost,
                send_errors=self._send_errors, buffered=self._buffer.total, in_flight=self._in_flight,
                heartbeats_sent=self._heartbeats_sent, connected=self._connected,
            )

    def _wake_soon(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            with contextlib.suppress(RuntimeError):    # the loop is closed: nothing to wake
                loop.call_soon_threadsafe(self._wake.set)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LatencyEmitter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the flusher. Returns at once, even when Kafka is unreachable."""
        if self._task is not None:
            raise RuntimeError("LatencyEmitter.start() called twice")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._slots = asyncio.Semaphore(self._max_in_flight)
        # Constructed here so that bad producer options fail loudly in start().
        self._first_producer = self._factory()
        self._task = asyncio.create_task(self._run(), name="tailguard-emitter")
        self._task.add_done_callback(self._flusher_done)

    @staticmethod
    def _flusher_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # A bug, not Kafka trouble: say so at once rather than buffer and drop silently.
            log.error("emitter: the flusher stopped; samples are no longer sent", exc_info=task.exception())

    async def flush(self) -> None:
        """Hand everything buffered to the producer now and wait for Kafka's answer.

        Returns once each message has been acknowledged or has failed (failed
        samples go back to the buffer; see ``stats``). Waits for a connection
        when there is none: wrap it in a timeout if Kafka may be down.
        """
        if self._task is None or self._task.done():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(waiter)
        self._wake.set()
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        pending = set(self._pending)
        if pending:
            await asyncio.wait(pending)

    async def stop(self, timeout_s: float | None = None) -> None:
        """Stop accepting samples, send what is buffered, close the producer.

        Gives up after ``timeout_s`` (default ``close_timeout_s``); samples
        that were not sent by then are counted in ``stats.dropped``.
        """
        timeout = self._close_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._closed = True
        task = self._task
        if task is not None and not task.done():
            self._closing.set()
            self._wake.set()
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                log.warning("emitter: gave up flushing after %.1f s (Kafka at %s slow or down)",
                            timeout, self._bootstrap)
                task.cancel()
                await asyncio.wait({task})
        with self._lock:
            self._final = True
            left = self._buffer.clear()
        if left:
            log.warning("emitter: %d samples not sent before close", left)

    # ------------------------------------------------------------------ flusher

    async def _run(self) -> None:
        producer = await self._connect()
        try:
            while True:
                self._wake.clear()
                closing = self._closing.is_set()
                waiters, self._flush_waiters = self._flush_waiters, []
                # Closing: only the first heartbeat of a series not sent yet (announced, then
                # closed at once: the worker still learns the node serves the model).
                await self._send_heartbeats(producer, first_only=closing)
                await self._send_due(producer, force=closing or bool(waiters))
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
                self._log_drops()
                if closing:
                    with self._lock:
                        empty = self._buffer.total == 0
                    if empty and not self._pending:
                        return
                    if empty:
                        # Failures re-queue their samples and go round again.
                        await asyncio.wait(set(self._pending))
                    else:
                        await asyncio.sleep(max(0.0, self._backoff.retry_at - self._mono()))
                    continue
                await self._sleep()
        finally:
            self._connected = False
            await stop_quietly(producer, max(1.0, self._close_timeout_s / 5))

    async def _connect(self) -> Producer:
        """Start a producer, retrying with back-off; during stop() too (stop's timeout bounds it)."""
        producer = self._first_producer
        self._first_producer = None
        while True:
            if producer is None:
                producer = self._factory()
            try:
                await producer.start()
            except asyncio.CancelledError:
                await stop_quietly(producer, 1.0)
                raise
            except Exception as e:
                self._say.log("connect", logging.WARNING,
                                  "emitter: cannot reach Kafka at %s (%s); buffering and retrying",
                                  self._bootstrap, e)
                await stop_quietly(producer, 1.0)
                producer = None
                self._backoff.failed()
                await self._pause_until(self._backoff.retry_at)
                continue
            self._connected = True
            self._backoff.connected()
            log.info("emitter: connected to Kafka at %s, topic %s", self._bootstrap, self._topic)
            return producer

    async def _pause_until(self, deadline: float) -> None:
        """Sleep until monotonic ``deadline``; while not stopping, stop() cuts it short."""
        delay = deadline - self._mono()
        if delay <= 0:
            return
        if self._closing.is_set():
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), timeout=delay)

    async def _sleep(self) -> None:
        now = self._mono()
        with self._lock:
            # A full batch is due now (e.g. re-queued after a failure), else at its linger deadline.
            full = now if self._buffer.any_full() else None
            candidates = [t for t in (full, self._buffer.next_deadline(), *self._heartbeats.values()) if t is not None]
        deadline = min(candidates, default=None)
        if deadline is not None and self._backoff.retry_at > now:
            deadline = max(deadline, self._backoff.retry_at)
        timeout = None if deadline is None else max(0.0, deadline - now)
        if timeout == 0.0:
            return
        self._idle.set()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=timeout)
        except TimeoutError:
            pass
        finally:
            self._idle.clear()

    async def _send_heartbeats(self, producer: Producer, *, first_only: bool = False) -> None:
        now = self._mono()
        if now < self._backoff.retry_at:
            return
        with self._lock:
            due = [k for k, t in self._heartbeats.items()
                   if (t == -math.inf if first_only else t <= now)]
            for k in due:
                self._heartbeats[k] = now + self._heartbeat_interval_s
        assert self._slots is not None
        for series in due:
            await self._slots.acquire()
            value = encode_heartbeat(series, self._clock(), self.instance)
            if not await self._send_one(producer, series, value, []):
                return

    async def _send_due(self, producer: Producer, *, force: bool) -> None:
        slots = self._slots
        assert slots is not None
        while self._mono() >= self._backoff.retry_at:
            await slots.acquire()
            with self._lock:
                item = self._buffer.pop_due(self._mono(), force=force)
                if item is not None:
                    self._in_flight += len(item[1])
            if item is None:
                slots.release()
                return
            series, samples = item
            messages = encode_batches(series, samples, self.instance, self._wire_format)
            for i, (value, group) in enumerate(messages):
                try:
                    if i:
                        await slots.acquire()
                except asyncio.CancelledError:
                    for _, rest in messages[i:]:
                        self._failed(series, rest, None)
                    raise
                if not await self._send_one(producer, series, value, group):
                    for _, rest in messages[i + 1:]:
                        self._failed(series, rest, None)
                    return

    async def _send_one(self, producer: Producer, series: SeriesKey, value: bytes, samples: list[Sample]) -> bool:
        """Send one message holding a slot; False (slot released, samples re-queued) on failure.

        ``samples == []`` means a heartbeat.
        """
        assert self._slots is not None
        try:
            fut = await producer.send(self._topic, value=value, key=message_key(series))
        except asyncio.CancelledError:
            self._slots.release()
            self._failed(series, samples, None)
            raise
        except Exception as e:
            self._slots.release()
            self._failed(series, samples, e)
            return False
        self._pending.add(fut)
        fut.add_done_callback(functools.partial(self._delivered, series, samples))
        return True

    def _delivered(self, series: SeriesKey, samples: list[Sample], fut: asyncio.Future[Any]) -> None:
        assert self._slots is not None
        self._slots.release()
        self._pending.discard(fut)
        exc: BaseException | None = asyncio.CancelledError() if fut.cancelled() else fut.exception()
        if exc is not None:
            self._failed(series, samples, exc)
            self._wake.set()
            return
        self._backoff.delivered()
        with self._lock:
            if samples:
                self._sent += len(samples)
                self._in_flight -= len(samples)
            else:
                self._heartbeats_sent += 1

    def _failed(self, series: SeriesKey, samples: list[Sample], exc: BaseException | None) -> None:
        """Account for a message that did not make it; ``exc=None``: never tried (re-queue)."""
        requeue = exc is None or retriable(exc)
        with self._lock:
            if exc is not None:
                self._send_errors += 1
            if samples:
                self._in_flight -= len(samples)
                if requeue and not self._final:
                    self._buffer.requeue(series, samples)
                else:
                    self._lost += len(samples)
        if exc is not None:
            self._backoff.failed()
            self._say.log("send", logging.WARNING, "emitter: send to %s failed (%r); %s",
                              self._topic, exc, "will retry" if requeue else "samples dropped")

    def _log_drops(self) -> None:
        with self._lock:
            dropped = self._buffer.dropped
        if dropped > self._logged_drops and self._say.log(
                "drop", logging.WARNING, "emitter: buffer full (%d samples): %d oldest samples dropped so far"
                " — Kafka at %s is slow or down", self._buffer.max_buffered, dropped, self._bootstrap):
            self._logged_drops = dropped
