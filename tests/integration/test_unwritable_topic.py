"""Routing never waits on Kafka, on the real stack: the worker's health-changes topic is made
unwritable (its max.message.bytes below any record's size: the broker refuses every write
with MESSAGE_TOO_LARGE) while a node turns slow. The node
leaves the Redis routing set in the usual time; once the topic takes writes again, the health
changes of that episode are published."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from worker_harness import (
    HEALTHY,
    NODES,
    Feeder,
    health_events,
    routing,
    running_worker,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]


async def set_max_message_bytes(kafka: str, topic: str, value: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                  configs={"max.message.bytes": value})])
    finally:
        await admin.close()


async def refuses(kafka: str, topic: str) -> bool:
    """Whether a write to ``topic`` is refused now (the config change has reached the broker).
    A probe written before it has stays in the topic: a JSON object of no node, which the
    checks on the health changes read past (a bare ``probe`` failed their JSON decoding)."""
    p = AIOKafkaProducer(bootstrap_servers=kafka, request_timeout_ms=5000)
    await p.start()
    try:
        await p.send_and_wait(topic, b'{"probe": "is max.message.bytes in force?"}', key=b"probe")
    except KafkaError:
        return True
    finally:
        await p.stop()
    return False


async def test_a_node_leaves_routing_while_the_health_topic_refuses_writes(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with (running_worker(kafka_bootstrap, redis_url, unique_name("unwritable"),
                               tmp_path) as (env, r, worker),
                Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES}) as feeder):
        async def all_routed() -> bool:
            return await routing(r, env.name, "llm") == set(NODES)
        await wait_for(all_routed, 60, "every node in routing", worker.tail)

        topic = env.topic("health_changes")
        await set_max_message_bytes(kafka_bootstrap, topic, "1")   # every record is larger
        await wait_for(lambda: refuses(kafka_bootstrap, topic), 30,
                       "the broker to refuse writes to the health topic", worker.tail)
        try:
            t0 = time.monotonic()
            feeder.slow.add(("slow", "llm"))

            async def slow_out() -> bool:
                return await routing(r, env.name, "llm") == HEALTHY
            # The usual time with a writable topic is ~5 s (1-s ticks, 2 windows to confirm).
            await wait_for(slow_out, 30, "the slow node out of Redis routing while the health "
                           "topic refuses writes", worker.tail)
            out_s = time.monotonic() - t0
            early = [e for e in await health_events(kafka_bootstrap, env)
                     if e.get("node_id") == "slow"
                     and e.get("to") in ("suspect", "unhealthy", "quarantined")]
            assert not early, f"the topic was writable after all: {early}"
        finally:
            await set_max_message_bytes(kafka_bootstrap, topic, "1048588")   # the default

        async def published() -> list[dict[str, object]]:
            return [e for e in await health_events(kafka_bootstrap, env)
                    if e.get("node_id") == "slow" and e.get("to") in ("unhealthy", "quarantined")]
        got = await wait_for(published, 60, "the slow node's health changes published once "
                             "the topic takes writes", worker.tail)
        assert {e["to"] for e in got} >= {"unhealthy"}, got
        print(json.dumps({"out_of_routing_s": round(out_s, 1), "published": len(got)}))
