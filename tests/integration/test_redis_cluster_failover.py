"""A Redis Cluster failover in the middle of routing writes, on real Redis servers.

``scripts/redis-cluster`` with ``TAILGUARD_REDIS_CLUSTER_REPLICAS=1`` runs its own cluster of 3
primaries and 3 replicas on spare ports (not the one of test_redis_cluster.py). The worker, a
:class:`~tailguard.routing.reader.RoutingTable` and the proxy's reader reach Redis only as a
cluster. The primary that holds one model's slot is killed with SIGKILL while both models (their
slots on different primaries) are written every tick:

* its replica is promoted; the worker and both readers follow it (no restart, same clients);
* the readers never see a routing version go backward;
* both models are written again within 2 ticks of the promotion;
* a node that slows down after the failover leaves the routing set the readers see, and
  ``tailguard status`` (a new client, from a surviving node) shows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from stack_scripts import ScriptCluster
from worker_harness import (
    HEALTHY,
    NODES,
    Feeder,
    VersionWatch,
    Worker,
    WorkerEnv,
    last_written_ts,
    tailguard_cli,
    wait_for,
    writes_resume_after_failover,
)

from tailguard import settings as settings_mod
from tailguard.lb.source import open_routing
from tailguard.routing.client import connect_for, keys_for
from tailguard.routing.reader import RoutingTable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TICK_S = 1.0
NODE_COUNT = 6      # 3 primaries, 3 replicas


class ReplicatedCluster(ScriptCluster):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir, (17400, 17500, 17600, 17700), replicas=1)

    async def primary_of(self, slot: int, ask: int) -> int:
        """The port of the primary serving ``slot``, as node ``ask`` sees the cluster now."""
        r = aioredis.Redis(host="127.0.0.1", port=ask)
        try:
            for start, end, primary, *_ in await r.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(primary[1])
            raise AssertionError(f"slot {slot} is served by no primary (node {ask})")
        finally:
            await r.aclose()


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedCluster]:
    c = ReplicatedCluster(tmp_path_factory.mktemp("redis-cluster-ha"))
    try:
        c.run("start")          # inside: a start that times out still stops what it started
        yield c
    finally:
        c.run("stop")


async def test_a_cluster_failover_keeps_versions_monotonic_and_writes_going(
        replicated: ReplicatedCluster, kafka_bootstrap: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    status = replicated.run("status")
    assert "cluster_state: ok" in status and status.count(" up") == NODE_COUNT, status
    name = unique_name("rcfail")
    env = WorkerEnv(name, kafka_bootstrap, f"redis://127.0.0.1:{replicated.port}/0",
                    {"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_TICK_INTERVAL_S": str(TICK_S)})
    await env.create_topics()
    settings = settings_mod.load({k: v for k, v in env.environ().items() if k.startswith("TAILGUARD_")})
    keys = keys_for(settings)
    client = connect_for(settings)
    # Two models whose slots sit on different primaries: one loses its primary, one does not.
    slot_of = {m: int(await client.execute_command("CLUSTER KEYSLOT", keys.routing(m)))
               for m in ("llm", "emb", "chat", "code", "vision", "audio")}
    primary_of = {m: await replicated.primary_of(s, replicated.port) for m, s in slot_of.items()}
    victim = "llm"
    other = next(m for m in slot_of if primary_of[m] != primary_of[victim])
    models = (victim, other)
    table = RoutingTable(client, keys, poll_interval_s=0.1)
    worker = Worker(env.environ(), tmp_path / "worker.log")

    async def written_ts(m: str) -> float:
        """0 while this client has not found the new primary yet."""
        try:
            return await last_written_ts(client, keys.nodes(m))
        except RedisError:
            return 0.0

    async with AsyncExitStack() as stack:
        stack.callback(worker.stop)
        stack.push_async_callback(client.aclose)
        feed = await stack.enter_async_context(
            Feeder(kafka_bootstrap, env.topic("latency_events"), {m: list(NODES) for m in models}))
        source = await stack.enter_async_context(open_routing(settings, poll_interval_s=0.1))
        await table.__aenter__()
        stack.push_async_callback(table.aclose)
        watch = await stack.enter_async_context(VersionWatch(table, models))
        for m in models:
            await table.get(m)

        async def all_in() -> bool:
            return all(set(table.nodes(m)) == set(NODES) for m in models)
        await wait_for(all_in, 90, "both models fully routed, read from the cluster", worker.tail)

        old = primary_of[victim]
        survivor = next(p for p in replicated.ports if p != old)
        os.kill(replicated.pid(old), signal.SIGKILL)
        killed_s = time.time()

        async def promoted() -> bool:
            try:
                return await replicated.primary_of(slot_of[victim], survivor) != old
            except AssertionError:
                return False
        await writes_resume_after_failover(promoted, written_ts, models, TICK_S, killed_s, worker.tail)

        feed.slow.add(("slow", victim))

        async def slow_out() -> bool:
            return set(table.nodes(victim)) == HEALTHY and set(await source.get(victim)) == HEALTHY
        await wait_for(slow_out, 90, "the slow node out of the routing set both readers see",
                       worker.tail)
        from_survivor = WorkerEnv(name, kafka_bootstrap, f"redis://127.0.0.1:{survivor}/0", env.extra)
        done = await asyncio.to_thread(tailguard_cli, from_survivor, "status", "--json")
        assert done.returncode == 0, done.stderr
        routed = {m["model"]: set(m["routing"]) for m in json.loads(done.stdout)["models"]}
        assert routed[victim] == HEALTHY and routed[other] == set(NODES), routed
        assert worker.proc.poll() is None, worker.tail()
    for m in models:
        assert watch.seen[m] == sorted(watch.seen[m]), (m, watch.seen[m])
    assert len(watch.seen[victim]) >= 2, watch.seen
