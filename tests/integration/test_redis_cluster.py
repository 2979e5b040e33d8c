"""The routing story on a real Redis Cluster of 3 primaries, with every load-balancer reader.

``scripts/redis-cluster`` runs the cluster beside the shared stack. The worker (a subprocess,
real Kafka) and every reader reach Redis only as a cluster (``TAILGUARD_REDIS_CLUSTER=true``,
so the hash-tagged key layout):

* a slow node leaves routing; :class:`~tailguard.routing.reader.RoutingTable`, the reference
  proxy (its traffic avoids the node), ``tailguard haproxy-sync`` (a real HAProxy puts the server
  in MAINT), ``tailguard status``, ``tailguard explain`` and the worker's status page all see it;
* an operator's drain (``tailguard drain``/``release``) reaches the readers the same way, and
  ``tailguard k8s-sync`` (the control plane of scripts/k8s) sets a pod's condition from the set;
* the node recovers, its probes pass, and every reader sees it back;
* the reader never sees a routing version go backward, and every key of the model sits in one
  slot (``CLUSTER KEYSLOT``).

``tailguard keys copy`` moves a single Redis's plain keys into the cluster's tagged names (readers
there see the same sets and versions, the writer continues the version), and renames them in
place on one Redis; ``tailguard keys drop`` then deletes the old names only. ACL users with the
documented minimal rules plus their cluster commands write, read and forget on the cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
from stack_scripts import ScriptCluster
from test_haproxy import BACKEND, start_haproxy, start_sync
from worker_harness import (
    HEALTHY,
    NODES,
    ROOT,
    Feeder,
    Worker,
    WorkerEnv,
    free_port,
    tailguard_cli,
    wait_for,
)

from tailguard import settings as settings_mod
from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.lb.balance import Balancer
from tailguard.lb.haproxy import SocketRuntimeApi, parse_servers_state
from tailguard.lb.proxy import Proxy, serve
from tailguard.lb.source import open_routing
from tailguard.lb.testing import echo_backend, scratch_redis, write_routing
from tailguard.routing.acl import acl_rules
from tailguard.routing.client import check_redis, connect, connect_for, keys_for
from tailguard.routing.keys import Keys
from tailguard.routing.reader import RoutingTable
from tailguard.routing.status import read_status
from tailguard.routing.writer import RoutingWriter
from tailguard.security import AccessRefused

# One cluster, on one worker: the module's tests share it (under pytest-xdist, tests/conftest.py).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420), pytest.mark.xdist_group("redis-cluster")]

MODEL = "llama-3-70b"


class Cluster(ScriptCluster):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir, (17000, 17100, 17200, 17300))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        c.run("start")          # inside: a start that times out still stops what it started
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
            async def status_has() -> bool:   # `tailguard status` too (polled as the others: a busy machine lags)
                return {n for n, routed in status_routed().items() if routed} == want
            await wait_for(status_has, 15, f"`tailguard status`: {what}", logs)
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


def verdict(model: str, routed: set[str], quarantined: dict[str, float] | None = None) -> ModelTick:
    q = quarantined or {}
    statuses = tuple(NodeStatus(node_id=n, model=model, state=HealthState.QUARANTINED if n in q
                                else HealthState.HEALTHY, routed=n in routed, since_ts=0.0,
                                reason="normal", samples=100) for n in sorted(routed | set(q)))
    return ModelTick(model=model, ts=0.0, transitions=(), routing=frozenset(routed),
                     quarantine=q, statuses=statuses)


def keys_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")} | env
    return subprocess.run([sys.executable, "-m", "tailguard.cli", "keys", *args], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=60, check=False)


MOVED = {"llm": {"a", "b", "c"}, "org:m{1}": {"x", "y"}}


async def write_plain(redis_url: str, prefix: str) -> dict[str, int]:
    """Every model of MOVED written by the worker's writer in the plain layout; their versions."""
    r = connect(redis_url)
    try:
        w = RoutingWriter(r, Keys(prefix))
        for m, nodes in MOVED.items():
            assert await w.apply(verdict(m, nodes, {"q": 1_800_000_000.0}))
            assert await w.apply(verdict(m, nodes - {"a", "x"}, {"q": 1_800_000_000.0}))
        await r.hset(Keys(prefix).overrides, '["b",null]', '{"action":"drain"}')
        return {m: w.last_results[m].version for m in MOVED}
    finally:
        await r.aclose()


async def read_tagged(client: object, prefix: str) -> dict[str, tuple[set[str], int | None]]:
    table = RoutingTable(client, Keys(prefix, tagged=True))   # type: ignore[arg-type]
    return {m: (set(await table.get(m)), table.version(m)) for m in MOVED}


async def test_keys_copy_moves_a_single_redis_into_the_cluster(
        cluster: Cluster, redis_url: str, unique_name: Callable[[str], str]) -> None:
    prefix = unique_name("rc-move")
    tagged = Keys(prefix, tagged=True)
    env = {"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": cluster.url,
           "TAILGUARD_KEY_PREFIX": prefix}
    settings = settings_mod.load(env)
    client = connect_for(settings)
    try:
        async with scratch_redis(redis_url, prefix):
            versions = await write_plain(redis_url, prefix)
            done = keys_cli(env, "copy", "--from-url", redis_url)
            assert done.returncode == 0, done.stderr
            assert "2 model(s) copied" in done.stdout and "[2/2] org:m{1}" in done.stdout, done.stdout
        # The single Redis's keys are gone now; the cluster holds the same sets and versions.
        assert await read_tagged(client, prefix) == {
            m: (nodes - {"a", "x"}, versions[m]) for m, nodes in MOVED.items()}
        (llm, org) = await read_status(client, tagged)
        assert llm.model == "llm" and llm.quarantine == {"q": 1_800_000_000.0}
        assert set(llm.nodes) == {"b", "c", "q"} and org.model == "org:m{1}"
        assert await client.hgetall(tagged.overrides) == {b'["b",null]': b'{"action":"drain"}'}
        # The worker's writer, now on the cluster, continues each model's version.
        w = RoutingWriter(client, tagged)
        assert await w.apply(verdict("llm", {"b"}))
        assert w.last_results["llm"].version == versions["llm"] + 1
    finally:
        for m in MOVED:
            await client.delete(*tagged.model_keys(m))
        for key in (tagged.models, tagged.overrides):
            await client.delete(key)
        await client.aclose()


async def test_keys_copy_renames_in_place_and_drop_deletes_only_the_old_names(
        redis_url: str, unique_name: Callable[[str], str]) -> None:
    prefix = unique_name("rc-rename")
    env = {"TAILGUARD_REDIS_URL": redis_url, "TAILGUARD_KEY_PREFIX": prefix,
           "TAILGUARD_KEY_LAYOUT": "tagged"}
    async with scratch_redis(redis_url, prefix) as r:
        versions = await write_plain(redis_url, prefix)
        done = keys_cli(env, "copy")
        assert done.returncode == 0, done.stderr
        assert await read_tagged(r, prefix) == {
            m: (nodes - {"a", "x"}, versions[m]) for m, nodes in MOVED.items()}
        same = keys_cli(env, "copy", "--from-layout", "tagged")
        assert same.returncode == 2 and "nothing to copy" in same.stderr, same.stderr
        live = keys_cli(env, "drop", "--layout", "tagged")
        assert live.returncode == 2 and "the live one" in live.stderr, live.stderr
        dropped = keys_cli(env, "drop", "--layout", "plain")
        assert dropped.returncode == 0, dropped.stderr
        plain, tagged = Keys(prefix), Keys(prefix, tagged=True)
        assert not await r.exists(*(k for m in MOVED for k in plain.model_keys(m)))
        assert await r.exists(*(tagged.routing(m) for m in MOVED)) == 2
        assert await r.smembers(plain.models) == {m.encode() for m in MOVED}


async def test_the_minimal_acl_with_its_cluster_commands_works_on_every_node(
        cluster: Cluster, unique_name: Callable[[str], str]) -> None:
    prefix = unique_name("rc-acl")
    nodes = [connect(f"redis://127.0.0.1:{cluster.port + i}/0") for i in range(3)]
    users = {role: unique_name(f"rc-{role}") for role in ("worker", "reader", "bare")}

    def settings_of(user: str) -> settings_mod.Settings:
        return settings_mod.load({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": cluster.url,
                                  "TAILGUARD_KEY_PREFIX": prefix, "TAILGUARD_REDIS_USERNAME": user,
                                  "TAILGUARD_REDIS_PASSWORD": "pw"})
    try:
        for role, user in users.items():
            rules = acl_rules(prefix, "reader" if role == "bare" else role,  # type: ignore[arg-type]
                              cluster=role != "bare")
            for n in nodes:
                await n.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules.split())
        # Without the cluster commands the cluster client cannot even map the slots.
        with pytest.raises(AccessRefused) as refused:
            await check_redis(settings_of(users["bare"]))
        assert refused.value.name == "TAILGUARD_REDIS_USERNAME"
        assert "+cluster|slots +command" in str(refused.value)
        worker_s, reader_s = settings_of(users["worker"]), settings_of(users["reader"])
        await check_redis(worker_s)
        writer_client, reader_client = connect_for(worker_s), connect_for(reader_s)
        try:
            w = RoutingWriter(writer_client, keys_for(worker_s))
            assert await w.apply(verdict("llm", {"a", "b"}))
            table = RoutingTable(reader_client, keys_for(reader_s))
            assert await table.get("llm") == {"a", "b"}
            assert [s.model for s in await read_status(reader_client, keys_for(reader_s))] == ["llm"]
            gone = ModelTick(model="llm", ts=1.0, transitions=(), routing=frozenset(), quarantine={},
                             statuses=(), forgotten=True)
            assert await w.apply(gone), w.rejected
        finally:
            await writer_client.aclose()
            await reader_client.aclose()
    finally:
        for n in nodes:
            for user in users.values():
                await n.execute_command("ACL", "DELUSER", user)
            await n.aclose()


async def test_a_single_redis_taken_for_a_cluster_is_named(redis_url: str) -> None:
    s = settings_mod.load({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": redis_url})
    with pytest.raises(AccessRefused) as refused:
        await check_redis(s)
    assert refused.value.name == "TAILGUARD_REDIS_CLUSTER"
    assert "TAILGUARD_REDIS_CLUSTER=false" in str(refused.value)


async def test_k8s_sync_follows_the_routing_set_on_the_cluster(
        cluster: Cluster, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    from k8s_harness import COND, SYNC_RULES, Admin, SyncProc, condition, control_plane, namespace, sync_env, until
    from k8s_harness import MODEL as K8S_MODEL

    prefix = unique_name("rc-k8s")
    settings = settings_mod.load({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": cluster.url,
                                  "TAILGUARD_KEY_PREFIX": prefix})
    keys = keys_for(settings)
    client = connect_for(settings)
    admin = Admin(control_plane())
    pods = ["q0", "q1", "q2"]

    async def conds(want: dict[str, str]) -> bool:
        got = await admin.pods(ns)
        return all(condition(got[p], COND) == s for p, s in want.items())
    try:
        async with namespace(admin) as ns, AsyncExitStack() as stack:
            await admin.grant(ns, "tailguard-sync", SYNC_RULES, "tailguard-k8s-sync")
            for p in pods:
                await admin.create_pod(ns, p)
            await write_routing(client, keys, K8S_MODEL, ["q0", "q2"], held_out=["q1"])
            sync = SyncProc(sync_env(control_plane(), ns, cluster.url, prefix,
                                     TAILGUARD_REDIS_CLUSTER="true"), tmp_path / "k8s-sync.log")
            stack.callback(sync.stop)
            await until(lambda: conds({"q0": "True", "q1": "False", "q2": "True"}), 60,
                        "q1's condition False, the others True", sync.log)
            await write_routing(client, keys, K8S_MODEL, pods)          # q1 back in routing
            await until(lambda: conds(dict.fromkeys(pods, "True")), 30, "q1 True again", sync.log)
            assert "Traceback" not in sync.log(), sync.log()
    finally:
        await client.delete(*keys.model_keys(K8S_MODEL), keys.models)
        await client.aclose()
        await admin.aclose()
