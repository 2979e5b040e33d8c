"""SyncEmitter: many threads record at once; nothing lost or duplicated; few cross-thread wake-ups."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tailguard.core.contract.events import SampleBatch, decode
from tailguard.emitter import EmitterStartError, SyncEmitter


class AckingProducer:
    """Acknowledges every message at once; collects them (touched only on the loop thread)."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.keys: set[bytes] = set()
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> asyncio.Future[Any]:
        assert value is not None and key is not None
        self.values.append(value)
        self.keys.add(key)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def decoded_pairs(fake: AckingProducer) -> list[tuple[str, int]]:
    out = []
    for v in fake.values:
        ev = decode(v)
        assert isinstance(ev, SampleBatch)
        out += [(ev.node_id, int(x)) for x in ev.latency_us]
    return out


def test_concurrent_record_from_many_threads_loses_and_duplicates_nothing() -> None:
    fake = AckingProducer()
    n_threads, per_thread, max_batch = 8, 2000, 100
    em = SyncEmitter("fake:9092", producer_factory=lambda: fake, max_batch=max_batch, linger_s=3600.0)
    em.start()
    loop = em._loop
    assert loop is not None
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any, **kw: Any) -> Any:
        nonlocal wakeups
        if callback == em._emitter._wake.set:
            wakeups += 1
        return original(callback, *args, **kw)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(1, per_thread + 1):
            em.record(f"node-{t}", "llama", i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    em.close()
    s = em.stats
    assert (s.recorded, s.sent, s.dropped, s.buffered, s.in_flight) == (16000, 16000, 0, 0, 0)
    pairs = decoded_pairs(fake)
    assert sorted(pairs) == sorted((f"node-{t}", i) for t in range(n_threads) for i in range(1, per_thread + 1))
    # per series, order is kept
    for t in range(n_threads):
        assert [i for n, i in pairs if n == f"node-{t}"] == list(range(1, per_thread + 1))
    assert fake.keys == {f"node-{t}|llama".encode() for t in range(n_threads)}
    # woken when a series starts or fills a batch, not once per record()
    assert 0 < wakeups <= 2 * (n_threads * per_thread // max_batch) + n_threads
    assert fake.stopped and em._thread is not None and not em._thread.is_alive()


def test_context_manager_flushes_on_exit_and_drops_later_records() -> None:
    fake = AckingProducer()
    with SyncEmitter("fake:9092", producer_factory=lambda: fake, linger_s=3600.0) as em:
        em.record("n1", "m", 5, input_tokens=10, output_tokens=3, ttft_us=2.0)
        em.heartbeat("n1", "m")
        em.flush(timeout_s=30)
        assert em.stats.sent == 1
    em.record("n1", "m", 6)
    assert em.stats.dropped == 1
    batches = [decode(v) for v in fake.values if b'"heartbeat"' not in v]  # batches: binary
    assert len(batches) == 1 and isinstance(batches[0], SampleBatch)
    assert batches[0].input_tokens is not None and float(batches[0].input_tokens[0]) == 10


def test_record_before_start_is_buffered_and_validated() -> None:
    fake = AckingProducer()
    em = SyncEmitter("fake:9092", producer_factory=lambda: fake, linger_s=3600.0)
    em.record("n1", "m", 7)
    with pytest.raises(ValueError, match="latency_us"):
        em.record("n1", "m", 0)
    em.start()
    em.close()
    assert decoded_pairs(fake) == [("n1", 7)]


def test_a_producer_factory_that_fails_makes_start_fail_loudly() -> None:
    def broken() -> Any:
        raise TypeError("AIOKafkaProducer() got an unexpected keyword argument 'lingerms'")

    em = SyncEmitter("fake:9092", producer_factory=broken)
    with pytest.raises(EmitterStartError, match="lingerms"):
        em.start()
    em.close()


def test_close_without_start_counts_buffered_samples_as_dropped() -> None:
    em = SyncEmitter("fake:9092", producer_factory=AckingProducer)
    em.record("n1", "m", 1)
    em.close()
    assert em.stats.dropped == 1 and em.stats.buffered == 0
