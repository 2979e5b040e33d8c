"""Opening the routing set for a load balancer, reading it without ever failing a request, CLI plumbing.

:func:`open_routing` is the one place that builds the real
:class:`tailguard.routing.reader.RoutingTable` (with the fail-fast Redis client of
:mod:`tailguard.routing.client`) from ``TAILGUARD_REDIS_URL`` / ``TAILGUARD_KEY_PREFIX``
or the ``--redis-url`` / ``--key-prefix`` flags that :func:`add_routing_args`
adds to both load-balancer commands. It first PINGs Redis once
(:func:`tailguard.routing.client.check_redis`): a refused login or certificate stops the
command with one line naming the setting.

:class:`SafeSource` wraps any :class:`~tailguard.lb.RoutingSource` so that a read
error becomes "unknown" (an empty set, no quarantine) and is logged at most
once per ``log_every_s`` per model: a load balancer keeps dispatching (to the
last-known set that the reader serves, or to every known backend) while
tailguard or Redis is down. It also keeps Redis off the request path while a
model has never been read: one read at a time per model, and none for
``retry_s`` after a failure (the reader itself would try Redis on every call
until its first read of a model succeeds).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from typing import Any

from tailguard import text
from tailguard.lb import LbError, RoutingSource
from tailguard.settings import Settings, load

log = logging.getLogger(__name__)


class SafeSource:
    """A :class:`RoutingSource` whose reads never raise and never queue up on Redis (see module docstring).

    Until a model's first read succeeds, concurrent readers share one read of
    the inner source (single flight), and after a failure the model counts as
    "unknown" for ``retry_s`` without touching Redis. Once a read succeeded, the
    inner source serves the model from its cache and calls go straight to it.
    """

    def __init__(
        self,
        inner: RoutingSource,
        *,
        retry_s: float = 1.0,
        log_every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._retry_s = retry_s
        self._log_every_s = log_every_s
        self._clock = clock
        self._loaded: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Future[frozenset[str]]] = {}
        self._last_log: dict[str, float] = {}
        self.errors = 0

    def _failed(self, what: str, model: str, e: BaseException) -> None:
        self.errors += 1
        now = self._clock()
        self._retry_at[model] = now + self._retry_s
        if now - self._last_log.get(model, -1e18) >= self._log_every_s:
            self._last_log[model] = now
            log.warning("cannot read the %s of model %r (%s: %s); treating it as unknown",
                        what, model, type(e).__name__, e)

    async def _ready(self, model: str) -> bool:
        if model in self._loaded:
            return True
        if self._retry_at.get(model, -1e18) > self._clock():
            return False
        fut = self._inflight.get(model)
        if fut is None:
            fut = self._inflight[model] = asyncio.ensure_future(self._inner.get(model))
            fut.add_done_callback(functools.partial(self._landed, model))
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            raise
        except Exception:  # reported once by _landed
            return False
        return True

    def _landed(self, model: str, fut: asyncio.Future[frozenset[str]]) -> None:
        self._inflight.pop(model, None)
        if fut.cancelled():
            return
        e = fut.exception()
        if e is None:
            self._loaded.add(model)
        else:
            self._failed("routing set", model, e)

    async def get(self, model: str) -> frozenset[str]:
        if not await self._ready(model):
            return frozenset()
        try:
            return await self._inner.get(model)
        except Exception as e:  # any failure of the source means "unknown", never a failed request
            self._failed("routing set", model, e)
            return frozenset()

    async def quarantined(self, model: str) -> Mapping[str, float]:
        if not await self._ready(model):
            return {}
        try:
            return await self._inner.quarantined(model)
        except Exception as e:  # as in get()
            self._failed("quarantine", model, e)
            return {}

    async def held_out(self, model: str) -> frozenset[str]:
        if not await self._ready(model):
            return frozenset()
        try:
            return await self._inner.held_out(model)
        except Exception as e:  # as in get()
            self._failed("held-out set", model, e)
            return frozenset()

    async def weights(self, model: str) -> Mapping[str, float]:
        if not await self._ready(model):
            return {}
        try:
            return await self._inner.weights(model)
        except Exception as e:  # as in get(): unknown weights are 1.0
            self._failed("weights", model, e)
            return {}


def add_routing_args(parser: argparse.ArgumentParser) -> None:
    """``--redis-url``, ``--key-prefix``, ``--poll-interval-s`` (defaults from the environment)."""
    g = parser.add_argument_group("routing set (Redis)")
    g.add_argument("--redis-url", help="Redis URL (default: TAILGUARD_REDIS_URL or redis://127.0.0.1:6379/0)")
    g.add_argument("--key-prefix", help="Redis key prefix (default: TAILGUARD_KEY_PREFIX or tailguard)")
    g.add_argument("--poll-interval-s", type=float, default=1.0,
                   help="how often the reader polls each model's version key besides pub/sub (default 1.0)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Service settings from the environment, with the routing flags of :func:`add_routing_args` on top."""
    overrides = {k: v for k, v in (("redis_url", args.redis_url), ("key_prefix", args.key_prefix)) if v}
    return load(**overrides)


@asynccontextmanager
async def open_routing(
    settings: Settings,
    *,
    poll_interval_s: float = 1.0,
    on_change: Callable[[Any], Any] | None = None,
    follow: bool = True,
) -> AsyncIterator[RoutingSource]:
    """The real routing reader for ``settings``, wrapped in :class:`SafeSource`.

    ``on_change`` is passed to the reader: called (with its ``ModelRouting``)
    whenever a model's routing set or quarantine changes. ``follow=False``
    starts no pub/sub or polling (one-shot reads, e.g. ``haproxy-sync --once``).
    """
    from tailguard.routing.client import check_redis, connect_for, keys_for
    from tailguard.routing.reader import RoutingTable

    if not poll_interval_s > 0:
        raise ValueError(f"--poll-interval-s must be > 0, got {poll_interval_s!r}")
    await check_redis(settings)   # a refused login or certificate stops the start, in one line
    client = connect_for(settings)
    try:
        table = RoutingTable(client, keys_for(settings), poll_interval_s=poll_interval_s,
                             on_change=on_change)
        if not follow:
            yield SafeSource(table)
            return
        before = asyncio.all_tasks()
        await table.__aenter__()
        own = {t for t in asyncio.all_tasks() - before if t.get_name().startswith("tailguard-routing")}
        try:
            yield SafeSource(table)
        finally:
            await _close_reader(table.aclose(), own)
    finally:
        await client.aclose()


async def _close_reader(closing: Coroutine[Any, Any, None], tasks: set[asyncio.Task[Any]]) -> None:
    # redis-py 8.1 can swallow a task cancellation that lands inside a command (measured here: a third
    # to two thirds of cancels), and the reader's loops would then run on and aclose() wait forever.
    # Repeat the cancel until its background tasks have ended.
    fut = asyncio.ensure_future(closing)
    while not fut.done():
        await asyncio.wait([fut], timeout=0.05)
        for t in tasks:
            if not t.done():
                t.cancel()
    fut.result()


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call from inside the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run_main(
    prog: str,
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    argv: list[str],
) -> int:
    """Parse ``argv``, set up logging and run ``run(args)``; bad input → one line on stderr, exit 2."""
    args = parser.parse_args(argv)
    text.basic_config(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(run(args))
    except (LbError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
