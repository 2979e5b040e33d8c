"""The reference proxy in front of 3 loopback backends, routing read from the REAL Redis.

The test plays tailguard: it writes the routing set, version, quarantine and
change message with plain redis-py (tailguard.lb.testing.write_routing) under a
unique key prefix, and checks that the proxy follows: a removed node gets no
traffic except marked probes, a re-added node gets its share again, an
unreachable Redis means "route to every backend", never an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tailguard.core.contract.events import SampleBatch, decode
from tailguard.lb import RoutingSource
from tailguard.lb.balance import Balancer
from tailguard.lb.proxy import Proxy, serve
from tailguard.lb.source import open_routing
from tailguard.lb.testing import EchoBackend, echo_backend, eventually, scratch_redis, spawn, write_routing
from tailguard.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "llama-3-70b"
NODES = ["node-a", "node-b", "node-c"]


@dataclass
class Setup:
    redis: aioredis.Redis
    prefix: str
    source: RoutingSource
    proxy: Proxy
    url: str
    backends: dict[str, EchoBackend]
    http: aiohttp.ClientSession

    async def send(self, n: int) -> Counter[str]:
        got: Counter[str] = Counter()
        for _ in range(n):
            async with self.http.post(self.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}) as r:
                assert r.status == 200, await r.text()
                got[json.loads(await r.read())["node"]] += 1
        return got

    async def route(self, nodes: list[str], quarantine: dict[str, float] | None = None) -> None:
        await write_routing(self.redis, self.prefix, MODEL, nodes, quarantine)

        async def seen() -> bool:
            return await self.source.get(MODEL) == frozenset(nodes)

        await eventually(seen, timeout_s=10.0, what=f"the routing reader sees {nodes}")

    def nonprobe(self, node: str) -> int:
        return sum(not s.probe for s in self.backends[node].seen)


@pytest.fixture
async def setup(redis_url: str, unique_name: Callable[[str], str]) -> AsyncIterator[Setup]:
    prefix = unique_name("lb-proxy")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        await write_routing(r, prefix, MODEL, NODES)
        source = await stack.enter_async_context(
            open_routing(Settings(redis_url=redis_url, key_prefix=prefix), poll_interval_s=0.2))
        proxy = Proxy(source, Balancer({n: b.url for n, b in backends.items()}, probe_share=0.1))
        port = await stack.enter_async_context(serve(proxy, "127.0.0.1", 0))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Setup(r, prefix, source, proxy, f"http://127.0.0.1:{port}", backends, http)


async def test_removed_node_gets_only_probes_and_readded_node_gets_traffic_again(setup: Setup) -> None:
    s = setup
    assert await s.send(30) == {"node-a": 10, "node-b": 10, "node-c": 10}
    assert s.proxy.stats.fallback == 0 and s.proxy.stats.probes == 0      # nothing quarantined yet

    # tailguard takes node-b out and quarantines it, probe-able from now on.
    await s.route(["node-a", "node-c"], {"node-b": time.time() - 1.0})
    before = s.nonprobe("node-b")
    got = await s.send(50)
    assert s.nonprobe("node-b") == before                                  # no regular traffic
    assert got["node-b"] == s.backends["node-b"].probes == 5                # requests 31..80 at 10 %: 5 probes
    assert got["node-a"] + got["node-c"] == 45 and abs(got["node-a"] - got["node-c"]) <= 1
    assert all(seen.probe for seen in s.backends["node-b"].seen[before:])
    assert s.proxy.stats.fallback == 0

    # Re-admitted: back in rotation, no more probes.
    await s.route(NODES)
    probes = s.backends["node-b"].probes
    assert await s.send(30) == {"node-a": 10, "node-b": 10, "node-c": 10}
    assert s.backends["node-b"].probes == probes


async def test_quarantined_node_is_not_probed_before_its_time(setup: Setup) -> None:
    s = setup
    await s.route(["node-a", "node-c"], {"node-b": time.time() + 3600.0})
    got = await s.send(40)
    assert got["node-b"] == 0 and got["node-a"] + got["node-c"] == 40


async def test_unreachable_redis_means_all_backends_never_an_error(unique_name: Callable[[str], str]) -> None:
    with socket.socket() as sock:                     # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead_url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    async with AsyncExitStack() as stack:
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        source = await stack.enter_async_context(
            open_routing(Settings(redis_url=dead_url, key_prefix=unique_name("lb-dead")), poll_interval_s=0.2))
        proxy = Proxy(source, Balancer({n: b.url for n, b in backends.items()}))
        port = await stack.enter_async_context(serve(proxy, "127.0.0.1", 0))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        nodes = []
        for _ in range(9):
            async with http.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL}) as r:
                assert r.status == 200
                nodes.append(r.headers["X-Tailguard-Node"])
        assert Counter(nodes) == {"node-a": 3, "node-b": 3, "node-c": 3}
        assert proxy.stats.fallback == 9


async def test_cli_proxy_follows_the_routing_set(redis_url: str, unique_name: Callable[[str], str]) -> None:
    prefix = unique_name("lb-cli")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        await write_routing(r, prefix, MODEL, ["node-a", "node-b"], held_out=["node-c"])
        spec = ",".join(f"{n}={b.url}" for n, b in backends.items())
        proc = await spawn(
            stack, sys.executable, "-m", "tailguard.cli", "proxy", "--listen", "127.0.0.1:0", "--backends", spec,
            "--model-header", "X-Model", "--probe-share", "0", "--redis-url", redis_url, "--key-prefix", prefix,
            "--poll-interval-s", "0.2", stderr=asyncio.subprocess.PIPE, env=dict(os.environ),
        )
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m, f"unexpected first line from tailguard proxy: {line!r}"
        url = f"http://127.0.0.1:{m.group(1)}"
        http = await stack.enter_async_context(aiohttp.ClientSession())

        async def spread(n: int) -> Counter[str]:
            got: Counter[str] = Counter()
            for _ in range(n):
                async with http.get(url + "/v1/models", headers={"X-Model": MODEL}) as resp:
                    assert resp.status == 200
                    got[resp.headers["X-Tailguard-Node"]] += 1
            return got

        async def routed_only(nodes: set[str]) -> bool:
            return set(await spread(6)) == nodes

        await eventually(lambda: routed_only({"node-a", "node-b"}), what="proxy routes to node-a, node-b")
        await write_routing(r, prefix, MODEL, ["node-c"], held_out=["node-a", "node-b"])
        await eventually(lambda: routed_only({"node-c"}), what="proxy routes to node-c only")
        async with http.get(url + "/_tailguard/stats") as resp:
            stats = await resp.json()
        assert stats["nodes"]["node-c"]["by_model"][MODEL] >= 6 and stats["fallback"] == 0


async def test_cli_proxy_reports_what_a_dead_node_cannot(
        redis_url: str, kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    # --report-failures: attempts that got no answer become ok:false events for that node on
    # latency-events (the real broker), so tailguard's error_rate rule can take it out.
    from worker_harness import read_topic

    prefix, topic = unique_name("lb-fail"), unique_name("lb-fail-events")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        alive = await stack.enter_async_context(echo_backend("node-a"))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        await write_routing(r, prefix, MODEL, ["node-a", "dead"])
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        env = dict(os.environ, TAILGUARD_KAFKA_BOOTSTRAP=kafka_bootstrap,
                   TAILGUARD_TOPIC_LATENCY_EVENTS=topic)
        proc = await spawn(
            stack, sys.executable, "-m", "tailguard.cli", "proxy", "--listen", "127.0.0.1:0", "--backends",
            f"node-a={alive.url},dead={dead_url}", "--probe-share", "0", "--redis-url", redis_url,
            "--key-prefix", prefix, "--poll-interval-s", "0.2", "--report-failures",
            stderr=asyncio.subprocess.PIPE, env=env)
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m and "failures reported to" in line, line
        url = f"http://127.0.0.1:{m.group(1)}"
        http = await stack.enter_async_context(aiohttp.ClientSession())
        for _ in range(6):
            async with http.post(url + "/v1/chat/completions", json={"model": MODEL}) as resp:
                assert resp.status == 200          # the dead node's turn is retried on node-a

        async def reported() -> list[object]:
            # The emitter's wire form (binary batches by default, JSON on request): decoded
            # the way the worker decodes it.
            return [decode(rec.value) for rec in await read_topic(kafka_bootstrap, topic)]
        deadline = time.monotonic() + 20
        while not (events := await reported()) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        failed = [e for e in events if isinstance(e, SampleBatch) and not e.ok.any()]
        assert failed and {e.node_id for e in failed} == {"dead"}, events
        assert {e.model for e in failed} == {MODEL}
        assert sum(len(e) for e in failed) == 3       # every other request met it


async def test_cli_probe_sends_marked_probes_to_due_quarantined_nodes_only(
        redis_url: str, unique_name: Callable[[str], str]) -> None:
    # `tailguard probe` reads the quarantine from the real Redis (what tailguard wrote) and
    # sends X-Tailguard-Probe requests to nodes whose probe time has come — nothing else.
    prefix = unique_name("lb-probe")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        await write_routing(r, prefix, MODEL, ["node-a"],
                            {"node-b": time.time() - 1.0, "node-c": time.time() + 3600.0})
        spec = ",".join(f"{n}={b.url}" for n, b in backends.items())
        proc = await spawn(
            stack, sys.executable, "-m", "tailguard.cli", "probe", "--backends", spec, "--model", MODEL,
            "--rate-per-node", "10", "--redis-url", redis_url, "--key-prefix", prefix,
            "--poll-interval-s", "0.2", stderr=asyncio.subprocess.PIPE, env=dict(os.environ))
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert line.startswith("tailguard probe: 3 backends, models llama-3-70b"), line

        async def probed() -> bool:
            return backends["node-b"].probes >= 3
        await eventually(probed, timeout_s=15.0, what="probes to node-b")
        assert all(s.probe for s in backends["node-b"].seen)
        assert backends["node-a"].seen == [] and backends["node-c"].seen == []
        body = json.loads(backends["node-b"].seen[0].body)
        assert body == {"model": MODEL, "prompt": "tailguard probe", "max_tokens": 1}
