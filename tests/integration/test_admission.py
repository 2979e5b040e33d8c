"""Admission by evidence, through the real worker on the real Kafka and Redis.

* A single well-formed kcat event of a new node id never enters the routing set (waited
  well past a short warm-up), is in no held-out set, and a model whose only node is such an
  id has no routing set at all.
* A brand-new node behind a REAL HAProxy (``tailguard haproxy-sync``) and behind the
  reference proxy: three nodes are routed already (their own feeders); the new node is on
  the load balancer's list but not in the routing set, gets its share of the traffic because
  tailguard has not held it out, and its emitter's samples (the test records them for every
  request the node served) get it admitted: ``healthy``, reason ``admitted``, routed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_haproxy import BACKEND, start_haproxy, start_sync
from worker_harness import (
    Feeder,
    Worker,
    WorkerEnv,
    health_events,
    kcat_produce_keyed,
    routing,
    running_worker,
    ticks_written,
    wait_for,
)

from tailguard.emitter import LatencyEmitter
from tailguard.lb.balance import Balancer
from tailguard.lb.haproxy import SocketRuntimeApi
from tailguard.lb.haproxy_plan import parse_servers_state
from tailguard.lb.proxy import Proxy, serve
from tailguard.lb.source import open_routing
from tailguard.lb.testing import EchoBackend, echo_backend
from tailguard.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama-3-70b"          # the model test_haproxy's HAProxy config serves
OLD = ["node-a", "node-b", "node-c"]
NEW = "node-new"
# 1 s ticks (the harness), a short warm-up, 50 judged samples to be admitted.
EXTRA = {"TAILGUARD_WARMUP_S": "2", "TAILGUARD_SILENT_AFTER_S": "0"}


async def status(r: Any, prefix: str, model: str, node: str) -> dict[str, Any] | None:
    raw = await r.hget(f"{prefix}:nodes:{model}", node)
    return None if raw is None else dict(json.loads(raw))


async def held_out(r: Any, prefix: str, model: str) -> set[str]:
    return {m.decode() for m in await r.smembers(f"{prefix}:held-out:{model}")}


async def test_a_single_event_of_a_new_id_never_enters_the_routing_set(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    name = unique_name("admit-one")
    async with running_worker(kafka_bootstrap, redis_url, name, tmp_path, extra=EXTRA) as (env, r, worker), \
            Feeder(kafka_bootstrap, env.topic("latency_events"), {MODEL: OLD}) as feeder:
        await wait_for(lambda: _has(routing(r, name, MODEL), set(OLD)), 60, "the fed nodes routed",
                       worker.tail)
        now = time.time()
        kcat_produce_keyed(kafka_bootstrap, env.topic("latency_events"), [
            f"stranger|{MODEL}\t" + json.dumps({"node_id": "stranger", "model": MODEL,
                                                "latency_us": 1000.0, "ts": now}),
            "lonely|m-new\t" + json.dumps({"node_id": "lonely", "model": "m-new",
                                            "latency_us": 1000.0, "ts": now}),
        ])
        await wait_for(lambda: status(r, name, MODEL, "stranger"), 30, "stranger known", worker.tail)
        await wait_for(lambda: status(r, name, "m-new", "lonely"), 30, "lonely known", worker.tail)
        # 8 ticks (4x the warm-up; both models tick together) pass: nothing may change meanwhile.
        await ticks_written(r, name, MODEL, "stranger", 8, 60, worker.tail)
        feeder.check()
        assert await routing(r, name, MODEL) == set(OLD)
        s = await status(r, name, MODEL, "stranger")
        assert s is not None and s["state"] == "warming" and s["routed"] is False, s
        assert "stranger" not in await held_out(r, name, MODEL)     # not taken out: not judged
        # A model whose only node was never admitted has no routing set: "use your backends".
        assert await r.exists(f"{name}:routing:m-new") == 0
        lonely = await status(r, name, "m-new", "lonely")
        assert lonely is not None and lonely["state"] == "warming" and lonely["routed"] is False
        assert "refusing to empty" not in worker.log()
        changes = [e for e in await health_events(kafka_bootstrap, env)
                   if e["node_id"] in ("stranger", "lonely")]
        assert sorted((e["node_id"], e["to"], e["routed"]) for e in changes) == [
            ("lonely", "warming", False), ("stranger", "warming", False)]


async def _has(got: Awaitable[set[str]], want: set[str]) -> bool:
    return want <= await got


class Traffic:
    """Requests through a load balancer; for every one a node served, that node's emitter
    records its service time (~1 ms, as the feeder's nodes), as tailguard's emitter would."""

    def __init__(self, send: Callable[[], Awaitable[str]], emitter: LatencyEmitter) -> None:
        self.send, self.emitter = send, emitter
        self.served: Counter[str] = Counter()
        self.rng = random.Random(3)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for _ in range(16):
                node = await self.send()
                self.served[node] += 1
                self.emitter.record(node, MODEL, 1000.0 * self.rng.lognormvariate(0, 0.15))
            await asyncio.sleep(0.1)


async def admitted_behind(send: Callable[[], Awaitable[str]], kafka: str, topic: str, r: Any, prefix: str,
                          tail: Callable[[], str]) -> Traffic:
    """Drive traffic until NEW is routed; check it got there by admission. Returns the traffic."""
    async with LatencyEmitter(kafka, topic=topic) as emitter:
        traffic = Traffic(send, emitter)
        stop = asyncio.Event()
        task = asyncio.create_task(traffic.run(stop))
        try:
            await wait_for(lambda: _has(routing(r, prefix, MODEL), {NEW}), 90, f"{NEW} routed",
                           lambda: f"served {dict(traffic.served)}\n{tail()}")
        finally:
            stop.set()
            await task
    s = await status(r, prefix, MODEL, NEW)
    assert s is not None and s["state"] == "healthy" and s["reason"] == "admitted", s
    assert s["samples"] >= 50
    assert await routing(r, prefix, MODEL) == {*OLD, NEW}
    assert traffic.served[NEW] > 0
    return traffic


@contextlib.asynccontextmanager
async def routed_fleet(kafka: str, redis_url: str, name: str, tmp_path: Path,
                       ) -> AsyncIterator[tuple[WorkerEnv, Any, Worker, AsyncExitStack, dict[str, EchoBackend]]]:
    """A worker whose OLD nodes (fed directly) are routed, and echo backends for OLD and NEW."""
    async with running_worker(kafka, redis_url, name, tmp_path, extra=EXTRA) as (env, r, worker), \
            Feeder(kafka, env.topic("latency_events"), {MODEL: OLD}), AsyncExitStack() as stack:
        await wait_for(lambda: _has(routing(r, name, MODEL), set(OLD)), 60, "the fed nodes routed",
                       worker.tail)
        assert NEW not in await routing(r, name, MODEL)
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in [*OLD, NEW]}
        yield env, r, worker, stack, backends


async def test_a_new_node_behind_haproxy_gets_traffic_and_is_admitted(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    name = unique_name("admit-haproxy")
    async with routed_fleet(kafka_bootstrap, redis_url, name, tmp_path) as (env, r, worker, stack, backends):
        sock, port = await start_haproxy(stack, tmp_path, backends)
        api = SocketRuntimeApi(sock, timeout_s=2.0)
        # The operator's hand put NEW in maint; sync makes it ready: tailguard never took it out.
        assert await api.command(f"set server {BACKEND}/{NEW} state maint") == "\n"
        await start_sync(stack, tmp_path, sock, redis_url, name)

        async def new_ready() -> bool:
            return not parse_servers_state(await api.command("show servers state"))[BACKEND][NEW].forced_maint

        await wait_for(new_ready, 30, f"haproxy-sync makes {NEW} ready",
                       lambda: (tmp_path / "sync.log").read_text())
        http = await stack.enter_async_context(aiohttp.ClientSession())

        async def send() -> str:
            async with http.get(f"http://127.0.0.1:{port}/v1/models") as resp:
                assert resp.status == 200, await resp.text()
                return resp.headers["X-Echo-Node"]

        await admitted_behind(send, kafka_bootstrap, env.topic("latency_events"), r, name, worker.tail)
        state = parse_servers_state(await api.command("show servers state"))[BACKEND]
        assert not any(s.forced_maint for s in state.values())


async def test_a_new_node_behind_the_proxy_gets_traffic_and_is_admitted(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    name = unique_name("admit-proxy")
    async with routed_fleet(kafka_bootstrap, redis_url, name, tmp_path) as (env, r, worker, stack, backends):
        source = await stack.enter_async_context(
            open_routing(Settings(redis_url=redis_url, key_prefix=name), poll_interval_s=0.2))
        proxy = Proxy(source, Balancer({n: b.url for n, b in backends.items()}, probe_share=0.0))
        port = await stack.enter_async_context(serve(proxy, "127.0.0.1", 0))
        http = await stack.enter_async_context(aiohttp.ClientSession())

        async def send() -> str:
            async with http.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL}) as resp:
                assert resp.status == 200, await resp.text()
                return str(resp.headers["X-Tailguard-Node"])

        traffic = await admitted_behind(send, kafka_bootstrap, env.topic("latency_events"), r, name, worker.tail)
        assert proxy.stats.fallback == 0          # the routing set was known all along
        assert set(traffic.served) == {*OLD, NEW}
