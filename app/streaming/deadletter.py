"""Dead letters: what the worker does with input it cannot use.

A :class:`DeadLetter` carries the original message *unchanged* (key, value
bytes, headers) plus why it was refused and where it came from. On the
dead-letter topic (``TAILGUARD_TOPIC_DEAD_LETTER``) the message value is the
original bytes, its key the original key, and these headers are added to the
original ones (values UTF-8 text):

======================  =====================================================
``tailguard.reason``    machine slug (``app.core.events.REASONS`` or
                        ``empty_message``/``bad_diagnostics``)
``tailguard.error``     the human message (what was wrong, what is allowed)
``tailguard.topic``     source topic
``tailguard.partition`` source partition
``tailguard.offset``    source offset
======================  =====================================================

So a fixed producer can re-send the dead letters as they are, and nothing is
lost: the original bytes are never re-encoded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

HEADER_PREFIX = "tailguard."


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
        return [
            *own,
            (HEADER_PREFIX + "reason", self.reason.encode()),
            (HEADER_PREFIX + "error", self.error.encode()[:1000]),
            (HEADER_PREFIX + "topic", self.topic.encode()),
            (HEADER_PREFIX + "partition", str(self.partition).encode()),
            (HEADER_PREFIX + "offset", str(self.offset).encode()),
        ]

    def log(self) -> None:
        log.warning("bad input at %s[%d]@%d (%s): %s — sent to the dead-letter topic",
                    self.topic, self.partition, self.offset, self.reason, self.error)
