"""Fixtures of the integration tests that talk to the real Kafka directly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


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
