"""The routing reader that load balancers use: a cached, self-refreshing view of the routing sets.

:class:`RoutingTable` keeps, per model it was asked about, the routing set, the held-out set,
the quarantine (node → probe-after Unix time), the routing weights (node → (0, 1]) and the
version, as read from the keys of :mod:`tailguard.routing.keys`. In full: docs/lb.md.

* **Consistent snapshots.** A model is loaded with one ``MULTI``/``EXEC``: every cached view,
  weights included, is one version the writer wrote.
* **Weights.** :meth:`RoutingTable.weight` is 1.0 for a node without a field (and for every
  node while tailguard writes no weights); :meth:`RoutingTable.pick` is smooth weighted
  round-robin over the routing set (:mod:`tailguard.routing.weighted`).
* **Fresh.** A model is refreshed on its ``P:routing:changes`` message and by polling the
  version keys every ``poll_interval_s``, so a change is seen within about that. On a Redis
  Cluster client it polls only (no pub/sub; docs/operations.md, "Redis Cluster").
* **Never goes dark.** While Redis is unreachable, or after a model's keys vanished, the
  last-known sets are served unchanged (failures counted through :class:`ReaderMetrics`).
* **Cheap on the hot path.** ``nodes``, ``cached_quarantine``, ``probe_candidates``,
  ``cached_weights`` and ``pick`` are synchronous, without I/O. An empty set from ``get`` /
  ``nodes`` means "no data" (use every backend); ``held_out`` is what a balancer holds out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Protocol, Self

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tailguard.routing.errors import RoutingUnavailable
from tailguard.routing.keys import DEFAULT_PREFIX, Keys, as_keys, member_text, parse_change_message
from tailguard.routing.tasks import cancel_and_wait
from tailguard.routing.weighted import SmoothWeighted, parse_weights

log = logging.getLogger(__name__)

_TRANSIENT: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)


def is_cluster(redis: object) -> bool:
    """Whether ``redis`` is a Redis Cluster client (its pub/sub is not followed: see
    :class:`RoutingTable`)."""
    from redis.asyncio.cluster import RedisCluster

    return isinstance(redis, RedisCluster)


class ReaderMetrics(Protocol):
    """What the reader reports (a load balancer maps these onto its own metrics)."""

    def refresh_failed(self, error: BaseException) -> None: ...

    def refreshed(self, model: str, version: int | None) -> None: ...


class NullReaderMetrics:
    """Reports nothing."""

    def refresh_failed(self, error: BaseException) -> None:
        pass

    def refreshed(self, model: str, version: int | None) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ModelRouting:
    """One model's routing state as last read from Redis.

    ``version`` is ``None`` when no routing was ever written for the model
    (then ``nodes`` is empty). ``quarantine`` maps node → probe-after Unix s.
    ``held_out``: the nodes tailguard took out (see the module docstring).
    ``loaded_ts`` is when it was read (the table's clock). ``weights``: node → routing
    weight in (0, 1] as written with this version (a node without one weighs 1.0).
    """

    model: str
    version: int | None
    nodes: frozenset[str]
    quarantine: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    loaded_ts: float = 0.0
    held_out: frozenset[str] = frozenset()
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def weight(self, node_id: str) -> float:
        """``node_id``'s routing weight (1.0 without a field)."""
        return self.weights.get(node_id, 1.0)


OnChange = Callable[[ModelRouting], Any]


class RoutingTable:
    """Cached routing sets for load balancers (see the module docstring).

    ::

        async with RoutingTable(connect(url), "tailguard") as table:
            backends = await table.get("llama-3-70b")     # first call loads
            ...
            backends = table.nodes("llama-3-70b")         # sync, cached

    ``on_change`` (optional) is called with the new :class:`ModelRouting`
    whenever a model's routing set, held-out set, quarantine or weights change; a coroutine
    function is awaited. Exceptions it raises are logged, not propagated.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        key_prefix: str | Keys = DEFAULT_PREFIX,
        *,
        poll_interval_s: float = 1.0,
        metrics: ReaderMetrics | None = None,
        clock: Callable[[], float] = time.time,
        on_change: OnChange | None = None,
        max_models: int = 10_000,
    ) -> None:
        if not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models!r}")
        self._max_models = max_models
        self._redis = redis
        self.keys = as_keys(key_prefix)
        self._poll_interval_s = poll_interval_s
        self._metrics: ReaderMetrics = metrics or NullReaderMetrics()
        self._clock = clock
        self._on_change = on_change
        self._cache: dict[str, ModelRouting] = {}
        self._wanted: set[str] = set()       # models asked about, loaded or not
        self._vanished: set[str] = set()     # models whose keys disappeared (warned once)
        self._full_warned = False
        self._load_lock = asyncio.Lock()
        self._reachable = True
        self._failures = 0
        self._poll_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._bad_weights: dict[str, list[str]] = {}     # model → fields last warned about
        self._pickers: dict[str, tuple[ModelRouting, SmoothWeighted]] = {}

    # -- hot path -------------------------------------------------------------

    def nodes(self, model: str) -> frozenset[str]:
        """Cached routing set of ``model`` (empty = no data: use all backends).

        A model not asked about before is loaded by the next poll.
        """
        entry = self._cache.get(model)
        if entry is None:
            if model not in self._wanted and self._want(model):
                self._poll_now.set()
            return frozenset()
        return entry.nodes

    def cached_quarantine(self, model: str) -> dict[str, float]:
        """Cached quarantine of ``model``: node → Unix time from which it may be probed."""
        entry = self._cache.get(model)
        return dict(entry.quarantine) if entry is not None else {}

    def cached_held_out(self, model: str) -> frozenset[str]:
        """Cached nodes of ``model`` that tailguard took out (see the module docstring)."""
        entry = self._cache.get(model)
        return entry.held_out if entry is not None else frozenset()

    def cached_weights(self, model: str) -> dict[str, float]:
        """Cached weights of ``model``: node → (0, 1]; a node not in it weighs 1.0."""
        entry = self._cache.get(model)
        return dict(entry.weights) if entry is not None else {}

    def weight(self, model: str, node_id: str) -> float:
        """Cached weight of ``node_id`` for ``model`` (1.0 without a field or without data)."""
        entry = self._cache.get(model)
        return entry.weight(node_id) if entry is not None else 1.0

    def pick(self, model: str) -> str | None:
        """The next node of ``model``'s cached routing set by smooth weighted round-robin
        (plain round-robin in sorted order while every weight is 1.0); ``None`` while no
        routing set is cached (no data: use every backend). A new version restarts the cycle.
        """
        entry = self._cache.get(model)
        if entry is None or not entry.nodes:
            self.nodes(model)       # track it, so that the next poll loads it
            return None
        held = self._pickers.get(model)
        if held is None or held[0] is not entry:
            held = (entry, SmoothWeighted(sorted(entry.nodes), entry.weights))
            self._pickers[model] = held
        return held[1].next()

    def probe_candidates(self, model: str, now_s: float) -> frozenset[str]:
        """Quarantined nodes of ``model`` whose probe-after time has come by ``now_s``."""
        entry = self._cache.get(model)
        if entry is None:
            return frozenset()
        return frozenset(n for n, ts in entry.quarantine.items() if ts <= now_s)

    def version(self, model: str) -> int | None:
        entry = self._cache.get(model)
        return entry.version if entry is not None else None

    def snapshot(self, model: str) -> ModelRouting | None:
        return self._cache.get(model)

    @property
    def reachable(self) -> bool:
        """False while the last Redis read failed (the cache is being served)."""
        return self._reachable

    # -- async API ------------------------------------------------------------

    async def get(self, model: str) -> frozenset[str]:
        """The routing set of ``model``; the first call for a model reads Redis.

        Raises :class:`RoutingUnavailable` only if Redis cannot be read and
        nothing is cached for the model.
        """
        return (await self._ensure(model)).nodes

    async def quarantined(self, model: str) -> dict[str, float]:
        """Quarantine of ``model``: node → Unix time from which it may be probed.

        Loads like :meth:`get`; a load balancer sends probe traffic to these
        nodes once their time has come (see :meth:`probe_candidates`).
        """
        return dict((await self._ensure(model)).quarantine)

    async def held_out(self, model: str) -> frozenset[str]:
        """Nodes of ``model`` that tailguard took out; loads like :meth:`get`."""
        return (await self._ensure(model)).held_out

    async def weights(self, model: str) -> Mapping[str, float]:
        """Routing weights of ``model`` (node → (0, 1], absent = 1.0), from the same version
        as :meth:`get`'s set; loads like :meth:`get`."""
        return (await self._ensure(model)).weights

    async def _ensure(self, model: str) -> ModelRouting:
        entry = self._cache.get(model)
        if entry is not None:
            return entry
        if not self._want(model):
            return ModelRouting(model=model, version=None, nodes=frozenset())
        try:
            loaded = await self._load(model)
        except _TRANSIENT as e:
            self._record_failure(e)
            raise RoutingUnavailable(model, e) from e
        self._record_success()
        return loaded

    def _want(self, model: str) -> bool:
        """Track ``model``; False when ``max_models`` are tracked (model names may come
        from requests: the table must not grow, or poll, without bound)."""
        if model in self._wanted:
            return True
        if len(self._wanted) >= self._max_models:
            if not self._full_warned:
                self._full_warned = True
                log.warning("routing table tracks max_models=%d models already; not tracking %r "
                            "(and further new models)", self._max_models, model)
            return False
        self._wanted.add(model)
        return True

    async def models(self) -> list[str]:
        """Every model tailguard has written (the ``P:models`` SET), sorted."""
        raw = await self._redis.smembers(self.keys.models)
        return sorted(member_text(x) for x in raw)

    async def refresh(self) -> bool:
        """Poll once: reload every wanted model whose version changed. True if Redis answered."""
        wanted = sorted(self._wanted)
        if not wanted:
            return True
        # After an outage reload everything: Redis may have restarted and lost the data.
        reload_all = not self._reachable
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for m in wanted:
                    pipe.get(self.keys.version(m))
                versions = await pipe.execute()
            for m, raw in zip(wanted, versions, strict=True):
                current = int(raw) if raw is not None else None
                entry = self._cache.get(m)
                if reload_all or entry is None or entry.version != current:
                    await self._load(m)
        except _TRANSIENT as e:
            self._record_failure(e)
            return False
        self._record_success()
        return True

    async def __aenter__(self) -> Self:
        self._tasks = [asyncio.create_task(self._poll_loop(), name="tailguard-routing-poll")]
        if not is_cluster(self._redis):     # a cluster client: the poll alone
            self._tasks.append(asyncio.create_task(self._listen_loop(),
                                                   name="tailguard-routing-pubsub"))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)

    # -- internals --------------------------------------------------------------

    async def _load(self, model: str) -> ModelRouting:
        k = self.keys
        async with self._load_lock:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.get(k.version(model))
                pipe.smembers(k.routing(model))
                pipe.zrange(k.quarantine(model), 0, -1, withscores=True)
                pipe.smembers(k.held_out(model))
                pipe.hgetall(k.weights(model))
                raw_version, raw_nodes, raw_quarantine, raw_held, raw_weights = await pipe.execute()
            old = self._cache.get(model)
            nodes = frozenset(member_text(n) for n in raw_nodes)
            quarantine = {member_text(n): float(s) for n, s in raw_quarantine}
            held = frozenset(member_text(n) for n in raw_held).union(quarantine)
            weights = self._weights_of(model, raw_weights)
            if not nodes and old is not None and old.nodes:
                # Keys gone (restart without persistence, manual delete): keep serving.
                if model not in self._vanished:
                    self._vanished.add(model)
                    log.warning(
                        "routing set of model %r is missing in Redis (was version %s with %d "
                        "nodes): serving the last-known set until tailguard writes a new one",
                        model, old.version, len(old.nodes),
                    )
                return old
            self._vanished.discard(model)
            entry = ModelRouting(
                model=model,
                version=int(raw_version) if raw_version is not None else None,
                nodes=nodes,
                quarantine=MappingProxyType(quarantine),
                loaded_ts=self._clock(),
                held_out=held,
                weights=MappingProxyType(weights),
            )
            self._cache[model] = entry
        self._metrics.refreshed(model, entry.version)
        if (old is None or old.nodes != entry.nodes or old.held_out != entry.held_out
                or dict(old.quarantine) != dict(entry.quarantine) or dict(old.weights) != weights):
            await self._notify(entry)
        return entry

    def _weights_of(self, model: str, raw: Mapping[bytes, bytes]) -> dict[str, float]:
        weights, bad = parse_weights(raw)
        if bad and self._bad_weights.get(model) != bad:
            log.warning("weights of model %r: %d field(s) are not a number in (0, 1] (%s); those "
                        "nodes weigh 1.0 until tailguard writes valid ones", model, len(bad),
                        ", ".join(repr(n) for n in bad[:5]))
        self._bad_weights[model] = bad
        return weights

    async def _notify(self, entry: ModelRouting) -> None:
        if self._on_change is None:
            return
        try:
            result = self._on_change(entry)
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            log.exception("on_change callback failed for model %r", entry.model)

    def _record_failure(self, error: BaseException) -> None:
        self._failures += 1
        self._metrics.refresh_failed(error)
        if self._reachable:
            self._reachable = False
            log.warning(
                "cannot read routing from Redis (%s: %s); serving the last-known sets of %d "
                "model(s) until it is back",
                type(error).__name__, error, len(self._cache),
            )

    def _record_success(self) -> None:
        if not self._reachable:
            log.info("Redis reachable again after %d failed read(s)", self._failures)
            self._reachable = True
            self._failures = 0

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as e:  # a malformed key must not stop the refreshes for good
                log.exception("unexpected error while polling routing versions")
                self._record_failure(e)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s):
                    await self._poll_now.wait()
            self._poll_now.clear()

    async def _listen_loop(self) -> None:
        channel = self.keys.channel
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                # Messages published while we were not subscribed are lost: catch up by polling.
                self._poll_now.set()
                while True:
                    msg = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=self._poll_interval_s
                    )
                    if msg is None or msg.get("type") != "message":
                        continue
                    parsed = parse_change_message(msg["data"])
                    if parsed is None:
                        log.debug("ignoring malformed message on %s: %r", channel, msg["data"])
                        continue
                    model, version = parsed
                    entry = self._cache.get(model)
                    if model in self._wanted and (entry is None or entry.version != version):
                        await self._load(model)
            except _TRANSIENT as e:
                self._record_failure(e)
            except Exception as e:  # as in _poll_loop: keep listening
                log.exception("unexpected error while listening on %s", channel)
                self._record_failure(e)
            finally:
                with contextlib.suppress(*_TRANSIENT):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed in redis >= 8.2
            await asyncio.sleep(self._poll_interval_s)
