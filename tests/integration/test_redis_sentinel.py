"""A Redis Sentinel failover in the middle of routing writes, on real Redis servers.

``scripts/redis-sentinel`` runs a primary, a replica and 3 sentinels beside the shared stack.
The worker and a :class:`~tailguard.routing.reader.RoutingTable` reach Redis only through the
sentinels (``TAILGUARD_REDIS_SENTINELS``). The primary is killed with SIGKILL while both
models are written every tick:

* the reader never sees a routing version go backward;
* both models are written again within 2 ticks of the sentinels' promotion of the replica;
* a node that slows down after the failover leaves the routing set the readers see.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from stack_scripts import free_base, run_script
from worker_harness import (
    HEALTHY,
    NODES,
    Feeder,
    VersionWatch,
    last_written_ts,
    wait_for,
    writes_resume_after_failover,
)

from tailguard import settings as settings_mod
from tailguard.routing.client import connect_for
from tailguard.routing.reader import RoutingTable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TICK_S = 1.0
MODELS = ("llm", "emb")


class Sentinels:
    def __init__(self, run_dir: Path) -> None:
        base = free_base((16379, 17379, 18379, 19379),
                         lambda b: (b, b + 1, b + 10000, b + 10001, b + 10002),
                         "a Redis primary, replica and 3 sentinels")
        self.port = base
        self.run_dir = run_dir
        self.sentinels = ",".join(f"127.0.0.1:{base + 10000 + i}" for i in range(3))
        self.env = {**os.environ, "TAILGUARD_RUN": str(run_dir), "TAILGUARD_REDIS_HA_PORT": str(base)}

    def run(self, *args: str) -> str:
        return run_script("redis-sentinel", self.env, *args, timeout_s=60)

    def primary_pid(self) -> int:
        return int((self.run_dir / "redis-ha" / "primary.pid").read_text().strip())


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sentinels]:
    s = Sentinels(tmp_path_factory.mktemp("redis-ha"))
    try:
        s.run("start")          # inside: a start that times out still stops what it started
        yield s
    finally:
        s.run("stop")


async def _primary_port(s: Sentinels) -> int | None:
    """The primary's port as a Sentinel client finds it, None while none is usable.

    Asked the way redis-py's clients (the worker's, the readers') ask: ``SENTINEL MASTERS``, with a
    primary flagged down refused. ``GET-MASTER-ADDR-BY-NAME`` names the promoted replica before the
    sentinels switch over, while clients still find no primary at all.
    """
    hosts = [("127.0.0.1", int(h.rsplit(":", 1)[1])) for h in s.sentinels.split(",")]
    sentinel = Sentinel(hosts)
    try:
        _, port = await sentinel.discover_master("tailguard")
        return int(port)
    except MasterNotFoundError:
        return None
    finally:
        for c in sentinel.sentinels:
            await c.aclose()


async def test_a_sentinel_failover_keeps_versions_monotonic_and_writes_going(
        sentinels: Sentinels, kafka_bootstrap: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    from worker_harness import Worker, WorkerEnv

    name = unique_name("sentinel")
    redis_env = {"TAILGUARD_REDIS_SENTINELS": sentinels.sentinels,
                 "TAILGUARD_REDIS_SENTINEL_MASTER": "tailguard",
                 "TAILGUARD_TICK_INTERVAL_S": str(TICK_S)}
    env = WorkerEnv(name, kafka_bootstrap, f"redis://127.0.0.1:{sentinels.port}/0", redis_env)
    await env.create_topics()
    settings = settings_mod.load({k: v for k, v in env.environ().items() if k.startswith("TAILGUARD_")})
    client = connect_for(settings)
    table = RoutingTable(client, name, poll_interval_s=0.1)
    worker = Worker(env.environ(), tmp_path / "worker.log")

    async def written_ts(m: str) -> float:
        try:
            return await last_written_ts(client, f"{name}:nodes:{m}")
        except aioredis.ConnectionError:    # a sentinel that has not seen the primary die yet
            return 0.0

    try:
        async with Feeder(kafka_bootstrap, env.topic("latency_events"),
                          {m: list(NODES) for m in MODELS}) as feed:
            await table.__aenter__()
            watch = VersionWatch(table, MODELS)
            await watch.__aenter__()
            try:
                for m in MODELS:
                    await table.get(m)

                async def all_in() -> bool:
                    return all(set(table.nodes(m)) == set(NODES) for m in MODELS)
                await wait_for(all_in, 90, "both models fully routed, seen through the sentinels",
                               worker.tail)
                old = await _primary_port(sentinels)
                assert old is not None, "no primary before the kill"
                os.kill(sentinels.primary_pid(), signal.SIGKILL)
                killed_s = time.time()

                async def promoted() -> bool:
                    return await _primary_port(sentinels) not in (old, None)
                await writes_resume_after_failover(promoted, written_ts, MODELS, TICK_S, killed_s,
                                                   worker.tail)

                feed.slow.add(("slow", "llm"))

                async def slow_out() -> bool:
                    return set(table.nodes("llm")) == HEALTHY
                await wait_for(slow_out, 90, "the slow node out of the routing set the reader sees",
                               worker.tail)
                assert worker.proc.poll() is None, worker.tail()
            finally:
                await watch.__aexit__()
                await table.aclose()
    finally:
        worker.stop()
        await client.aclose()
    for m in MODELS:
        assert watch.seen[m] == sorted(watch.seen[m]), (m, watch.seen[m])
    assert len(watch.seen["llm"]) >= 2, watch.seen
