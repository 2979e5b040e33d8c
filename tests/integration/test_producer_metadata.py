"""Table writes need the producer's cached metadata: ``track_topic_metadata`` keeps it there.

faust's ``key_partition`` (how ``use_partitioner`` tables pick a changelog
partition) reads aiokafka's cached metadata without fetching it. Against the
real broker: once the producer has sent to a topic it did not know yet,
aiokafka refreshes only the topics it tracks and an untracked topic's
partitions vanish from the cache — the stage-2 tick then failed on its table
write (seen in CI). A tracked topic stays. The same drop strands a batch
already queued for an untracked topic: its leader is never looked up again and
every send behind it waits (seen in CI: dead letters queued while the first
tick tracked the changelogs). The worker tracks every topic it writes to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaTimeoutError, NotLeaderForPartitionError

from tailguard.streaming.topics import track_topic_metadata

pytestmark = pytest.mark.integration


async def _metadata_knows(producer: AIOKafkaProducer, topic: str, timeout_s: float = 30.0) -> None:
    """Refresh the producer's metadata (all topics: none tracked yet) until it has ``topic``'s
    partitions. A broker answers a metadata request from its own cache, which learns of a topic
    just created a moment after CreateTopics returns (seen as a missing topic on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        await producer.client.force_metadata_update()
        if producer.client.cluster.partitions_for_topic(topic):
            return
        assert time.monotonic() < deadline, f"{topic} not in the broker's metadata {timeout_s:.0f} s after its creation"
        await asyncio.sleep(0.1)


async def _cached_partitions_after_a_send_to_a_new_topic(
        bootstrap: str, name: Callable[[str], str], track: bool) -> set[int] | None:
    changelog, other = name("changelog"), name("other")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await admin.create_topics([NewTopic(changelog, num_partitions=3, replication_factor=1)])
        await _metadata_knows(producer, changelog)
        assert producer.client.cluster.partitions_for_topic(changelog) == {0, 1, 2}
        if track:
            await track_topic_metadata(producer, [changelog])
        await admin.create_topics([NewTopic(other, num_partitions=1, replication_factor=1)])
        await producer.send_and_wait(other, b"x")          # unknown when sent: now tracked
        await producer.client.force_metadata_update()
        got = producer.client.cluster.partitions_for_topic(changelog)
        await admin.delete_topics([changelog, other])
        return None if got is None else set(got)
    finally:
        await producer.stop()
        await admin.close()


async def test_untracked_topic_drops_out_of_the_producer_metadata(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    # The control: what made the tick's table write raise.
    assert await _cached_partitions_after_a_send_to_a_new_topic(
        kafka_bootstrap, unique_name, track=False) is None


async def test_tracked_topic_stays_in_the_producer_metadata(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    assert await _cached_partitions_after_a_send_to_a_new_topic(
        kafka_bootstrap, unique_name, track=True) == {0, 1, 2}


async def _queued_send_delivered(bootstrap: str, name: Callable[[str], str],
                                 track_first: bool) -> bool:
    out, changelog = name("out"), name("changelog")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    # The batch lingers 1 s, long enough for the metadata refresh below to land first;
    # a stranded batch expires after the request timeout.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1000,
                                request_timeout_ms=4000)
    try:
        await admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1)
                                   for t in (out, changelog)])
        await producer.start()
        await _metadata_knows(producer, out)             # all topics: `out` known, untracked
        assert out in producer.client.cluster.topics()
        if track_first:
            await track_topic_metadata(producer, [out])
        queued = await producer.send(out, b"x", partition=0)
        await track_topic_metadata(producer, [changelog])  # what the first tick did
        try:
            await queued
            return True
        except (KafkaTimeoutError, NotLeaderForPartitionError):  # expired, leader never found
            return False
    finally:
        await producer.stop()
        await admin.delete_topics([out, changelog])
        await admin.close()


async def test_batch_for_an_untracked_topic_is_stranded(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    # The control: what stalled the dead letters.
    assert not await _queued_send_delivered(kafka_bootstrap, unique_name, track_first=False)


async def test_batch_for_a_tracked_topic_is_delivered(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    assert await _queued_send_delivered(kafka_bootstrap, unique_name, track_first=True)
