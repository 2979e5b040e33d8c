"""Test doubles for load-balancer code: a settable routing source and tiny HTTP backends.

* :class:`StaticSource` is a :class:`~tailguard.lb.RoutingSource` whose routing sets,
  quarantines and weights are plain dicts the test sets; ``fail = True`` makes every read
  raise, like a reader with Redis down and nothing cached.
* :func:`echo_backend` runs one tiny aiohttp server on a free loopback port that answers
  every request with JSON naming its ``node_id``, whether the request carried
  ``X-Tailguard-Probe: 1``, and its method, path and body (``status`` and ``chunks`` shape
  the answer); each request is recorded in :attr:`EchoBackend.seen`.
* :func:`write_routing` plays tailguard's writer in integration tests: one ``MULTI``/``EXEC``
  replaces a model's routing set, quarantine and weights, bumps the version and publishes
  the change, with plain redis-py commands (not :mod:`tailguard.routing.writer`: the load
  balancers are tested against the key contract, not against our own writer).
* :func:`scratch_redis` gives a client and deletes a test's key prefix after; :func:`spawn`
  starts a subprocess that an exit stack stops; :func:`eventually` waits (bounded) until a
  condition holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from tailguard.lb import LbError
from tailguard.routing.keys import Keys, as_keys, change_message


class StaticSource:
    """A :class:`~tailguard.lb.RoutingSource` over dicts (see module docstring)."""

    def __init__(
        self,
        routing: Mapping[str, frozenset[str]] | None = None,
        quarantine: Mapping[str, Mapping[str, float]] | None = None,
        held: Mapping[str, frozenset[str]] | None = None,
        weights: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.routing: dict[str, frozenset[str]] = dict(routing or {})
        self.quarantine: dict[str, dict[str, float]] = {m: dict(q) for m, q in (quarantine or {}).items()}
        self.held: dict[str, frozenset[str]] = dict(held or {})
        self.weight: dict[str, dict[str, float]] = {m: dict(w) for m, w in (weights or {}).items()}
        self.fail = False
        self.reads = 0

    async def get(self, model: str) -> frozenset[str]:
        self.reads += 1
        if self.fail:
            raise LbError(f"StaticSource.fail is set (model {model!r})")
        return self.routing.get(model, frozenset())

    async def quarantined(self, model: str) -> Mapping[str, float]:
        self.reads += 1
        if self.fail:
            raise LbError(f"StaticSource.fail is set (model {model!r})")
        return dict(self.quarantine.get(model, {}))

    async def held_out(self, model: str) -> frozenset[str]:
        """``held[model]`` and the model's quarantined nodes (as the real reader gives)."""
        self.reads += 1
        if self.fail:
            raise LbError(f"StaticSource.fail is set (model {model!r})")
        return self.held.get(model, frozenset()) | frozenset(self.quarantine.get(model, {}))

    async def weights(self, model: str) -> Mapping[str, float]:
        self.reads += 1
        if self.fail:
            raise LbError(f"StaticSource.fail is set (model {model!r})")
        return dict(self.weight.get(model, {}))


@dataclass(frozen=True, slots=True)
class Seen:
    """One request an :class:`EchoBackend` received."""

    method: str
    path: str
    probe: bool
    headers: Mapping[str, str]
    body: bytes


@dataclass(slots=True)
class EchoBackend:
    """A running :func:`echo_backend`: where it listens and what it received."""

    node_id: str
    url: str
    status: int = 200
    chunks: int = 1
    seen: list[Seen] = field(default_factory=list)

    @property
    def probes(self) -> int:
        return sum(s.probe for s in self.seen)


@contextlib.asynccontextmanager
async def echo_backend(node_id: str, *, host: str = "127.0.0.1", status: int = 200) -> AsyncIterator[EchoBackend]:
    """Run an echo backend for ``node_id`` on a free port of ``host`` (see module docstring)."""
    backend = EchoBackend(node_id=node_id, url="", status=status)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        probe = request.headers.get("X-Tailguard-Probe") == "1"
        backend.seen.append(Seen(request.method, request.path_qs, probe, dict(request.headers), body))
        payload = (
            f'{{"node": "{node_id}", "probe": {str(probe).lower()}, "method": "{request.method}", '
            f'"path": "{request.path}", "body_bytes": {len(body)}}}'
        ).encode()
        resp = web.StreamResponse(status=backend.status, headers={"Content-Type": "application/json",
                                                                  "X-Echo-Node": node_id})
        await resp.prepare(request)
        # Several writes make a chunked response, as a streaming LLM server sends.
        step = max(1, len(payload) // max(1, backend.chunks))
        for i in range(0, len(payload), step):
            await resp.write(payload[i:i + step])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, 0)
        await site.start()
        port = runner.addresses[0][1]
        backend.url = f"http://{host}:{port}"
        yield backend
    finally:
        await runner.cleanup()


async def write_routing(
    redis: aioredis.Redis,
    key_prefix: str | Keys,
    model: str,
    nodes: Iterable[str],
    quarantine: Mapping[str, float] | None = None,
    held_out: Iterable[str] = (),
    weights: Mapping[str, float] | None = None,
) -> int:
    """Replace ``model``'s routing set, quarantine, held-out set and weights (node → (0, 1],
    stored as decimal strings in ``P:weights:<m>``) as tailguard would; returns the new version.
    With hash-tagged ``Keys`` (a Redis Cluster) the model joins ``P:models`` by its own ``SADD``
    first, and the ``MULTI``/``EXEC`` touches the model's slot only."""
    keys = as_keys(key_prefix)
    nodes = sorted(nodes)
    held = sorted(held_out)
    wkey = keys.weights(model)
    if keys.tagged:
        await redis.sadd(keys.models, model)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.routing(model), keys.quarantine(model), keys.held_out(model), wkey)
        if weights:
            pipe.hset(wkey, mapping={n: f"{w:.6g}" for n, w in weights.items()})
        if nodes:
            pipe.sadd(keys.routing(model), *nodes)
        if quarantine:
            pipe.zadd(keys.quarantine(model), dict(quarantine))
        if held:
            pipe.sadd(keys.held_out(model), *held)
        pipe.incr(keys.version(model))
        if not keys.tagged:
            pipe.sadd(keys.models, model)
        results = await pipe.execute()
    version = int(results[-1 if keys.tagged else -2])
    await redis.publish(keys.channel, change_message(model, version))
    return version


@contextlib.asynccontextmanager
async def scratch_redis(redis_url: str, key_prefix: str) -> AsyncIterator[aioredis.Redis]:
    """A client for ``redis_url``; on exit every key under ``key_prefix:`` is deleted."""
    from tailguard.routing.client import connect

    redis = connect(redis_url)
    try:
        yield redis
    finally:
        try:
            keys = [k async for k in redis.scan_iter(match=f"{key_prefix}:*", count=500)]
            if keys:
                await redis.delete(*keys)
        finally:
            await redis.aclose()


async def spawn(stack: contextlib.AsyncExitStack, *argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """Start ``argv`` (``asyncio.create_subprocess_exec`` keywords); ``stack`` terminates and reaps it."""
    proc = await asyncio.create_subprocess_exec(*argv, **kwargs)

    async def stop() -> None:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise

    stack.push_async_callback(stop)
    return proc


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], *, timeout_s: float = 15.0, what: str = "condition"
) -> None:
    """Wait until ``check()`` is true, polling every 20 ms; ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        ok = check()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true after {timeout_s} s")
        await asyncio.sleep(0.02)
