"""Stage 2's Kafka backlog (tailguard.streaming.publisher): bounded in bytes, oldest dropped
and counted, retried until acknowledged, never holding its caller past the budget."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tailguard.streaming.publisher import OVERHEAD_BYTES, Outgoing, Publisher


class FakeBroker:
    """``send`` of a producer: per topic, acknowledge, refuse, or never answer."""

    def __init__(self) -> None:
        self.mode: dict[str, str] = {}          # topic -> "ok" | "fail" | "hang"
        self.acked: list[Outgoing] = []
        self.hanging: list[tuple[Outgoing, asyncio.Future[Any]]] = []

    async def send(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        m = Outgoing(topic, key, value)
        mode = self.mode.get(topic, "ok")
        if mode == "ok":
            self.acked.append(m)
            fut.set_result(None)
        elif mode == "fail":
            fut.set_exception(RuntimeError("NotEnoughReplicas"))
        else:
            self.hanging.append((m, fut))
        return fut

    def release(self) -> None:
        for m, fut in self.hanging:
            self.acked.append(m)
            fut.set_result(None)
        self.hanging.clear()


def msg(topic: str, i: int, size: int = 100) -> Outgoing:
    return Outgoing(topic, f"k{i:02d}".encode(), bytes(size))


async def test_a_failing_topic_is_retried_and_the_others_go_out() -> None:
    b = FakeBroker()
    p = Publisher(b.send, max_bytes=1 << 20)
    b.mode["health"] = "fail"
    p.add([msg("health", 0), msg("fleet", 0), msg("health", 1)])
    assert not await p.publish(0.5)
    assert b.acked == [msg("fleet", 0)] and len(p) == 2
    b.mode["health"] = "ok"
    assert await p.publish(0.5)
    assert b.acked[1:] == [msg("health", 0), msg("health", 1)]     # in their order
    assert p.nbytes == 0 and len(p) == 0


async def test_a_topic_that_never_answers_holds_the_caller_no_longer_than_the_budget() -> None:
    b = FakeBroker()
    p = Publisher(b.send, max_bytes=1 << 20)
    b.mode["health"] = "hang"
    p.add([msg("health", 0)])
    t0 = time.monotonic()
    assert not await p.publish(0.2)
    assert time.monotonic() - t0 < 1.0
    p.add([msg("health", 1)])
    assert not await p.publish(0.2)
    # what was in flight is not sent twice; once the broker answers it is done
    assert [m for m, _ in b.hanging] == [msg("health", 0), msg("health", 1)]
    b.release()
    assert await p.publish(0.2)
    assert b.acked == [msg("health", 0), msg("health", 1)] and p.nbytes == 0


async def test_the_backlog_is_bounded_in_bytes_and_drops_the_oldest_counted() -> None:
    b = FakeBroker()
    dropped: list[tuple[str, int]] = []
    one = msg("health", 0).nbytes
    p = Publisher(b.send, max_bytes=10 * one, on_dropped=lambda t, n: dropped.append((t, n)))
    b.mode["health"] = "fail"
    p.add([msg("health", i) for i in range(8)])
    assert not await p.publish(0.1)
    p.add([msg("health", i) for i in range(8, 14)])
    assert p.nbytes <= 10 * one and len(p) == 10
    assert p.dropped == {"health": 4} and dropped == [("health", 4)]
    b.mode["health"] = "ok"
    assert await p.publish(0.5)
    assert [m.key for m in b.acked] == [f"k{i:02d}".encode() for i in range(4, 14)]
    # a large message counts by its size
    p.add([msg("health", 99, size=5 * one)])
    assert p.nbytes == 5 * one + len(b"k99") + OVERHEAD_BYTES


def test_max_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Publisher(FakeBroker().send, max_bytes=0)
