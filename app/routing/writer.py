"""The Redis routing writer: every model's latest verdict reaches Redis, whatever Redis does.

:class:`RoutingWriter` runs :mod:`tailguard.routing.apply_script` (one atomic script run per
model and tick) and owns what happens around it:

* **Redis outages never reach the caller.** On a connection error or timeout
  :meth:`RoutingWriter.apply` returns ``False``; the latest verdict of each model is kept
  (older ones dropped) and retried with exponential back-off by the background task of
  ``async with RoutingWriter(...)`` (or :meth:`RoutingWriter.flush`). Load balancers keep the
  last written set meanwhile; after Redis lost its data the next write recreates it all.
* **One model's bad keys never block the others.** Any other Redis error (``WRONGTYPE``,
  ``NOPERM``) is that model's: counted, logged (first time, then every power of two), kept
  pending and retried on its own back-off while the other models are written.
* **Never empties routing.** An empty set for a model known to have one is refused here too;
  events of a verdict superseded unwritten go with the next. A model stage 2 forgot
  (``ModelTick.forgotten``) has its keys deleted in one script run (:data:`FORGET_LUA`),
  retried like any verdict until done or superseded.
* **History after routing** (:meth:`RoutingWriter.write_history`): best effort, never ahead of it.
* **Hash-tagged keys** (Cluster): ``P:models`` by its own ``SADD``/``SREM`` first. ``EVALSHA``
  with redis-py's reload on ``NOSCRIPT``. Metrics: the :class:`WriterMetrics` protocol.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any, Protocol, Self

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tailguard.core.contract.types import ModelTick
from tailguard.routing.apply_script import (
    APPLY_LUA,
    FORGET_LUA,
    HISTORY_LUA,
    NO_EXTRAS,
    Extras,
    WriteResult,
    forget_call,
    history_call,
    parse_reply,
    script_call,
    validate,
)
from tailguard.routing.keys import DEFAULT_PREFIX, Keys, as_keys
from tailguard.routing.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Errors that mean "Redis is away": connection trouble, timeouts, a server still
# loading its data (BusyLoadingError is a ConnectionError). They end a round and
# back off the whole writer: the next model would fail the same way.
_CONNECTION: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)
# Any other Redis error (ResponseError: WRONGTYPE, NOPERM, a script error) is
# about one model's keys: that model backs off, the round goes on.
_MODEL: tuple[type[BaseException], ...] = (RedisError,)



class WriterMetrics(Protocol):
    """What the writer reports; the service maps these onto Prometheus counters."""

    def write_failed(self, model: str, error: BaseException) -> None:
        """Every failed attempt to write ``model`` (connection or model error)."""

    def model_rejected(self, model: str, error: BaseException) -> None:
        """The subset of failures that Redis refused for this model's keys alone."""

    def empty_refused(self, model: str) -> None: ...

    def written(self, model: str, *, changed: bool, version: int) -> None: ...


class NullWriterMetrics:
    """Reports nothing."""

    def write_failed(self, model: str, error: BaseException) -> None:
        pass

    def model_rejected(self, model: str, error: BaseException) -> None:
        pass

    def empty_refused(self, model: str) -> None:
        pass

    def written(self, model: str, *, changed: bool, version: int) -> None:
        pass


class RoutingWriter:
    """Writes :class:`ModelTick` verdicts to Redis (see the module docstring for guarantees).

    Use as ``async with RoutingWriter(redis, prefix) as w: await w.apply(tick)``;
    the context starts the background retry task and, on exit, makes one
    last attempt to write what is still pending. Without the context manager,
    call :meth:`flush` yourself to retry.

    ``redis`` should fail fast (see :func:`tailguard.routing.client.connect`);
    ``write_timeout_s`` bounds one script run regardless. ``where`` (the redacted URL
    and the setting that holds it) is named in the warnings of a failing connection.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        key_prefix: str | Keys = DEFAULT_PREFIX,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
        metrics: WriterMetrics | None = None,
        retry_initial_s: float = 0.25,
        retry_max_s: float = 10.0,
        write_timeout_s: float = 5.0,
        where: str = "",
    ) -> None:
        if not 0 < retry_initial_s <= retry_max_s:
            raise ValueError(
                f"need 0 < retry_initial_s <= retry_max_s, got {retry_initial_s!r}, {retry_max_s!r}"
            )
        if not write_timeout_s > 0:
            raise ValueError(f"write_timeout_s must be > 0, got {write_timeout_s!r}")
        self._redis = redis
        self.keys = as_keys(key_prefix)
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._metrics: WriterMetrics = metrics or NullWriterMetrics()
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._write_timeout_s = write_timeout_s
        self._where = f" at {where}" if where else ""   # named in the connection warnings
        self._script = redis.register_script(APPLY_LUA)
        self._forget_script: Any = None      # registered when a model is first forgotten
        self._history_script: Any = None     # registered at the first history write
        self._pending: dict[str, tuple[ModelTick, Extras]] = {}
        self._lock = asyncio.Lock()
        self._failures = 0          # consecutive failed attempts (connection errors)
        self._retry_at = 0.0        # monotonic time before which apply() does not try
        # Per-model back-off after a model error: model -> (consecutive failures, retry at).
        self._model_backoff: dict[str, tuple[int, float]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.last_results: dict[str, WriteResult] = {}
        self._routed_models: set[str] = set()     # models this writer wrote a routing set for

    # -- public API ---------------------------------------------------------

    @property
    def pending(self) -> frozenset[str]:
        """Models whose latest verdict is not in Redis yet."""
        return frozenset(self._pending)

    @property
    def failing(self) -> bool:
        """True while the last attempt to write failed for want of a connection."""
        return self._failures > 0

    @property
    def rejected(self) -> frozenset[str]:
        """Models whose last write Redis refused (their keys are in a bad state)."""
        return frozenset(self._model_backoff)

    async def apply(self, tick: ModelTick, extras: Extras = NO_EXTRAS) -> bool:
        """Write ``tick``'s verdict. True when Redis now holds it (written or already equal).

        False when the tick was refused (empty routing set for a model that
        has one: the last set stays) or Redis could not be written; in the
        latter case the verdict is kept and retried, superseded by any newer
        tick of the same model. Raises ``ValueError`` only for a malformed
        tick (a programming error).
        """
        validate(tick)
        if not tick.routing and not tick.forgotten and (tick.model in self._routed_models or any(
                p[0].routing for p in (self._pending.get(tick.model),) if p is not None)):
            # Known here to have a set (written, or a verdict waiting): never emptied, never
            # superseded by an empty one. (The script refuses it too, against what Redis holds.)
            self._refuse_empty(tick.model)
            return False
        before = self._pending.get(tick.model)
        if before is not None and before[1].events:   # superseded unwritten: keep its events
            extras = replace(extras, events=before[1].events + extras.events)
        self._pending[tick.model] = (tick, extras)
        await self._flush(force=False)
        if tick.model in self._pending:
            return False
        last = self.last_results.get(tick.model)
        return last is None or not last.refused_empty

    async def write_history(self, model: str, history: Mapping[str, str]) -> bool:
        """Replace the model's explain history (``P:history:<m>``), after its routing write.

        Best effort: never while the model's verdict waits unwritten (history never runs
        ahead of routing) or the writer backs off, and not retried (each tick writes it
        whole). True when written; a failure is logged at debug level and counted nowhere
        else: the routing writes report Redis's health."""
        if model in self._pending or self._in_backoff():
            return False
        keys, args = history_call(self.keys, model, history)
        if self._history_script is None:
            self._history_script = self._redis.register_script(HISTORY_LUA)
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await self._history_script(keys=keys, args=args)
        except (*_CONNECTION, *_MODEL) as e:
            log.debug("writing the history of model %r failed (%s: %s); the next tick writes it",
                      model, type(e).__name__, e)
            return False
        return True

    async def flush(self) -> bool:
        """Try now to write every pending verdict, ignoring every back-off.

        True when nothing is pending afterwards.
        """
        return await self._flush(force=True, models_too=True)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._retry_loop(), name="tailguard-routing-writer-retry")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the retry task and make one last attempt to write what is pending."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        if self._pending and not await self._flush(force=True, models_too=True):
            log.error(
                "closing with unwritten routing verdicts for models %s: Redis keeps the last "
                "written sets",
                sorted(self._pending),
            )

    # -- internals ----------------------------------------------------------

    def _backoff_s(self) -> float:
        return min(self._retry_max_s, self._retry_initial_s * 2.0 ** max(0, self._failures - 1))

    def _in_backoff(self) -> bool:
        return self._failures > 0 and self._monotonic() < self._retry_at

    def _model_due_at(self, model: str) -> float:
        return self._model_backoff.get(model, (0, 0.0))[1]

    def _next_attempt_at(self) -> float:
        """Monotonic time of the next attempt worth making for what is pending."""
        first_model = min((self._model_due_at(m) for m in self._pending), default=0.0)
        return max(self._retry_at if self._failures else 0.0, first_model)

    async def _flush(self, *, force: bool, models_too: bool = False) -> bool:
        """One round over the pending models.

        ``force`` ignores the writer's back-off (connection errors),
        ``models_too`` also each model's own back-off (model errors).
        """
        if not self._pending:
            return True
        if not force and self._in_backoff():
            self._wake.set()
            return False
        async with self._lock:
            if not force and self._in_backoff():
                self._wake.set()
                return False
            now = self._monotonic()
            for model in list(self._pending):
                item = self._pending.get(model)
                if item is None:
                    continue
                if not models_too and self._model_due_at(model) > now:
                    self._wake.set()
                    continue
                try:
                    result = await self._write(*item)
                except _CONNECTION as e:
                    self._record_failure(model, e)
                    return False
                except _MODEL as e:
                    self._record_model_failure(model, e)
                    continue
                if self._pending.get(model) is item:
                    del self._pending[model]
                self._record_success(result)
            return not self._pending

    def _record_failure(self, model: str, error: BaseException) -> None:
        self._failures += 1
        delay_s = self._backoff_s()
        self._retry_at = self._monotonic() + delay_s
        self._metrics.write_failed(model, error)
        # Log the first failure and then every power of two, not every attempt.
        if self._failures & (self._failures - 1) == 0:
            log.warning(
                "Redis write%s of model %r failed (%s: %s); attempt %d, retrying in %.2fs; "
                "%d model(s) pending, load balancers keep the last written sets",
                self._where, model, type(error).__name__, error, self._failures, delay_s,
                len(self._pending),
            )
        self._wake.set()

    def _record_model_failure(self, model: str, error: BaseException) -> None:
        failures = self._model_backoff.get(model, (0, 0.0))[0] + 1
        delay_s = min(self._retry_max_s, self._retry_initial_s * 2.0 ** (failures - 1))
        self._model_backoff[model] = (failures, self._monotonic() + delay_s)
        self._metrics.write_failed(model, error)
        self._metrics.model_rejected(model, error)
        if failures & (failures - 1) == 0:
            k = self.keys
            log.error(
                "Redis refused the routing write of model %r (%s: %s); attempt %d, retrying this "
                "model in %.2fs, other models are still written. Check the type and ACL of its "
                "keys (%s is a SET, %s a string counter, %s a ZSET, %s a HASH, %s a SET, %s a "
                "HASH, %s a LIST, %s a SET, %s a HASH); load balancers keep its last written set",
                model, type(error).__name__, error, failures, delay_s,
                k.routing(model), k.version(model), k.quarantine(model), k.nodes(model),
                k.shadow(model), k.history(model), k.events(model), k.held_out(model),
                k.weights(model),
            )
        self._wake.set()

    def _refuse_empty(self, model: str) -> None:
        log.warning("refusing to empty the routing set of model %r: keeping the last written set",
                    model)
        self._metrics.empty_refused(model)

    def _record_success(self, result: WriteResult) -> None:
        if self._failures:
            log.info("Redis writes recovered after %d failed attempt(s)", self._failures)
        self._failures = 0
        self._retry_at = 0.0
        model_failures = self._model_backoff.pop(result.model, (0, 0.0))[0]
        if model_failures:
            log.info("Redis accepts the routing of model %r again after %d refused attempt(s)",
                     result.model, model_failures)
        self.last_results[result.model] = result
        if result.refused_empty:
            self._refuse_empty(result.model)
            return
        if result.forgotten:
            self._routed_models.discard(result.model)
            self.last_results.pop(result.model, None)
            log.info("model %r forgotten: its routing keys are deleted", result.model)
            return
        if result.has_routing:
            self._routed_models.add(result.model)
        self._metrics.written(result.model, changed=result.changed, version=result.version)
        if result.changed:
            log.debug("model %r routing version %d", result.model, result.version)

    async def _write(self, tick: ModelTick, extras: Extras) -> WriteResult:
        if tick.forgotten:
            async with asyncio.timeout(self._write_timeout_s):
                await self._forget(tick.model)
            return WriteResult(tick.model, 0, True, True, has_routing=False, forgotten=True)
        last = self.last_results.get(tick.model)
        keys, args = script_call(self.keys, tick, extras, self._clock(),
                                 version_floor=last.version if last is not None else 0)
        async with asyncio.timeout(self._write_timeout_s):
            if self.keys.tagged:   # idempotent; listed before its keys exist, as a new model
                await self._redis.sadd(self.keys.models, tick.model)
            raw = await self._script(keys=keys, args=args)
        return parse_reply(tick, raw)

    async def _forget(self, model: str) -> None:
        if self.keys.tagged:   # unlisted first, then its keys (of one slot) go in one DEL
            await self._redis.srem(self.keys.models, model)
            await self._redis.delete(*self.keys.model_keys(model))
            return
        keys, args = forget_call(self.keys, model)
        if self._forget_script is None:
            self._forget_script = self._redis.register_script(FORGET_LUA)
        await self._forget_script(keys=keys, args=args)

    async def _retry_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                delay_s = self._next_attempt_at() - self._monotonic()
                if delay_s > 0:
                    await self._sleep(delay_s)
                try:
                    if await self._flush(force=True):
                        break
                except Exception:  # not a Redis error: log, back off, keep the task alive
                    log.exception("unexpected error while retrying routing writes")
                    await self._sleep(self._retry_max_s)
