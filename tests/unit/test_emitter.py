"""LatencyEmitter against an injected fake producer and fake clocks: no broker, no sleeps.

The waits below are bounded by ``asyncio.timeout`` only as a guard against a
hang (a failure), never as a threshold that a passing test depends on.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, TopicAuthorizationFailedError

from tailguard.core.contract.events import Heartbeat, SampleBatch, decode
from tailguard.emitter import EmitterStats, LatencyEmitter

GUARD_S = 10.0


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeProducer:
    """Records messages; acknowledges at once unless ``auto_ack`` is False."""

    def __init__(self, *, auto_ack: bool = True, fail_start: int = 0) -> None:
        self.auto_ack = auto_ack
        self.fail_start = fail_start
        self.fail_send: list[BaseException] = []        # raised by send(), one per call
        self.fail_delivery: list[BaseException] = []    # set on the returned future, one per call
        self.messages: list[tuple[str, bytes, bytes]] = []
        self.unacked: list[asyncio.Future[Any]] = []
        self.started = self.stopped = 0
        self.hang_send = False                          # send() never returns (metadata wait, broker down)
        self._changed: asyncio.Event | None = None

    @property
    def changed(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def start(self) -> None:
        self.started += 1
        if self.fail_start:
            self.fail_start -= 1
            raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def stop(self) -> None:
        self.stopped += 1

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> asyncio.Future[Any]:
        assert value is not None and key is not None
        if self.hang_send:
            self.messages.append((topic, key, b""))
            self.changed.set()
            await asyncio.Event().wait()
        if self.fail_send:
            raise self.fail_send.pop(0)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail_delivery:
            fut.set_exception(self.fail_delivery.pop(0))
        else:
            self.messages.append((topic, key, value))
            if self.auto_ack:
                fut.set_result(None)
            else:
                self.unacked.append(fut)
        self.changed.set()
        return fut

    def ack_all(self) -> None:
        for f in self.unacked:
            if not f.done():
                f.set_result(None)
        self.unacked.clear()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(GUARD_S):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    def events(self) -> list[SampleBatch | Heartbeat]:
        return [decode(v) for _, _, v in self.messages]

    def latencies(self) -> list[float]:
        return [float(x) for e in self.events() if isinstance(e, SampleBatch) for x in e.latency_us]


def make(producer: FakeProducer | Callable[[], FakeProducer], **kw: Any) -> tuple[LatencyEmitter, FakeClock]:
    mono = FakeClock(1000.0)
    factory = producer if callable(producer) and not isinstance(producer, FakeProducer) else (lambda: producer)
    kw.setdefault("linger_s", 0.25)
    kw.setdefault("retry_backoff_s", 0.0)
    em = LatencyEmitter("fake:9092", producer_factory=factory, clock=FakeClock(1_764_680_000.0),
                        monotonic=mono, **kw)
    return em, mono


async def until_idle(em: LatencyEmitter) -> None:
    """Let the flusher finish what it can do now and go to sleep."""
    async with asyncio.timeout(GUARD_S):
        await asyncio.sleep(0)
        await em._idle.wait()


def balanced(s: EmitterStats) -> bool:
    return s.recorded == s.sent + s.dropped + s.buffered + s.in_flight


async def test_full_batches_go_out_without_waiting_for_linger() -> None:
    fake = FakeProducer()
    em, _ = make(fake, max_batch=3, linger_s=1000.0)
    async with em:
        for i in range(7):
            em.record("gpu-1", "llama", 1000 + i, hardware="A100")
        await fake.wait_for(lambda: len(fake.messages) == 2)
        await until_idle(em)
        assert len(fake.messages) == 2 and em.stats.buffered == 1
        assert [t for t, _, _ in fake.messages] == ["latency-events", "latency-events"]
        assert {k for _, k, _ in fake.messages} == {b"gpu-1|llama"}
        assert fake.latencies() == [1000, 1001, 1002, 1003, 1004, 1005]
        ev = fake.events()[0]
        assert isinstance(ev, SampleBatch) and ev.hardware == "A100"
        assert list(ev.ts) == [1_764_680_000.0] * 3       # stamped with the injected clock


async def test_a_small_batch_waits_for_linger_then_goes_out() -> None:
    fake = FakeProducer()
    em, mono = make(fake, max_batch=500, linger_s=0.25)
    async with em:
        em.record("gpu-1", "llama", 5000)
        em.record("gpu-1", "llama", 6000, ts=1_764_600_000.5)
        await until_idle(em)
        assert fake.messages == []
        mono.t += 0.2499
        em._wake.set()
        await until_idle(em)
        assert fake.messages == []
        mono.t += 0.0001
        em._wake.set()
        await fake.wait_for(lambda: len(fake.messages) == 1)
        [ev] = fake.events()
        assert isinstance(ev, SampleBatch)
        assert list(ev.latency_us) == [5000, 6000] and list(ev.ts) == [1_764_680_000.0, 1_764_600_000.5]


async def test_series_are_batched_and_keyed_separately_with_tokens() -> None:
    fake = FakeProducer()
    em, _ = make(fake, max_batch=2, linger_s=1000.0, wire_format="json")
    async with em:
        em.record("n1", "llama", 9000, input_tokens=100, output_tokens=20, ttft_us=700.0)
        em.record("n1", "embed", 300)
        em.record("n1", "llama", 9500, input_tokens=120, output_tokens=25, ttft_us=800.0)
        await fake.wait_for(lambda: len(fake.messages) == 1)
        [(_, key, value)] = fake.messages
        assert key == b"n1|llama"
        assert orjson.loads(value)["samples"] == [[1_764_680_000.0, 9000, 100, 20, 700.0],
                                                  [1_764_680_000.0, 9500, 120, 25, 800.0]]
    # leaving the context flushes the lingering "embed" sample
    assert [k for _, k, _ in fake.messages] == [b"n1|llama", b"n1|embed"]


async def test_failed_and_probe_requests_arrive_flagged() -> None:
    fake = FakeProducer()
    em, _ = make(fake, max_batch=4, linger_s=1000.0)
    async with em:
        em.record("n1", "m", 10)
        em.record("n1", "m", 20, ok=False)
        em.record("n1", "m", 30, probe=True)
        em.record("n1", "m", 40)
        await fake.wait_for(lambda: len(fake.messages) == 3)
    got = sorted((float(lat), bool(ok), bool(pr)) for e in fake.events() if isinstance(e, SampleBatch)
                 for lat, ok, pr in zip(e.latency_us, e.ok, e.probe, strict=True))
    assert got == [(10, True, False), (20, False, False), (30, True, True), (40, True, False)]
    assert em.stats.sent == 4


async def test_stuck_producer_drops_the_oldest_and_never_stalls_record() -> None:
    fake = FakeProducer(auto_ack=False)
    em, _ = make(fake, max_batch=2, linger_s=0.0, max_buffered=10, max_in_flight=1, close_timeout_s=0.05)
    async with em:
        for i in range(1, 6):
            em.record("n1", "m", i)
        await fake.wait_for(lambda: len(fake.messages) == 1)   # samples 1, 2 in flight, never acked
        for _ in range(5):
            await asyncio.sleep(0)                               # the flusher waits for a free slot
        for i in range(6, 106):                                  # returns at once: the producer is stuck
            em.record("n1", "m", i)
        s = em.stats
        assert (s.recorded, s.in_flight, s.buffered, s.dropped, s.sent) == (105, 2, 10, 93, 0)
        assert balanced(s)
        fake.ack_all()
        fake.auto_ack = True
        await em.flush()
        assert fake.latencies() == [1, 2, *range(96, 106)]     # the newest survived
        s = em.stats
        assert (s.sent, s.dropped, s.buffered, s.in_flight) == (12, 93, 0, 0)
        assert balanced(s)


async def test_a_send_that_never_returns_stalls_neither_record_nor_stop() -> None:
    fake = FakeProducer()
    fake.hang_send = True
    em, _ = make(fake, max_batch=5, linger_s=0.0, max_buffered=20, close_timeout_s=0.05)
    await em.start()
    em.record("n1", "m", 1)
    await fake.wait_for(lambda: len(fake.messages) == 1)        # the flusher is stuck inside send()
    for i in range(2, 102):
        em.record("n1", "m", i)
    s = em.stats
    assert (s.recorded, s.in_flight, s.buffered, s.dropped) == (101, 1, 20, 80) and balanced(s)
    await em.stop()
    s = em.stats
    assert (s.sent, s.in_flight, s.buffered, s.dropped) == (0, 0, 0, 101) and balanced(s)
    assert fake.stopped == 1


async def test_stop_gives_up_after_its_timeout_and_counts_the_rest_as_dropped() -> None:
    fake = FakeProducer(auto_ack=False)
    em, _ = make(fake, max_batch=2, linger_s=0.0, max_in_flight=1, close_timeout_s=0.05)
    await em.start()
    for i in range(1, 8):
        em.record("n1", "m", i)
    await em.stop()
    s = em.stats
    assert s.sent == 0 and s.buffered == 0 and s.dropped + s.in_flight == 7 and balanced(s)
    assert fake.stopped == 1
    em.record("n1", "m", 99)                                     # after close: counted, not raised
    assert em.stats.dropped == s.dropped + 1


async def test_stop_flushes_everything_buffered() -> None:
    fake = FakeProducer()
    em, _ = make(fake, max_batch=100, linger_s=1000.0)
    async with em:
        for i in range(250):
            em.record(f"n{i % 3}", "m", i + 1)
    s = em.stats
    assert (s.recorded, s.sent, s.dropped, s.buffered, s.in_flight) == (250, 250, 0, 0, 0)
    assert sorted(fake.latencies()) == list(range(1, 251))
    assert fake.stopped == 1


async def test_retriable_failures_are_retried_without_loss() -> None:
    fake = FakeProducer()
    fake.fail_send = [KafkaTimeoutError()]
    fake.fail_delivery = [KafkaConnectionError("broker went away")]
    em, _ = make(fake, max_batch=2, linger_s=1000.0)
    async with em:
        for i in range(1, 5):
            em.record("n1", "m", i)
        await fake.wait_for(lambda: len(fake.latencies()) == 4)
    s = em.stats
    assert (s.sent, s.dropped, s.send_errors) == (4, 0, 2)
    assert sorted(fake.latencies()) == [1, 2, 3, 4]


async def test_non_retriable_failure_drops_that_message_only() -> None:
    fake = FakeProducer()
    fake.fail_delivery = [TopicAuthorizationFailedError()]
    em, _ = make(fake, max_batch=2, linger_s=1000.0)
    async with em:
        for i in range(1, 5):
            em.record("n1", "m", i)
    s = em.stats
    assert (s.sent, s.dropped, s.send_errors) == (2, 2, 1) and balanced(s)
    assert fake.latencies() == [3, 4]


async def test_kafka_down_at_start_buffers_and_delivers_once_it_is_up() -> None:
    fake = FakeProducer(fail_start=3)
    em, _ = make(fake, max_batch=2, linger_s=1000.0)
    for i in range(1, 4):
        em.record("n1", "m", i)                                  # before start: buffered
    async with em:
        await fake.wait_for(lambda: fake.started == 4 and len(fake.messages) >= 1)
        assert em.stats.connected
    assert fake.latencies() == [1, 2, 3] and em.stats.sent == 3


async def test_heartbeats_start_at_once_and_repeat_every_interval() -> None:
    fake = FakeProducer()
    em, mono = make(fake, heartbeat_interval_s=5.0)
    async with em:
        em.heartbeat("new-node", "llama", hardware="A10")
        await fake.wait_for(lambda: len(fake.messages) == 1)
        mono.t += 4.99
        em._wake.set()
        await until_idle(em)
        assert len(fake.messages) == 1
        mono.t += 0.01
        em._wake.set()
        await fake.wait_for(lambda: len(fake.messages) == 2)
        em.stop_heartbeat("new-node", "llama", hardware="A10")
        mono.t += 50
        em._wake.set()
        await until_idle(em)
    assert fake.events() == [Heartbeat("new-node", "llama", "A10", 1_764_680_000.0, em.instance)] * 2
    assert {k for _, k, _ in fake.messages} == {b"new-node|llama"}
    assert em.stats.heartbeats_sent == 2


async def test_a_heartbeat_announced_just_before_close_is_sent_and_a_periodic_one_is_not() -> None:
    fake = FakeProducer()
    em, mono = make(fake, heartbeat_interval_s=5.0)
    async with em:
        em.heartbeat("old", "llama")
        await fake.wait_for(lambda: len(fake.messages) == 1)
        mono.t += 10.0                      # old's next heartbeat is due, but we are closing
        em.heartbeat("new", "llama")        # announced, then closed at once
    assert [e.node_id for e in fake.events()] == ["old", "new"]
    assert em.stats.heartbeats_sent == 2


async def test_flush_sends_lingering_samples_now() -> None:
    fake = FakeProducer()
    em, _ = make(fake, linger_s=1000.0)
    async with em:
        em.record("n1", "m", 1)
        await em.flush()
        assert fake.latencies() == [1] and em.stats.sent == 1


@pytest.mark.parametrize(("kwargs", "culprit"), [
    ({"latency_us": 0}, "latency_us"),
    ({"latency_us": -3}, "latency_us"),
    ({"latency_us": math.nan}, "latency_us"),
    ({"latency_us": True}, "latency_us"),
    ({"node_id": ""}, "node_id"),
    ({"model": "x" * 300}, "model"),
    ({"ts": math.inf}, "ts"),
    ({"ttft_us": 2000.0}, "ttft_us"),
    ({"input_tokens": -1}, "input_tokens"),
    ({"output_tokens": 2.5}, "output_tokens"),
])
def test_record_rejects_programming_errors(kwargs: dict[str, Any], culprit: str) -> None:
    em, _ = make(FakeProducer())
    args: dict[str, Any] = {"node_id": "n1", "model": "m", "latency_us": 1000} | kwargs
    with pytest.raises(ValueError, match=culprit):
        em.record(args.pop("node_id"), args.pop("model"), args.pop("latency_us"), **args)
    assert em.stats.recorded == 0


@pytest.mark.parametrize(("kwargs", "culprit"), [
    ({"max_batch": 0}, "max_batch"),
    ({"max_batch": 10_000}, "max_batch"),
    ({"max_batch": 100, "max_buffered": 50}, "max_buffered"),
    ({"linger_s": -1}, "linger_s"),
    ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
    ({"max_in_flight": 0}, "max_in_flight"),
    ({"topic": ""}, "topic"),
])
def test_bad_options_fail_at_construction_naming_the_option(kwargs: dict[str, Any], culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        LatencyEmitter("127.0.0.1:9092", **kwargs)


async def test_every_message_carries_the_process_instance_and_each_emitter_has_its_own() -> None:
    fake = FakeProducer()
    em, _ = make(fake, linger_s=0.0, wire_format="json")
    other, _ = make(FakeProducer())
    assert em.instance and other.instance and em.instance != other.instance
    async with em:
        em.heartbeat("n1", "llama")
        em.record("n1", "llama", 9000, ts=1_764_680_000.0)
        await fake.wait_for(lambda: len(fake.messages) == 2)
    assert {orjson.loads(v)["instance"] for _, _, v in fake.messages} == {em.instance}
    assert {e.instance for e in fake.events()} == {em.instance}


async def test_binary_batches_carry_the_process_instance() -> None:
    fake = FakeProducer()
    em, _ = make(fake, linger_s=0.0)                 # binary batches: the default
    async with em:
        em.record("n1", "llama", 9000, ts=1_764_680_000.0)
        await fake.wait_for(lambda: len(fake.messages) == 1)
    [(_, _, value)] = fake.messages
    assert value[:3] == b"\xf5TG"
    assert [e.instance for e in fake.events()] == [em.instance]
