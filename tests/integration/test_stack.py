"""The local stack is real: a message goes through the broker, a value through Redis.

These are the foundation's end-to-end checks (issue 2): they use the Kafka and
Redis that ``scripts/up`` started (or whatever ``TAILGUARD_KAFKA_BOOTSTRAP`` /
``TAILGUARD_REDIS_URL`` point at), each with its own unique topic, group and
key, and they fail, never skip, when either is unreachable. The last one runs
``tailguard worker`` as a process of its own and waits until the broker
reports it as the member of its consumer group that owns its input topic.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tailguard.settings import env_names

pytestmark = pytest.mark.integration


async def test_message_round_trips_through_kafka(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic, group = unique_name("topic"), unique_name("group")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        payload = {"node_id": "gpu-node-07", "model": "m", "latency_us": 183000, "ts": 1.5}
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            meta = await producer.send_and_wait(
                topic, json.dumps(payload).encode(), key=b"gpu-node-07|m"
            )
        finally:
            await producer.stop()
        assert meta.topic == topic and meta.offset == 0

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            msg = await asyncio.wait_for(consumer.getone(), timeout=60)
            await consumer.commit()
            committed = await consumer.committed(TopicPartition(topic, 0))
        finally:
            await consumer.stop()
        assert msg.key == b"gpu-node-07|m"
        assert msg.value is not None and json.loads(msg.value) == payload
        assert committed == 1  # the group's offset is stored by the broker's coordinator
    finally:
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


async def test_value_round_trips_through_redis(
    redis_url: str, unique_name: Callable[[str], str]
) -> None:
    key = unique_name("key")
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.sadd(key, "gpu-node-01", "gpu-node-02")
            pipe.expire(key, 60)
            await pipe.execute()
        assert await client.smembers(key) == {b"gpu-node-01", b"gpu-node-02"}
        assert 0 < await client.ttl(key) <= 60
    finally:
        await client.delete(key)
        await client.aclose()
    # Another connection sees that it is gone: the value really lived in the server.
    other = aioredis.Redis.from_url(redis_url)
    try:
        assert await other.exists(key) == 0
    finally:
        await other.aclose()


def _worker_env(kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
                data_dir: Path) -> dict[str, str]:
    """A worker of its own: unique app id (= consumer group), topics, key prefix, ports, data dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
    env.update({
        "TAILGUARD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TAILGUARD_REDIS_URL": redis_url,
        "TAILGUARD_APP_ID": unique_name("app"),
        "TAILGUARD_KEY_PREFIX": unique_name("keys"),
        "TAILGUARD_TOPIC_PARTITIONS": "2",
        "TAILGUARD_METRICS_PORT": "0",
        "TAILGUARD_WEB_PORT": str(_free_port()),
        "TAILGUARD_DATA_DIR": str(data_dir),
        "TAILGUARD_TICK_INTERVAL_S": "1",
    })
    for var in env_names():
        if var.startswith("TAILGUARD_TOPIC_") and var != "TAILGUARD_TOPIC_PARTITIONS":
            env[var] = unique_name(var.removeprefix("TAILGUARD_TOPIC_").lower().replace("_", "-"))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _group_members(admin: AIOKafkaAdminClient, group: str) -> list[dict[str, object]]:
    """Members of ``group`` when the broker knows it and it is Stable; [] otherwise."""
    if group not in {g[0] for g in await admin.list_consumer_groups()}:
        return []
    for response in await admin.describe_consumer_groups([group]):
        for g in response.to_object()["groups"]:
            if g["group"] == group and g["error_code"] == 0 and g["state"] == "Stable":
                return list(g["members"])
    return []


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_worker_starts_and_joins_its_consumer_group(
    kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    env = _worker_env(kafka_bootstrap, redis_url, unique_name, tmp_path / "data")
    app_id = env["TAILGUARD_APP_ID"]
    # Two groups (app/streaming/ingest.py): faust's own, <app_id>, consumes the stage-2 input
    # (window stats); stage 1 reads latency-events in bulk as <app_id>-stage1.
    want = {app_id: env["TAILGUARD_TOPIC_WINDOW_STATS"],
            f"{app_id}-stage1": env["TAILGUARD_TOPIC_LATENCY_EVENTS"]}
    log_path = tmp_path / "worker.log"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        members: dict[str, list[dict[str, object]]] = {}
        deadline = asyncio.get_running_loop().time() + 180
        while len(members) < len(want):
            if proc.poll() is not None:
                pytest.fail(f"worker exited with {proc.returncode} before joining its groups:\n"
                            + log_path.read_text(errors="replace")[-4000:])
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail(f"worker did not join {sorted(set(want) - set(members))} within 180 s:\n"
                            + log_path.read_text(errors="replace")[-4000:])
            for group in set(want) - set(members):
                found = await _group_members(admin, group)
                if found:
                    members[group] = found
            if len(members) < len(want):
                await asyncio.sleep(0.5)
        # Each group has our one worker as its member, owning partitions of its input topic.
        for group, topic in want.items():
            assert len(members[group]) == 1, (group, members[group])
            assignment = members[group][0]["member_assignment"]
            assert isinstance(assignment, bytes) and topic.encode() in assignment, (group, topic)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        try:
            prefix = (app_id, *(env[v] for v in env if v.startswith("TAILGUARD_TOPIC_") and
                               v != "TAILGUARD_TOPIC_PARTITIONS"))
            ours = [t for t in await admin.list_topics() if t.startswith(prefix)]
            if ours:
                await admin.delete_topics(ours)
        finally:
            await admin.close()
        redis_client = aioredis.Redis.from_url(redis_url)
        try:
            keys = [k async for k in redis_client.scan_iter(match=env["TAILGUARD_KEY_PREFIX"] + ":*")]
            if keys:
                await redis_client.delete(*keys)
        finally:
            await redis_client.aclose()
