"""Stage 1's way past a record the Kafka client cannot decode: read around it, dead-letter it.

aiokafka's ``getmany()`` raises (:data:`UNDECODABLE`) for a whole fetch when one record batch
in it cannot be decoded (an unknown codec, a bad CRC, a header key that is not UTF-8, a
truncated record), and would raise again at every poll: the consumer would stall on it.
:func:`salvage` is what the ingestion service (:mod:`tailguard.streaming.ingest`) calls then.

Guarantees:

* Every owned partition is first rewound to what was processed (the failed call may have
  moved partitions past records it then dropped), so no good record is lost.
* Each partition is then read on its own; the one that fails is stepped through one record
  at a time up to the offset that cannot be decoded, which is returned as one dead letter
  (reason ``undecodable``, counted in ``tailguard_bad_events_total``) and skipped; the
  records before it are returned for ingestion.
* At most ``max_records`` records a partition, each fetch waiting at most
  :data:`SALVAGE_FETCH_MS`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError

from tailguard.streaming.deadletter import DeadLetter
from tailguard.streaming.metrics import WorkerMetrics

__all__ = ["SALVAGE_FETCH_MS", "UNDECODABLE", "salvage"]

log = logging.getLogger(__name__)

# How long the salvage of an undecodable record waits for one partition's fetch.
SALVAGE_FETCH_MS = 1000
# What aiokafka raises from getmany() when a fetched record batch cannot be decoded:
# an unknown codec, a bad CRC, a header key that is not UTF-8, a truncated record.
UNDECODABLE: tuple[type[BaseException], ...] = (
    UnsupportedCodecError, CorruptRecordException, UnicodeError, ValueError, struct.error,
    IndexError)


async def salvage(c: AIOKafkaConsumer, err: BaseException, next_offsets: Mapping[Any, int],
                  max_records: int, metrics: WorkerMetrics,
                  ) -> tuple[dict[Any, list[Any]], list[DeadLetter]]:
    """``getmany()`` raised ``err`` on a record it cannot decode: read around it (module
    docstring). ``next_offsets``: the next offset to process of each partition. Returns the
    records read per partition and the dead letters."""
    log.error("stage 1 cannot decode a fetched record (%s: %s); locating it",
              type(err).__name__, err)
    owned = sorted(c.assignment(), key=lambda tp: (tp.topic, tp.partition))
    for tp in owned:
        await _rewind(c, tp, next_offsets)
    batches: dict[Any, list[Any]] = {}
    dead: list[DeadLetter] = []
    for tp in owned:
        start = await c.position(tp)
        high = c.highwater(tp)
        if high is not None and start >= high:
            continue
        try:
            got = await c.getmany(tp, timeout_ms=SALVAGE_FETCH_MS, max_records=max_records)
            recs = list(got.get(tp, []))
        except UNDECODABLE:
            c.seek(tp, start)
            recs, letter = await _step_to_undecodable(c, tp, max_records)
            if letter is not None:
                dead.append(letter)
                metrics.bad_events.labels(topic=tp.topic, reason=letter.reason).inc()
        if recs:
            batches[tp] = recs
    return batches, dead


async def _rewind(c: AIOKafkaConsumer, tp: Any, next_offsets: Mapping[Any, int]) -> None:
    off = next_offsets.get(tp)
    if off is None:
        off = await c.committed(tp)
    if off is None:
        await c.seek_to_beginning(tp)
    else:
        c.seek(tp, off)


async def _step_to_undecodable(c: AIOKafkaConsumer, tp: Any, max_records: int,
                               ) -> tuple[list[Any], DeadLetter | None]:
    good: list[Any] = []
    for _ in range(max_records):
        try:
            got = (await c.getmany(tp, timeout_ms=SALVAGE_FETCH_MS, max_records=1)).get(tp, [])
        except UNDECODABLE as e:
            bad = await c.position(tp)
            c.seek(tp, bad + 1)
            return good, DeadLetter(
                tp.topic, tp.partition, bad, None, None, (), "undecodable",
                f"the Kafka client cannot decode the record at this offset"
                f" ({type(e).__name__}: {e}); skipped")
        if not got:
            break
        good.extend(got)
    return good, None
