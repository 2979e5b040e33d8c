"""The emitter against the real broker: every recorded sample arrives, decodable, with the right key.

Uses the Kafka that ``scripts/up`` started (``kafka_bootstrap`` fails, never
skips, when it is unreachable) and a topic of its own per test (the ``topic``
fixture of tests/integration/conftest.py).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer

from tailguard.core.contract.events import Heartbeat, SampleBatch, decode
from tailguard.emitter import LatencyEmitter, SyncEmitter

pytestmark = pytest.mark.integration


Message = tuple[bytes, bytes, int]   # key, value, partition


async def consume_until(bootstrap: str, topic: str, group: str, done: Callable[[list[Message]], bool]) -> list[Message]:
    """Messages of ``topic`` from the start, until ``done(messages)`` (fails after 60 s)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: list[Message] = []
    try:
        async with asyncio.timeout(60):
            while not done(out):
                batches = await consume_batches(consumer)
                out += batches
    except TimeoutError:
        pytest.fail(f"only {len(out)} messages arrived on {topic} within 60 s")
    finally:
        await consumer.stop()
    return out


async def consume_batches(consumer: AIOKafkaConsumer) -> list[Message]:
    batches = await consumer.getmany(timeout_ms=1000)
    return [(r.key, r.value, r.partition) for records in batches.values() for r in records]


def n_samples(messages: list[Message]) -> int:
    return sum(len(ev) for _, v, _ in messages if isinstance(ev := decode(v), SampleBatch))


def samples_of(messages: list[Message]) -> dict[tuple[str, str], list[tuple[float, ...]]]:
    got: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    for key, value, _ in messages:
        ev = decode(value)
        assert key == f"{ev.node_id}|{ev.model}".encode()
        if isinstance(ev, SampleBatch):
            assert ev.rejected == 0
            for i in range(len(ev)):
                tokens = () if ev.output_tokens is None else (float(ev.output_tokens[i]),)
                got.setdefault(ev.key, []).append(
                    (float(ev.latency_us[i]), float(ev.ok[i]), float(ev.probe[i]), *tokens))
    return got


async def test_every_recorded_sample_arrives_in_batch_form_with_its_key(
        kafka_bootstrap: str, topic: str, unique_name: Callable[[str], str]) -> None:
    n = 1200
    async with LatencyEmitter(kafka_bootstrap, topic=topic, max_batch=200, linger_s=0.05) as em:
        em.heartbeat("gpu-1", "llama", hardware="A100")
        for i in range(1, n + 1):
            em.record("gpu-1", "llama", 1000 + i, hardware="A100", input_tokens=i, output_tokens=i % 50 + 1,
                      ttft_us=500.0, ok=i % 100 != 0)
            em.record("gpu-2", "embed", 100 + i, probe=i % 10 == 0)
        await em.flush()
        assert em.stats.connected
    s = em.stats
    assert (s.recorded, s.sent, s.dropped, s.buffered, s.in_flight) == (2 * n, 2 * n, 0, 0, 0)
    assert s.heartbeats_sent >= 1

    messages = await consume_until(kafka_bootstrap, topic, unique_name("group"),
                                   lambda m: n_samples(m) >= 2 * n and any(b'"heartbeat"' in v for _, v, _ in m))
    got = samples_of(messages)
    assert sorted(got) == [("gpu-1", "llama"), ("gpu-2", "embed")]
    want_llama = [(1000.0 + i, float(i % 100 != 0), 0.0, float(i % 50 + 1)) for i in range(1, n + 1)]
    want_embed = [(100.0 + i, 1.0, float(i % 10 == 0)) for i in range(1, n + 1)]
    assert sorted(got[("gpu-1", "llama")]) == want_llama
    assert sorted(got[("gpu-2", "embed")]) == want_embed
    # one partition per series (key = node_id|model), and in-order within each series and flag group
    for series in (b"gpu-1|llama", b"gpu-2|embed"):
        assert len({p for k, _, p in messages if k == series}) == 1
    heartbeats = [decode(v) for _, v, _ in messages if b'"heartbeat"' in v]
    assert heartbeats and all(isinstance(h, Heartbeat) and h.hardware == "A100" for h in heartbeats)


async def test_sync_emitter_delivers_to_the_real_broker(
        kafka_bootstrap: str, topic: str, unique_name: Callable[[str], str]) -> None:
    with SyncEmitter(kafka_bootstrap, topic=topic, max_batch=50, linger_s=0.05) as em:
        for i in range(1, 101):
            em.record("cpu-node", "tiny", float(i))
        em.flush(timeout_s=30)
    assert em.stats.sent == 100 and em.stats.dropped == 0
    messages = await consume_until(kafka_bootstrap, topic, unique_name("group"), lambda m: n_samples(m) >= 100)
    assert sorted(x[0] for x in samples_of(messages)[("cpu-node", "tiny")]) == [float(i) for i in range(1, 101)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_broker_never_blocks_record_and_bounds_memory() -> None:
    """The real aiokafka client against a port nobody listens on: buffer, drop oldest, close in time."""
    em = LatencyEmitter(f"127.0.0.1:{_closed_port()}", max_batch=10, max_buffered=100, close_timeout_s=0.5,
                        retry_backoff_s=0.05, max_retry_backoff_s=0.1)
    async with em:
        for i in range(1, 1001):
            em.record("n1", "m", i)
            if i % 100 == 0:
                await asyncio.sleep(0)         # let the flusher try to connect
        s = em.stats
        assert not s.connected
        assert (s.recorded, s.buffered, s.dropped, s.sent) == (1000, 100, 900, 0)
    s = em.stats
    assert (s.buffered, s.dropped, s.sent) == (0, 1000, 0)
