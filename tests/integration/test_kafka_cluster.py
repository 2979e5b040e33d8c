"""A partition leader killed on a 3-broker Kafka, against the real brokers and Redis.

``scripts/kafka start --brokers 3`` runs a second, 3-node KRaft cluster beside the shared
stack (its own ports and run directory). The worker creates its topics there with 3 replicas
and ``min.insync.replicas`` 2; the emitter sends with ``acks=all``. Broker 1 leads every
partition of ``latency-events`` and ``node-window-stats`` (replica lists ``[1, 2, 3]``), a
node slows down, and broker 1 is killed with SIGKILL once the node is suspect:

* every sample the emitter saw acknowledged is in the topic and was read by stage 1;
* each transition is published under exactly one event_id;
* the slow node leaves routing within 2 ticks of the new leaders' election.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from stack_scripts import free_base, run_script
from worker_harness import (
    WorkerEnv,
    free_port,
    health_events,
    read_topic,
    routing,
    running_worker,
    wait_for,
)

from tailguard.emitter import LatencyEmitter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

NODES = ["n0", "n1", "n2", "n3", "slow"]
TICK_S = 2.0


class Cluster:
    """The 3-node cluster of scripts/kafka, on ports free on this machine."""

    def __init__(self, run_dir: Path) -> None:
        # PLAINTEXT, controller and SASL_SSL of each of the 3 nodes (node i: + 10·i).
        base = free_base((19092, 29092, 39092, 49092),
                         lambda b: [b + off + 10 * i for i in range(3) for off in (0, 1, 2)],
                         "a 3-broker Kafka")
        self.ports = [base + 10 * i for i in range(3)]
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.env = {**os.environ, "TAILGUARD_RUN": str(run_dir), "TAILGUARD_KAFKA_BROKERS": "3",
                    "TAILGUARD_KAFKA_PORT": str(base), "TAILGUARD_KAFKA_CONTROLLER_PORT": str(base + 1),
                    "TAILGUARD_KAFKA_SASL_SSL_PORT": str(base + 2),
                    "TAILGUARD_KAFKA_BOOTSTRAP": f"127.0.0.1:{base}"}

    def run(self, *args: str) -> None:
        run_script("kafka", self.env, *args)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka3"))
    try:
        c.run("start")          # inside: a start that times out still stops the brokers it started
        yield c
    finally:
        c.run("stop")


async def _leaders(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {(d["topic"], p["partition"]): p["leader"]
                for d in await admin.describe_topics(topics) for p in d["partitions"]}
    finally:
        await admin.close()


async def _read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic``; metadata requests may still go to the dead broker: retry."""
    for _ in range(20):
        try:
            return await read_topic(bootstrap, topic, 60)
        except KafkaError:
            await asyncio.sleep(0.5)
    return await read_topic(bootstrap, topic, 60)


def _samples_in(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(r"^tailguard_samples_in_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert m, "tailguard_samples_in_total missing from the worker's /metrics"
    return float(m.group(1))


async def test_a_killed_leader_loses_no_acknowledged_event_and_the_slow_node_still_leaves(
        cluster: Cluster, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    name = unique_name("kafka3")
    env = WorkerEnv(name, cluster.bootstrap, redis_url)
    led_by_1 = [env.topic("latency_events"), env.topic("window_stats")]
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, -1, -1, replica_assignments={p: [1, 2, 3] for p in range(4)},
                                            topic_configs={"min.insync.replicas": "2"})
                                   for t in led_by_1])
    finally:
        await admin.close()
    metrics_port = free_port()
    extra = {"TAILGUARD_METRICS_PORT": str(metrics_port), "TAILGUARD_TICK_INTERVAL_S": str(TICK_S),
             "TAILGUARD_MIN_SAMPLES": "20"}
    async with running_worker(cluster.bootstrap, redis_url, name, tmp_path, extra=extra) as (_, r, worker):
        # The topics the worker created itself: 3 replicas, 2 in sync to acknowledge.
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await admin.start()
        try:
            async def described() -> Any:
                # The broker asked may learn of the worker's new topic a moment after the one that
                # created it (an empty partition list on a busy machine): ask until it knows.
                (desc,) = await admin.describe_topics([env.topic("health_changes")])
                return desc if desc["partitions"] else None
            desc = await wait_for(described, 30, "the worker's health topic in the cluster's metadata",
                                  worker.tail)
            assert {len(p["replicas"]) for p in desc["partitions"]} == {3}

            async def topic_config() -> dict[str, Any] | None:
                # Likewise its configs: a broker that does not know the topic yet answers none.
                (cfg,) = await admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, env.topic("health_changes"))])
                entries = {e[0]: e[1] for e in cfg.resources[0][4]}
                return entries if "min.insync.replicas" in entries else None
            cfg = await wait_for(topic_config, 30, "the worker's health topic's configs", worker.tail)
            assert cfg["min.insync.replicas"] == "2", cfg
        finally:
            await admin.close()
        assert set((await _leaders(cluster.bootstrap, led_by_1)).values()) == {1}

        slow = False
        async with LatencyEmitter(cluster.bootstrap, topic=env.topic("latency_events"),
                                  wire_format="json", linger_s=0.05) as em:
            async def feed() -> None:
                rng = __import__("random").Random(3)
                while True:
                    for node in NODES:
                        base = 3000.0 if slow and node == "slow" else 1000.0
                        for _ in range(10):
                            em.record(node, "llm", base * rng.lognormvariate(0, 0.15))
                    await asyncio.sleep(0.1)
            feeder = asyncio.create_task(feed())
            try:
                async def all_in() -> bool:
                    return await routing(r, name, "llm") == set(NODES)
                await wait_for(all_in, 120, "all five nodes routed", worker.tail)
                slow = True

                async def suspect() -> bool:
                    return any(e["node_id"] == "slow" and e["to"] == "suspect"
                               for e in await health_events(cluster.bootstrap, env))
                await wait_for(suspect, 60, "the slow node suspect", worker.tail)
                cluster.run("stop-node", "1")
                killed_s = time.monotonic()

                async def elected() -> bool:
                    try:     # the admin client may still pick the dead broker: ask again
                        leaders = await _leaders(f"127.0.0.1:{cluster.ports[1]}", led_by_1)
                    except KafkaError:
                        return False
                    return all(b in (2, 3) for b in leaders.values())
                await wait_for(elected, 60, "new leaders for every partition", worker.tail)
                elected_s = time.monotonic()

                async def out() -> bool:
                    return "slow" not in await routing(r, name, "llm")
                await wait_for(out, 60, "the slow node out of routing", worker.tail)
                out_s = time.monotonic()
            finally:
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
            await em.flush()
            stats = em.stats
        assert stats.dropped == 0 and stats.buffered == 0 and stats.in_flight == 0, stats
        acked = stats.sent
        assert out_s - elected_s <= 2 * TICK_S + 1.0, (
            f"the slow node left {out_s - elected_s:.1f} s after the election "
            f"({elected_s - killed_s:.1f} s after the kill)")

        # Every acknowledged sample is in the topic (read from the surviving brokers) …
        surviving = f"127.0.0.1:{cluster.ports[1]},127.0.0.1:{cluster.ports[2]}"
        stored = sum(len(json.loads(rec.value).get("samples", ()))
                     for rec in await _read_all(surviving, env.topic("latency_events"))
                     if rec.value and json.loads(rec.value).get("type") != "heartbeat")
        assert stored >= acked, (stored, acked)

        # … and stage 1 read every one of them (re-reads after a rebalance may add some).
        async def all_read() -> bool:
            return _samples_in(metrics_port) >= acked
        await wait_for(all_read, 60, f"stage 1 to have read the {acked} acknowledged samples", worker.tail)

        ids: dict[tuple[Any, ...], set[str]] = collections.defaultdict(set)
        for e in [json.loads(rec.value) for rec in await _read_all(surviving, env.topic("health_changes"))]:
            ids[(e["model"], e["node_id"], e["from"], e["to"])].add(e["event_id"])
        assert ids and all(len(v) == 1 for v in ids.values()), ids
