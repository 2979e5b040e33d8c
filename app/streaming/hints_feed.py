"""Stage 2's hints as every worker's stage 1 reads them: the hints table's changelog, followed.

The hints (``judge_since``, ``out_of_fit``, ``tail_ref``, the model's ``signal``:
:func:`tailguard.streaming.hints.encode_hints`) are written by each model's stage-2 owner to
a faust GlobalTable. Faust does not deliver that table's writes to the other workers reliably
(seen with 2 workers: one worker's table never held a model the other wrote, for minutes;
robinhood/faust#541, #716), and a worker without the model's ``signal`` judges its share on a
signal of its own. :class:`HintsFeed` reads the changelog topic itself — its own consumer, no
group, every partition from the start — and keeps each key's newest value (a tombstone
deletes it).

Guarantees: once the feed has read the topic to its end offsets at the start,
:meth:`HintsFeed.items` is the changelog's newest value of every model (it holds every owner's
writes in order) but those this worker's stage 2 writes (its own table's: they are there before
they come back from the broker); before, the table overlaid with what was read. A record that
does not decode is counted by reason (``on_bad``: ``tailguard_bad_hints_total``), logged once
per key and, when nothing of it can be used, skipped (the key keeps its previous value); it
never stops the feed, nor does a Kafka error (:meth:`HintsFeed.follow`). The consumer stops
with the service.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from mode import Service

from tailguard.security import kafka_client_options
from tailguard.settings import Settings
from tailguard.streaming.hints import WHOLLY_BAD, StageHints, decode_hints

log = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0     # the pause after a Kafka error, doubled each time up to RETRY_MAX_S
RETRY_MAX_S = 30.0

class HintsFeed(Service):
    """Follows ``topic`` (the hints table's changelog) into :attr:`values`."""

    def __init__(self, *, settings: Settings, topic: str, partitions: int,
                 on_bad: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        """``on_bad``: told the reason (``tailguard.streaming.hints.BAD_HINT_REASONS``) of every
        record, or part of one, that does not decode."""
        super().__init__(**kwargs)
        self.settings = settings
        self.topic = topic
        self.partitions = partitions
        self.values: dict[bytes, Any] = {}
        self.caught_up = False            # read to the end offsets seen at the start
        self.bad = 0                      # changelog values that did not decode
        self.on_bad = on_bad
        self._bad_keys: set[bytes] = set()
        self._consumer: AIOKafkaConsumer | None = None

    def items(self, table: Iterable[tuple[Any, Any]], own: Collection[str] = ()) -> list[tuple[Any, Any]]:
        """Every model's hints: the changelog's once the feed has read it to where it ended at
        the start, except the models of ``own`` (this worker's stage 2 writes them: its
        ``table`` has them before they come back from the broker); until then ``table``'s
        ``(key, value)`` pairs overlaid with what was read."""
        rows = [(k if isinstance(k, bytes) else str(k).encode(), v) for k, v in table]
        if self.caught_up:
            mine = {m.encode() for m in own}
            merged = dict(self.values)
            merged.update((k, v) for k, v in rows if k in mine)
        else:
            merged = dict(rows)
            merged.update(self.values)
        return list(merged.items())

    def apply(self, key: bytes | None, raw: bytes | None) -> None:
        """One changelog record: the key's newest value (``None``: deleted)."""
        if key is None:
            return
        if raw is None:
            self.values.pop(key, None)
            return
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            self._bad(key, ["not_json"], f"not JSON ({e})")
            return
        reasons: list[str] = []
        decode_hints([(key, value)], reasons.append)     # what stage 1 will make of it
        if reasons:
            self._bad(key, reasons, "partly or wholly unreadable (" + ", ".join(reasons) + ")")
        if not WHOLLY_BAD.intersection(reasons):
            self.values[key] = value

    def _bad(self, key: bytes, reasons: list[str], what: str) -> None:
        self.bad += 1
        for reason in reasons:
            if self.on_bad is not None:
                self.on_bad(reason)
        if key not in self._bad_keys:
            self._bad_keys.add(key)
            log.warning("a hints value of model %r on %s is %s: counted in tailguard_bad_hints_total, "
                        "what is unreadable is skipped; stage 1 keeps the model's previous hints for it",
                        key.decode(errors="replace"), self.topic, what)

    async def on_start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap, group_id=None, enable_auto_commit=False,
            client_id=f"{self.settings.app_id}-hints", auto_offset_reset="earliest",
            **kafka_client_options(self.settings))
        await self._consumer.start()

    async def on_stop(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            await c.stop()

    @Service.task
    async def _follow(self) -> None:
        await self.follow()

    async def follow(self) -> None:
        """Read the changelog until the service stops. A Kafka error (the broker unreachable
        for a while, a leader moving) is logged and the reading starts over after a pause
        (1 s, doubling to 30 s); the hints read so far stay in use meanwhile."""
        delay_s = RETRY_FIRST_S
        while not self.should_stop:
            try:
                await self._read()
            except KafkaError as e:
                log.warning("stage 1 cannot read stage 2's hints on %s (%s: %s); keeping the hints it "
                            "has and reading again in %.0f s", self.topic, type(e).__name__, e, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RETRY_MAX_S)

    async def _read(self) -> None:
        c = self._consumer
        assert c is not None
        while self.topic not in await c.topics():       # faust creates the topic at its start
            if self.should_stop:
                return
            await asyncio.sleep(1.0)
        parts = range(self.partitions)
        tps = [TopicPartition(self.topic, p) for p in parts]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        log.info("stage 1 follows stage 2's hints on %s (%d partitions)", self.topic, self.partitions)
        while not self.should_stop:
            batches = await c.getmany(timeout_ms=500)
            for recs in batches.values():
                for r in recs:
                    self.apply(r.key, r.value)
            if not self.caught_up:
                self.caught_up = all([await c.position(tp) >= ends[tp] for tp in tps])


def feed_for(settings: Settings, table: Any, own: Callable[[], Collection[str]],
             on_bad: Callable[[str], None] | None = None) -> tuple[type[HintsFeed], Callable[[], StageHints]]:
    """The worker's wiring: a :class:`HintsFeed` class for ``app.service`` that follows the
    changelog of ``table`` (the faust hints table), and stage 1's hints from it (from the
    table alone until the service runs); ``own``: the models this worker's stage 2 writes;
    ``on_bad``: see :class:`HintsFeed`."""
    feeds: list[HintsFeed] = []

    class _Hints(HintsFeed):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(settings=settings, topic=table.changelog_topic.get_topic_name(),
                             partitions=settings.topic_partitions, on_bad=on_bad, **kwargs)
            feeds.append(self)

    def hints() -> StageHints:
        rows = list(table.items())
        return decode_hints(feeds[-1].items(rows, own()) if feeds else rows)
    return _Hints, hints
