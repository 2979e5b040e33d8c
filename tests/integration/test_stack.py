"""The local stack is real: a message goes through the broker, a value through Redis.

These are the foundation's end-to-end checks (issue 2): they use the Kafka and
Redis that ``scripts/up`` started (or whatever ``TAILGUARD_KAFKA_BOOTSTRAP`` /
``TAILGUARD_REDIS_URL`` point at), each with its own unique topic, group and
key, and they fail, never skip, when either is unreachable.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

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
