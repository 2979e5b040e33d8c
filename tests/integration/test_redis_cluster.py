"""The routing story on a real Redis Cluster of 3 primaries, with every load-balancer reader.

``scripts/redis-cluster`` runs the cluster beside the shared stack. The worker (a subprocess,
real Kafka) and every reader reach Redis only as a cluster (``TAILGUARD_REDIS_CLUSTER=true``,
so the hash-tagged key layout):

* a slow node leaves routing; :class:`~tailguard.routing.reader.RoutingTable`, the reference
  proxy (its traffic avoids the node), ``tailguard haproxy-sync`` (a real HAProxy puts the server
  in MAINT), ``tailguard status``, ``tailguard explain`` and the worker's status page all see it;
* an operator's drain (``tailguard drain``/``release``) reaches the readers the same way;
* the node recovers, its probes pass, and every reader sees it back;
* the reader never sees a routing version go backward, and every key of the model sits in one
  slot (``CLUSTER KEYSLOT``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
from stack_scripts import free_base, run_script
from test_haproxy import BACKEND, start_haproxy, start_sync
from worker_harness import HEALTHY, NODES, Feeder, Worker, WorkerEnv, free_port, tailguard_cli, wait_for

from tailguard import settings as settings_mod
from tailguard.lb.balance import Balancer
from tailguard.lb.haproxy import SocketRuntimeApi, parse_servers_state
from tailguard.lb.proxy import Proxy, serve
from tailguard.lb.source import open_routing
from tailguard.lb.testing import echo_backend
from tailguard.routing.client import connect_for, keys_for
from tailguard.routing.reader import RoutingTable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

MODEL = "llama-3-70b"


class Cluster:
    def __init__(self, run_dir: Path) -> None:
        base = free_base((17000, 17100, 17200, 17300),
                         lambda b: (b, b + 1, b + 2, b + 10000, b + 10001, b + 10002),
                         "a Redis Cluster of 3 primaries")
        self.port = base
        self.url = f"redis://127.0.0.1:{base}/0"
        self.env = {**os.environ, "TAILGUARD_RUN": str(run_dir),
                    "TAILGUARD_REDIS_CLUSTER_PORT": str(base)}

    def run(self, *args: str) -> str:
        return run_script("redis-cluster", self.env, *args, timeout_s=60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    c.run("start")
    try:
        c.run("start")          # idempotent: a running cluster is kept
        yield c
    finally:
        c.run("stop")


async def test_the_routing_story_with_every_lb_reader_on_redis_cluster(
        cluster: Cluster, kafka_bootstrap: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    assert "cluster_state: ok" in cluster.run("status")
    name = unique_name("rcluster")
    web_port = free_port()
    redis_env = {"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_WEB_PORT": str(web_port),
                 "TAILGUARD_BACKOFF_INITIAL_S": "3", "TAILGUARD_BACKOFF_MAX_S": "3"}
    env = WorkerEnv(name, kafka_bootstrap, cluster.url, redis_env)
    await env.create_topics()
    settings = settings_mod.load({k: v for k, v in env.environ().items() if k.startswith("TAILGUARD_")})
    keys = keys_for(settings)
    assert keys.tagged
    client = connect_for(settings)
    table = RoutingTable(client, keys, poll_interval_s=0.2)
    versions: list[int] = []
    worker = Worker(env.environ(), tmp_path / "worker.log")

    async def watch() -> None:
        while True:
            v = table.version(MODEL)
            if v is not None and (not versions or versions[-1] != v):
                versions.append(v)
            await asyncio.sleep(0.05)

    async with AsyncExitStack() as stack:
        stack.callback(worker.stop)
        stack.push_async_callback(client.aclose)
        feed = await stack.enter_async_context(
            Feeder(kafka_bootstrap, env.topic("latency_events"), {MODEL: list(NODES)}))
        await table.__aenter__()
        stack.push_async_callback(table.aclose)
        watcher = asyncio.create_task(watch())
        stack.callback(watcher.cancel)
        await table.get(MODEL)

        # The readers: the reference proxy in front of one echo backend per node, and HAProxy
        # kept in step by `tailguard haproxy-sync` (a subprocess, the cluster from its settings).
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        source = await stack.enter_async_context(open_routing(settings, poll_interval_s=0.2))
        proxy = Proxy(source, Balancer({n: b.url for n, b in backends.items()}, probe_share=0.0))
        proxy_port = await stack.enter_async_context(serve(proxy, "127.0.0.1", 0))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        sock, _ = await start_haproxy(stack, tmp_path, backends)
        await start_sync(stack, tmp_path, sock, cluster.url, name, env=env.environ(), model=MODEL)
        api = SocketRuntimeApi(sock, timeout_s=2.0)

        def logs() -> str:
            sync_log = (tmp_path / "sync.log").read_text(errors="replace")[-2000:]
            return f"--- haproxy-sync:\n{sync_log}\n--- worker:\n{worker.tail()}"

        async def maint() -> set[str]:
            state = parse_servers_state(await api.command("show servers state"))[BACKEND]
            return {n for n, s in state.items() if s.forced_maint}

        async def proxied(n: int) -> Counter[str]:
            got: Counter[str] = Counter()
            for _ in range(n):
                async with http.post(f"http://127.0.0.1:{proxy_port}/v1/completions",
                                     json={"model": MODEL}) as resp:
                    assert resp.status == 200, await resp.text()
                    got[resp.headers["X-Tailguard-Node"]] += 1
            return got

        async def page() -> dict[str, object]:
            async with http.get(f"http://127.0.0.1:{web_port}/tailguard/status.json") as resp:
                assert resp.status == 200, await resp.text()
                (m,) = [m for m in (await resp.json())["models"] if m["model"] == MODEL]
                return dict(m)

        def status_routed() -> dict[str, bool]:
            done = tailguard_cli(env, "status", "--json")
            assert done.returncode == 0, done.stderr
            (m,) = json.loads(done.stdout)["models"]
            return {n: n in m["routing"] for n in NODES}

        async def every_reader_routes(want: set[str], what: str) -> None:
            async def table_has() -> bool:
                return set(table.nodes(MODEL)) == want
            await wait_for(table_has, 120, f"RoutingTable: {what}", logs)

            async def proxy_has() -> bool:
                return set(await source.get(MODEL)) == want
            await wait_for(proxy_has, 10, f"the proxy's reader: {what}", logs)
            assert not set(await proxied(3 * len(want))) - want, what   # none to a node out

            async def haproxy_has() -> bool:
                return await maint() == set(NODES) - want
            await wait_for(haproxy_has, 15, f"HAProxy's MAINT servers: {what}", logs)
            assert {n for n, routed in status_routed().items() if routed} == want, what
            assert set((await page())["routing"]) == want, what     # type: ignore[call-overload]

        await every_reader_routes(set(NODES), "every node admitted")

        # A node slows down: out of routing for every reader.
        feed.slow.add(("slow", MODEL))
        await every_reader_routes(HEALTHY, "the slow node out")
        explained = tailguard_cli(env, "explain", "slow")
        assert explained.returncode == 0 and f"model '{MODEL}'" in explained.stdout, explained.stderr

        # An operator drains a healthy node, then releases it.
        done = tailguard_cli(env, "drain", "n0", "--model", MODEL, "--reason", "cluster test")
        assert done.returncode == 0, done.stderr
        await every_reader_routes(HEALTHY - {"n0"}, "n0 drained")
        assert tailguard_cli(env, "release", "n0").returncode == 0
        await every_reader_routes(HEALTHY, "n0 released")

        # The node recovers; its probes pass and every reader routes it again.
        feed.slow.discard(("slow", MODEL))
        feed.probing.add(("slow", MODEL))
        await every_reader_routes(set(NODES), "the recovered node back")
        feed.check()
        assert worker.proc.poll() is None, worker.tail()

        # One slot per model: every key the worker wrote for it, as the cluster hashes it.
        slots = {await client.execute_command("CLUSTER KEYSLOT", k) for k in keys.model_keys(MODEL)}
        assert len(slots) == 1, slots
        assert await client.exists(keys.routing(MODEL), keys.version(MODEL), keys.nodes(MODEL)) == 3
        assert MODEL.encode() in await client.smembers(keys.models)

    assert len(versions) >= 4 and versions == sorted(versions), versions
    assert "Traceback" not in (tmp_path / "sync.log").read_text(errors="replace")
