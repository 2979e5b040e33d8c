"""What the emitter needs of Kafka: the producer it drives, how one is built, which errors pass.

Owns :class:`Producer` (the part of :class:`aiokafka.AIOKafkaProducer` that
:class:`~tailguard.emitter.emitter.LatencyEmitter` uses; tests inject fakes),
:func:`aiokafka_producer` (the default one: every in-sync replica acknowledges, idempotent, the
caller's ``producer_options`` on top), :func:`retriable` (timeouts and Kafka's retriable errors:
the samples go back to the buffer; anything else drops that message only) and
:func:`stop_quietly` (a producer stopped within a timeout, its errors logged at debug).

Guarantees: aiokafka is imported only when a producer is built (the module imports its error
classes only); nothing here buffers, retries or counts — that is the emitter's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from aiokafka.errors import KafkaError, KafkaTimeoutError, RequestTimedOutError

log = logging.getLogger("tailguard.emitter")


class Producer(Protocol):
    """The part of :class:`aiokafka.AIOKafkaProducer` the emitter uses."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic: str, value: bytes | None = None,
                   key: bytes | None = None) -> asyncio.Future[Any]: ...


def aiokafka_producer(bootstrap_servers: str, request_timeout_s: float,
                      producer_options: Mapping[str, Any]) -> Producer:
    """The emitter's default producer (see the module docstring)."""
    from aiokafka import AIOKafkaProducer

    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": "tailguard-emitter",
        # A write is acknowledged once every in-sync replica has it (2 of 3 with the
        # worker's topic settings), and idempotence keeps the producer's retries from
        # duplicating or reordering it: a broker's loss loses no acknowledged event.
        "acks": "all",
        "enable_idempotence": True,
        "request_timeout_ms": int(request_timeout_s * 1000),
    }
    options.update(producer_options)
    producer: Producer = AIOKafkaProducer(**options)
    return producer


def retriable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaTimeoutError | RequestTimedOutError | asyncio.CancelledError):
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


async def stop_quietly(producer: Producer, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(producer.stop(), timeout=timeout_s)
    except (Exception, TimeoutError) as e:
        log.debug("emitter: producer stop: %r", e)
