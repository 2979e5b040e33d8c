"""Dead letters: what the worker does with input it cannot use.

A :class:`DeadLetter` carries the original message *unchanged* (key, value bytes, headers)
plus why it was refused and where it came from. On the dead-letter topic
(``TAILGUARD_TOPIC_DEAD_LETTER``) its value is the original bytes, its key the original key,
and these headers (UTF-8 text) are added to the original ones: ``tailguard.reason`` (a slug:
``tailguard.core.contract.events.REASONS``, ``empty_message``, ``bad_diagnostics``),
``tailguard.error`` (what was wrong, what is allowed), ``tailguard.topic``,
``tailguard.partition`` and ``tailguard.offset`` (the source).

Guarantees: a fixed producer can re-send the dead letters as they are; the original bytes are
never re-encoded. One exception: a dead letter is at most :data:`MAX_OUT_BYTES` (key + value +
headers), within what the worker's producer and the broker's default ``max.message.bytes``
take (a refused dead letter would block ingestion forever): the parts that do not fit are cut
and ``tailguard.truncated`` says what was cut and the original sizes (``value=2999999``;
``key=…``; ``headers=…``). Why: docs/operations.md (bad input).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

HEADER_PREFIX = "tailguard."
MAX_OUT_BYTES = 512 * 1024
"""Key + value + headers of one message on the dead-letter topic, at most."""


class RecordLike(Protocol):
    """The parts of a Kafka record (aiokafka's ``ConsumerRecord``) the worker reads."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused input message, with its coordinates and the reason."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    reason: str
    error: str

    @classmethod
    def of(cls, rec: RecordLike, reason: str, error: str) -> DeadLetter:
        return cls(rec.topic, rec.partition, rec.offset, rec.key, rec.value,
                   tuple(rec.headers or ()), reason, error)

    def out_headers(self) -> list[tuple[str, bytes]]:
        """Original headers plus the ``tailguard.*`` ones (module docstring)."""
        own = [(k, v) for k, v in self.headers if not k.startswith(HEADER_PREFIX)]
        return [*own, *self._own_headers()]

    def out_record(self, max_bytes: int = MAX_OUT_BYTES,
                   ) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
        """(key, value, headers) to publish, within ``max_bytes`` (module docstring)."""
        key, value = self.key, self.value or b""
        own = [(k, v) for k, v in self.headers if not k.startswith(HEADER_PREFIX)]
        cut: list[str] = []
        quarter = max_bytes // 4
        own_size = sum(len(k.encode()) + len(v or b"") for k, v in own)
        if own_size > quarter:
            cut.append(f"headers={own_size}")
            own = []
            own_size = 0
        if key is not None and len(key) > quarter:
            cut.append(f"key={len(key)}")
            key = key[:quarter]
        ours = self._own_headers()
        room = max_bytes - (len(key) if key else 0) - own_size \
            - sum(len(k) + len(v) for k, v in ours) - 200
        if len(value) > room:
            cut.insert(0, f"value={len(value)}")
            value = value[:max(0, room)]
        if cut:
            ours.append((HEADER_PREFIX + "truncated", ",".join(cut).encode()))
        return key, value, [*own, *ours]

    def _own_headers(self) -> list[tuple[str, bytes]]:
        return [
            (HEADER_PREFIX + "reason", self.reason.encode()),
            (HEADER_PREFIX + "error", self.error.encode()[:1000]),
            (HEADER_PREFIX + "topic", self.topic.encode()),
            (HEADER_PREFIX + "partition", str(self.partition).encode()),
            (HEADER_PREFIX + "offset", str(self.offset).encode()),
        ]

    def log(self, nth: int = 1) -> None:
        """Log the ``nth`` dead letter of its reason: the 1st, 2nd, 4th, 8th, … (a flood of
        bad input does not flood the log; every one is counted and dead-lettered)."""
        if nth & (nth - 1):
            return
        log.warning("bad input at %s[%d]@%d (%s): %s — sent to the dead-letter topic%s",
                    self.topic, self.partition, self.offset, self.reason, self.error,
                    "" if nth == 1 else f" ({nth} with this reason so far; logged at powers of 2)")
