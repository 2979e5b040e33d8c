"""Stage 2's intake: ``node-window-stats`` records → :class:`~tailguard.streaming.stage2.Stage2`.

Owns what the stage-2 agent does with each record it takes from ``node-window-stats``: decode
it (:func:`~tailguard.streaming.wire.decode_stage2`: a summary batch, a summary, a cluster
digest or a diagnostics result) and hand it to stage 2, or refuse it.

Guarantees:

* A record that does not decode (a corrupt or cut summary batch: reason ``bad_batch``; bad
  JSON, an unknown type, a tombstone …), or that stage 2 cannot take (``internal_error``),
  becomes a :class:`~tailguard.streaming.deadletter.DeadLetter` with its original bytes and
  coordinates; it is counted (``tailguard_bad_events{topic, reason}``) and logged once per
  reason per worker (the first one, with its coordinates). It never stops the stream: the
  records before and after it in the same take are handed to stage 2 as usual, in order.
* :func:`send_dead_letters` blocks until the broker took the dead letters (retrying with a
  growing pause): the agent acks the take's records only after, so none is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard.core.contract.errors import BadEvent
from tailguard.streaming.deadletter import DeadLetter, RecordLike
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage2 import Stage2
from tailguard.streaming.wire import decode_stage2

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed record's parts (:class:`~tailguard.streaming.deadletter.RecordLike`)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def of_message(cls, m: Any) -> Record:
        """From a faust ``Message`` (its headers are a list of pairs or a mapping)."""
        raw = m.headers or ()
        pairs = raw.items() if hasattr(raw, "items") else raw
        return cls(m.topic, m.partition, m.offset, m.key, m.value,
                   tuple((str(k), bytes(v or b"")) for k, v in pairs))


class Stage2Intake:
    """Decodes records into ``stage2``; counts and logs the refused ones (module docstring)."""

    def __init__(self, stage2: Stage2, metrics: WorkerMetrics) -> None:
        self.stage2, self.metrics = stage2, metrics
        self._seen: Counter[str] = Counter()

    def take(self, records: Iterable[RecordLike]) -> list[DeadLetter]:
        """Hand every good record to stage 2, in order; the dead letters of the others."""
        dead: list[DeadLetter] = []
        summaries = 0
        for rec in records:
            try:
                summaries += self.stage2.on_message(decode_stage2(rec.value))
            except BadEvent as e:
                dead.append(DeadLetter.of(rec, e.reason, str(e)))
            except Exception as e:   # stage 2 could not take a decoded message: never crash
                dead.append(DeadLetter.of(rec, "internal_error", f"{type(e).__name__}: {e}"[:300]))
        if summaries:
            self.metrics.summaries_in.inc(summaries)
        for d in dead:
            self.metrics.bad_events.labels(topic=d.topic, reason=d.reason).inc()
            self._seen[d.reason] += 1
            if self._seen[d.reason] == 1:
                d.log()
        return dead


async def send_dead_letters(send: Callable[[Sequence[DeadLetter]], Awaitable[None]],
                            dead: Sequence[DeadLetter], stopping: Callable[[], bool]) -> None:
    """``send(dead)`` until the broker takes them (backpressure, never a silent loss)."""
    delay_s = 0.5
    while True:
        try:
            await send(dead)
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if stopping():
                raise
            log.warning("cannot write %d stage-2 dead letters (%s); retrying in %.1f s",
                        len(dead), e, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 10.0)
