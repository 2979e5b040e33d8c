"""Creating the worker's Kafka topics when they are missing.

Guarantee: after :func:`ensure_topics`, every topic of ``settings.topics`` and the
changelogs of stage 2's tables (:func:`changelog_names`, compacted) exist, each new
partition with a leader (why: docs/operations.md, "Running the worker"); missing ones are
created with ``settings.topic_partitions`` partitions and ``settings.replication_factor``
replicas (0: ``min(3, brokers)``), with ``min.insync.replicas`` one below the replication
factor from 3 replicas on, so an acknowledged write survives one broker's loss
(docs/operations.md, "Production topology"). Existing topics are left as they are — the
worker works with any partition count, but the stage-2
topic (``node-window-stats``) must keep the count its state changelog was
created with, so change ``TAILGUARD_TOPIC_PARTITIONS`` only with a new
``TAILGUARD_APP_ID``. Also keeps the topics a producer writes in its metadata
(:func:`track_topic_metadata`, once per producer: :class:`MetadataTracker`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from tailguard.security import kafka_client_options
from tailguard.settings import Settings
from tailguard.streaming.errors import TopicSetupError

log = logging.getLogger(__name__)


def topic_names(settings: Settings) -> list[str]:
    return [getattr(settings.topics, f.name) for f in dataclasses.fields(settings.topics)]


# Stage 2's faust tables (tailguard.streaming.service); faust names a changelog <app id>-<table>-changelog.
TABLES = ("health", "judge_since")


def changelog_names(settings: Settings) -> list[str]:
    return [f"{settings.app_id}-{t}-changelog" for t in TABLES]


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSetup:
    created: list[str]           # the topics this call created
    replication_factor: int      # the one new topics get (the setting, or min(3, brokers))


def replication_for(settings: Settings, brokers: int) -> int:
    """The replication factor of new topics; a setting above the broker count is refused."""
    if settings.replication_factor > brokers:
        raise TopicSetupError(settings.topics.latency_events,
                              f"TAILGUARD_REPLICATION_FACTOR={settings.replication_factor} needs at "
                              f"least as many brokers, and {settings.kafka_bootstrap} has {brokers}: "
                              "lower it, or 0 for min(3, brokers)")
    return settings.replication_factor or min(3, brokers)


def topic_configs(replication_factor: int, *, compacted: bool) -> dict[str, str]:
    configs = {"cleanup.policy": "compact"} if compacted else {}
    if replication_factor >= 3:
        configs["min.insync.replicas"] = str(replication_factor - 1)
    return configs


async def ensure_topics(settings: Settings, *, timeout_s: float = 30.0) -> TopicSetup:
    """Create the missing topics; say which, and with how many replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap,
                                request_timeout_ms=int(timeout_s * 1000),
                                **kafka_client_options(settings))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except (KafkaError, OSError, TimeoutError) as e:
        why = str(e) or (f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError)
                         else type(e).__name__)
        raise TopicSetupError(settings.topics.latency_events,
                              f"cannot reach the broker at {settings.kafka_bootstrap} ({why})") from e
    try:
        existing = set(await admin.list_topics())
        brokers = max(1, len((await admin.describe_cluster()).get("brokers", [])))
        rf = replication_for(settings, brokers)
        changelogs = set(changelog_names(settings))
        missing = [t for t in dict.fromkeys([*topic_names(settings), *changelogs])
                   if t not in existing]
        if missing:
            new = [NewTopic(t, settings.topic_partitions, rf,
                            topic_configs=topic_configs(rf, compacted=t in changelogs) or None)
                   for t in missing]
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # another worker won the race
            except KafkaError as e:
                raise TopicSetupError(missing[0], f"could not be created ({e})") from e
            log.info("created topics %s with %d partitions, %d replicas", missing,
                     settings.topic_partitions, rf)
            await _leaders_elected(admin, missing, timeout_s)
        return TopicSetup(missing, rf)
    finally:
        await admin.close()


async def _leaders_elected(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until every partition of ``names`` has a leader (a fresh broker takes a moment)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        desc = await admin.describe_topics(names)
        if len(desc) == len(names) and all(
                not d.get("error_code") and d.get("partitions")
                and all(p.get("leader", -1) >= 0 for p in d["partitions"]) for d in desc):
            return
        if loop.time() > deadline:
            raise TopicSetupError(names[0], f"created, but no leader for all its partitions within "
                                            f"{timeout_s:g} s: is the broker healthy?")
        await asyncio.sleep(0.1)


async def track_topic_metadata(producer: Any, topics: Iterable[str]) -> None:
    """Keep ``topics`` in every metadata refresh of an aiokafka ``producer``; wait until known.

    aiokafka fetches metadata of all topics only while it tracks none; once it
    tracks some (a send to a topic it did not know yet adds that topic), each
    refresh fetches just those, and an untracked topic drops out of the cache
    even though the producer writes to it. Two failures followed, both seen in
    CI: faust's ``use_partitioner`` table write (``key_partition`` reads the
    cache, never fetches) raised; and a batch already queued for a dropped
    topic waited for a leader that no refresh would bring, stalling every send
    behind it. Call it with every topic the producer writes to, before sending.
    Cheap when the topics are already tracked.
    """
    for topic in topics:
        await producer.client.add_topic(topic)
        await producer.partitions_for(topic)


class MetadataTracker:
    """Keeps the written topics in the producer's metadata (:func:`track_topic_metadata`), once
    per aiokafka producer (a tracked topic stays tracked): faust may replace the producer."""

    def __init__(self, app: Any, written: list[str]) -> None:
        self.app, self.written = app, written
        self.tracked: Any = None   # the aiokafka producer already tracking ``written``

    async def __call__(self) -> None:
        faust_producer: Any = await self.app.maybe_start_producer()
        producer = faust_producer._ensure_producer()
        if self.tracked is producer:
            return
        await track_topic_metadata(producer, self.written)
        self.tracked = producer
