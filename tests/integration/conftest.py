"""Fixtures of the integration tests that talk to the real Kafka or Redis directly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tailguard.routing.client import connect


@pytest.fixture
async def topic(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> AsyncIterator[str]:
    """A 4-partition topic of the test's own, created with aiokafka's admin client, deleted afterwards."""
    name = unique_name("latency")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=4, replication_factor=1)])
        yield name
        await admin.delete_topics([name])
    finally:
        await admin.close()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A client of the shared Redis (``tailguard.routing.client.connect``)."""
    c = connect(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
async def prefix(client: aioredis.Redis, unique_name: Callable[[str], str]) -> AsyncIterator[str]:
    """A key prefix of the test's own; its keys are deleted afterwards."""
    p = unique_name("routing")
    yield p
    keys = [k async for k in client.scan_iter(match=f"{p}:*")]
    if keys:
        await client.delete(*keys)
