"""The Redis routing writer: one model's verdict → Redis, atomically, idempotently, never empty.

:class:`RoutingWriter` owns the writes of every key in :mod:`app.routing.keys`. Its length
is one concept's: the Lua script and the Python that retries, isolates and backs it off.

Guarantees
----------
* **Atomic.** One :class:`~app.core.types.ModelTick` is written by ONE Lua
  script (:data:`APPLY_LUA`). Redis runs a script without interleaving any
  other command, so a reader sees either the whole previous state of the
  model (routing set, version, quarantine, node statuses) or the whole new
  one, never a mix. The routing set is replaced in place (``DEL`` + ``SADD``
  inside the script) — no ``RENAME`` of a temporary key, which would fail for
  an empty set and leave a window in non-scripted code.
* **Idempotent.** The script compares the wanted routing set and quarantine
  with what Redis holds. Only when either differs does it rewrite them,
  ``INCR`` the version and ``PUBLISH`` ``{"model", "version"}`` on
  ``P:routing:changes``. Writing the same decision twice changes nothing
  (version unchanged, no message); only the node statuses (dashboards) are
  refreshed. A version key that does not exist yet starts at the Redis
  server's clock in milliseconds, not at 1, so a version number never
  repeats after Redis lost its data (a reader holding version 1 of the old
  data would otherwise take the new version 1 for the same state).
* **Never empties routing.** A tick whose routing set is empty is refused
  when the model has a routing set in Redis (logged, counted through
  :meth:`WriterMetrics.empty_refused`, nothing written): the last written
  set stays. A detector fault must not take a whole model out of service.
  A model none of whose nodes has been admitted yet (admission by evidence,
  :mod:`app.core.admission`) has no routing set: its other keys (statuses,
  held-out set, version) are written and ``P:routing:<m>`` stays absent,
  which readers take as "no data: use every backend". The check is in the
  script, against what Redis holds, so it holds across writer restarts.
* **Held out.** ``P:held-out:<m>`` is the set of nodes tailguard took out
  (:func:`app.routing.keys.held_out`, or :attr:`Extras.held_out`); a change
  of it bumps the version and publishes like a routing change.
* **Survives Redis outages.** A connection error or timeout never reaches
  the caller: :meth:`RoutingWriter.apply` returns ``False``, the latest
  wanted state of each model is kept (older ones are dropped — only the
  latest matters) and retried with exponential back-off (the background task
  of ``async with RoutingWriter(...)``, or :meth:`RoutingWriter.flush`).
  While Redis is down the load balancers keep the last written set. After a
  restart that lost the data, the next write recreates every key (the
  script compares with what is there, so the version is bumped and
  published again).
* **One model's bad keys never block the others.** A ``ResponseError``
  (or any other Redis error that is not about the connection) on one
  model's keys — e.g. ``WRONGTYPE`` because someone wrote a string to
  ``P:routing:<model>``, or an ACL that forbids a key — is that model's
  problem: it is counted (:meth:`WriterMetrics.model_rejected`), logged
  (first time, then every power of two), kept pending and retried with its
  OWN exponential back-off, while every other model is written in the same
  round. Only connection errors and timeouts (Redis itself is away) end a
  round and back off the whole writer.
* **ACL.** Under a Redis ACL (7.0+) the script first checks with
  ``redis.acl_check_cmd`` that the user may run every command it may call on
  these keys and the channel, and refuses with ``NOPERM`` before writing
  anything otherwise: Redis does not roll back a script that fails half way.
* **Operator extras in the same step.** :class:`Extras` (the shadow routing
  set, the per-node tick history and the newest events, from the stage-2
  edge :mod:`app.streaming.edge`) are written by the same script: a reader
  sees the shadow set of the same tick as the routing set. Events of a
  verdict superseded before it was written are carried into the next one.
* **NOSCRIPT.** The script is run by SHA (``EVALSHA``); redis-py's
  ``AsyncScript`` reloads it with ``SCRIPT LOAD`` when a restarted server
  answers ``NOSCRIPT`` (checked by the integration tests).

Metrics are reported through the :class:`WriterMetrics` protocol (no
Prometheus import here); the service maps them onto its registry.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Protocol, Self

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.core.types import ModelTick
from app.routing.keys import DEFAULT_PREFIX, Keys, held_out, status_json
from app.routing.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Errors that mean "Redis is away": connection trouble, timeouts, a server still
# loading its data (BusyLoadingError is a ConnectionError). They end a round and
# back off the whole writer: the next model would fail the same way.
_CONNECTION: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)
# Any other Redis error (ResponseError: WRONGTYPE, NOPERM, a script error) is
# about one model's keys: that model backs off, the round goes on.
_MODEL: tuple[type[BaseException], ...] = (RedisError,)

APPLY_LUA = r"""
-- tailguard: write one model's routing verdict atomically.
-- KEYS: 1 routing SET, 2 version, 3 quarantine ZSET, 4 nodes HASH, 5 models SET,
--       6 shadow routing SET, 7 history HASH, 8 events LIST, 9 held-out SET
-- ARGV: 1 channel, 2 model, 3 #routing, 4 #quarantine, 5 #statuses,
--       6 #shadow (-1: leave the shadow set alone), 7 #history (-1: leave it alone),
--       8 #events, 9 events cap, 10 #held-out,
--       then the routing members, then (score, node) pairs, then (node, json) pairs,
--       then the shadow members, then (node, json) history pairs, then event jsons,
--       then the held-out members.
-- An empty routing set is written only for a model that has none yet (no node admitted:
-- the key stays absent); one that would empty an existing set is refused, nothing written.
-- Returns {routing_changed 0|1, quarantine_changed 0|1 (or -1: refused), version}.
local routing_key, version_key, quarantine_key, nodes_key, models_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local shadow_key, history_key, events_key, held_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local channel, model = ARGV[1], ARGV[2]
local n_routing = tonumber(ARGV[3])
local n_quarantine = tonumber(ARGV[4])
local n_status = tonumber(ARGV[5])
local n_shadow = tonumber(ARGV[6])
local n_history = tonumber(ARGV[7])
local n_events = tonumber(ARGV[8])
local events_cap = tonumber(ARGV[9])
local n_held = tonumber(ARGV[10])
if n_routing == nil or n_quarantine == nil or n_status == nil or n_shadow == nil
    or n_history == nil or n_events == nil or events_cap == nil or n_held == nil then
  return redis.error_reply('ERR tailguard: malformed counts')
end
local first_r = 11
local first_q = first_r + n_routing
local first_s = first_q + 2 * n_quarantine
local first_w = first_s + 2 * n_status
local first_h = first_w + math.max(n_shadow, 0)
local first_e = first_h + 2 * math.max(n_history, 0)
local first_o = first_e + n_events
if #ARGV ~= first_o - 1 + n_held then
  return redis.error_reply('ERR tailguard: argument count does not match the counts')
end

-- Under a Redis ACL, check every command first: Redis does not roll back a script that fails
-- half way, so a missing permission (say +publish) would leave a half-written model.
if redis.acl_check_cmd then
  local checks = {
    {'EXISTS', version_key}, {'GET', version_key}, {'SET', version_key, '0'}, {'INCR', version_key},
    {'SCARD', routing_key}, {'SISMEMBER', routing_key, 'n'}, {'DEL', routing_key},
    {'SADD', routing_key, 'n'}, {'ZCARD', quarantine_key}, {'ZSCORE', quarantine_key, 'n'},
    {'DEL', quarantine_key}, {'ZADD', quarantine_key, '0', 'n'}, {'DEL', nodes_key},
    {'HSET', nodes_key, 'n', 'v'}, {'SADD', models_key, 'm'}, {'TIME'}, {'PUBLISH', channel, 'm'},
    {'DEL', shadow_key}, {'SADD', shadow_key, 'n'}, {'DEL', history_key}, {'HSET', history_key, 'n', 'v'},
    {'LPUSH', events_key, 'e'}, {'LTRIM', events_key, '0', '0'}, {'EXISTS', routing_key},
    {'SCARD', held_key}, {'SISMEMBER', held_key, 'n'}, {'DEL', held_key}, {'SADD', held_key, 'n'},
  }
  for _, c in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM tailguard: this ACL user may not run ' .. c[1] ..
        (c[2] and (' on ' .. c[2]) or '') .. '; nothing was written (see docs/production.md)')
    end
  end
end

local CHUNK = 512  -- even, so (score, member) and (field, value) pairs never split
local function put(cmd, key, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + CHUNK - 1, to)
    redis.call(cmd, key, unpack(ARGV, i, j))
    i = j + 1
  end
end

if n_routing < 1 and redis.call('EXISTS', routing_key) == 1 then
  return {0, -1, 0}   -- never empty a routing set: the last written one stays
end

-- same size and every wanted (distinct) member present => same set
local function same_set(key, from, to)
  if redis.call('SCARD', key) ~= to - from + 1 then
    return false
  end
  for i = from, to do
    if redis.call('SISMEMBER', key, ARGV[i]) == 0 then
      return false
    end
  end
  return true
end

local routing_changed = redis.call('EXISTS', version_key) == 0
  or not same_set(routing_key, first_r, first_q - 1)
local held_changed = not same_set(held_key, first_o, #ARGV)

local quarantine_changed = redis.call('ZCARD', quarantine_key) ~= n_quarantine
if not quarantine_changed then
  for i = first_q, first_s - 1, 2 do
    local have = redis.call('ZSCORE', quarantine_key, ARGV[i + 1])
    if not have or tonumber(have) ~= tonumber(ARGV[i]) then
      quarantine_changed = true
      break
    end
  end
end

if routing_changed then
  redis.call('DEL', routing_key)
  put('SADD', routing_key, first_r, first_q - 1)
end
if quarantine_changed then
  redis.call('DEL', quarantine_key)
  put('ZADD', quarantine_key, first_q, first_s - 1)
end
if held_changed then
  redis.call('DEL', held_key)
  put('SADD', held_key, first_o, #ARGV)
end

redis.call('DEL', nodes_key)
put('HSET', nodes_key, first_s, first_w - 1)
redis.call('SADD', models_key, model)
if n_shadow >= 0 then
  redis.call('DEL', shadow_key)
  put('SADD', shadow_key, first_w, first_h - 1)
end
if n_history >= 0 then
  redis.call('DEL', history_key)
  put('HSET', history_key, first_h, first_e - 1)
end
if n_events > 0 then
  put('LPUSH', events_key, first_e, #ARGV)
  redis.call('LTRIM', events_key, 0, events_cap - 1)
end

local version
if routing_changed or quarantine_changed or held_changed then
  if redis.call('EXISTS', version_key) == 0 then
    -- A new (or lost) version key starts at the server's time in ms, so that a version
    -- never repeats after Redis lost its data: readers compare versions with ~=.
    local t = redis.call('TIME')
    version = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('SET', version_key, string.format('%.0f', version))
  else
    version = redis.call('INCR', version_key)
  end
  redis.call('PUBLISH', channel, cjson.encode({model = model, version = version}))
else
  version = tonumber(redis.call('GET', version_key))
end
return {routing_changed and 1 or 0, (quarantine_changed or held_changed) and 1 or 0, version}
"""


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


EVENTS_CAP = 50   # newest health changes / fleet events kept per model (P:events:<m>)


@dataclass(frozen=True, slots=True)
class Extras:
    """What the stage-2 edge writes next to a verdict (see :mod:`app.routing.keys`).

    ``shadow``: the would-be routing set (None: leave the key alone);
    ``annotations``: extra fields merged into a node's status JSON;
    ``history``: node → JSON of its tick history (None: leave the key alone);
    ``events``: JSON documents pushed onto the model's event list, oldest first;
    ``held_out``: the nodes to hold out (None: :func:`app.routing.keys.held_out` of the tick).
    """

    shadow: frozenset[str] | None = None
    annotations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    history: Mapping[str, str] | None = None
    events: tuple[str, ...] = ()
    held_out: frozenset[str] | None = None     # None: derived from the tick (keys.held_out)


NO_EXTRAS = Extras()


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one successful script run did."""

    model: str
    version: int
    routing_changed: bool
    quarantine_changed: bool           # the quarantine or the held-out set
    refused_empty: bool = False        # an empty routing set for a model that has one: nothing written
    has_routing: bool = True           # a routing set was written (False: none admitted yet)

    @property
    def changed(self) -> bool:
        return self.routing_changed or self.quarantine_changed


def _flat(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [x for pair in pairs for x in pair]


def _validate(tick: ModelTick) -> None:
    if not isinstance(tick.model, str) or not tick.model:
        raise ValueError(f"ModelTick.model must be a non-empty string, got {tick.model!r}")
    for node in tick.routing:
        if not isinstance(node, str) or not node:
            raise ValueError(f"routing set of model {tick.model!r} holds a bad node id {node!r}")
    for node, ts in tick.quarantine.items():
        if not isinstance(node, str) or not node:
            raise ValueError(f"quarantine of model {tick.model!r} holds a bad node id {node!r}")
        if math.isnan(ts):
            raise ValueError(f"quarantine of model {tick.model!r}: probe-after ts of {node!r} is NaN")
    for s in tick.statuses:
        if s.model != tick.model:
            raise ValueError(
                f"ModelTick for model {tick.model!r} carries a status of model {s.model!r} "
                f"(node {s.node_id!r})"
            )


class RoutingWriter:
    """Writes :class:`ModelTick` verdicts to Redis (see the module docstring for guarantees).

    Use as ``async with RoutingWriter(redis, prefix) as w: await w.apply(tick)``;
    the context starts the background retry task and, on exit, makes one
    last attempt to write what is still pending. Without the context manager,
    call :meth:`flush` yourself to retry.

    ``redis`` should fail fast (see :func:`app.routing.client.connect`);
    ``write_timeout_s`` bounds one script run regardless.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        key_prefix: str = DEFAULT_PREFIX,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
        metrics: WriterMetrics | None = None,
        retry_initial_s: float = 0.25,
        retry_max_s: float = 10.0,
        write_timeout_s: float = 5.0,
    ) -> None:
        if not 0 < retry_initial_s <= retry_max_s:
            raise ValueError(
                f"need 0 < retry_initial_s <= retry_max_s, got {retry_initial_s!r}, {retry_max_s!r}"
            )
        if not write_timeout_s > 0:
            raise ValueError(f"write_timeout_s must be > 0, got {write_timeout_s!r}")
        self._redis = redis
        self.keys = Keys(key_prefix)
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._metrics: WriterMetrics = metrics or NullWriterMetrics()
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._write_timeout_s = write_timeout_s
        self._script = redis.register_script(APPLY_LUA)
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
        _validate(tick)
        if not tick.routing and (tick.model in self._routed_models or any(
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
                "Redis write of model %r failed (%s: %s); attempt %d, retrying in %.2fs; "
                "%d model(s) pending, load balancers keep the last written sets",
                model, type(error).__name__, error, self._failures, delay_s, len(self._pending),
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
                "HASH, %s a LIST, %s a SET); load balancers keep its last written set",
                model, type(error).__name__, error, failures, delay_s,
                k.routing(model), k.version(model), k.quarantine(model), k.nodes(model),
                k.shadow(model), k.history(model), k.events(model), k.held_out(model),
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
        if result.has_routing:
            self._routed_models.add(result.model)
        self._metrics.written(result.model, changed=result.changed, version=result.version)
        if result.changed:
            log.debug("model %r routing version %d", result.model, result.version)

    async def _write(self, tick: ModelTick, extras: Extras) -> WriteResult:
        k, m = self.keys, tick.model
        routing = sorted(tick.routing)
        quarantine = [(repr(float(ts)), node) for node, ts in sorted(tick.quarantine.items())]
        now = self._clock()
        notes = extras.annotations
        statuses = {s.node_id: status_json(s, updated_ts=now, extra=notes.get(s.node_id))
                    for s in tick.statuses}
        shadow = None if extras.shadow is None else sorted(extras.shadow)
        history = None if extras.history is None else sorted(extras.history.items())
        held = sorted(held_out(tick.statuses, tick.routing) if extras.held_out is None
                      else extras.held_out)
        args: list[str | int] = [
            k.channel, m, len(routing), len(quarantine), len(statuses),
            -1 if shadow is None else len(shadow), -1 if history is None else len(history),
            len(extras.events), EVENTS_CAP, len(held),
            *routing, *_flat(quarantine), *_flat(sorted(statuses.items())),
            *(shadow or ()), *_flat(history or ()), *extras.events, *held,
        ]
        async with asyncio.timeout(self._write_timeout_s):
            raw = await self._script(
                keys=[k.routing(m), k.version(m), k.quarantine(m), k.nodes(m), k.models,
                      k.shadow(m), k.history(m), k.events(m), k.held_out(m)],
                args=args,
            )
        routing_changed, quarantine_changed, version = (int(x) for x in raw)
        if quarantine_changed < 0:
            return WriteResult(m, version, False, False, refused_empty=True)
        return WriteResult(m, version, bool(routing_changed), bool(quarantine_changed),
                           has_routing=bool(routing))

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
