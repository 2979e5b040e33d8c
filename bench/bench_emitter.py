"""Benchmark of the emitter SDK: the request-path cost and what batching saves on the wire.

Run: ``python -m bench.bench_emitter [--quick] [--kafka BOOTSTRAP]``. CPU time
(``time.process_time``) for the single-threaded parts, best of several
repeats, each against the alternative an inference server would otherwise
write: one single-form JSON event per request, sent with its own
``producer.send``. With ``--kafka`` it also pushes samples through the real
broker (a throw-away topic) both ways and reports wall-clock throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import uuid
from typing import Any

import orjson

from bench import timing
from bench.timing import best
from tailguard.emitter import LatencyEmitter, SyncEmitter


def row(label: str, value: str, note: str = "") -> None:
    timing.row(label, value, note, width=56)


class NullProducer:
    """Acknowledges everything at once and keeps nothing."""

    bytes_sent = 0
    messages = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> asyncio.Future[Any]:
        self.messages += 1
        self.bytes_sent += len(value or b"") + len(key or b"")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def single_event(i: int) -> bytes:
    return orjson.dumps({"node_id": "gpu-node-07", "model": "llama-3-70b", "latency_us": 180_000 + i,
                         "ts": 1_764_680_000.0 + i * 1e-3, "hardware": "A100", "input_tokens": 800,
                         "output_tokens": 200, "ttft_us": 40_000.0})


def bench_request_path(n: int) -> None:
    print(f"request path: {n} requests, CPU µs per request (lower is better)")
    em = LatencyEmitter("bench:9092", max_buffered=n + 1, producer_factory=NullProducer)

    def emitter_record() -> None:
        for i in range(n):
            em.record("gpu-node-07", "llama-3-70b", 180_000 + i, hardware="A100", input_tokens=800,
                      output_tokens=200, ttft_us=40_000.0)
        em._buffer.clear()

    def encode_only() -> None:
        for i in range(n):
            single_event(i)

    t_em = best(emitter_record)
    t_enc = best(encode_only)
    row("LatencyEmitter.record() (validate, lock, buffer)", f"{t_em / n * 1e6:.2f} µs")
    row("reference: orjson-encode one single-form event", f"{t_enc / n * 1e6:.2f} µs",
        f"record() = {t_em / t_enc:.1f}x one encode")


async def _through_emitter(n: int) -> tuple[NullProducer, float]:
    producer = NullProducer()
    em = LatencyEmitter("bench:9092", max_buffered=n + 1, producer_factory=lambda: producer)
    t0 = time.process_time()
    async with em:
        for i in range(n):
            em.record("gpu-node-07", "llama-3-70b", 180_000 + i, hardware="A100", input_tokens=800,
                      output_tokens=200, ttft_us=40_000.0)
            if i % 1000 == 0:
                await asyncio.sleep(0)
    return producer, time.process_time() - t0


def bench_end_to_end(n: int) -> None:
    print(f"record → batch → encode → send (fake producer), {n} samples")
    producer, cpu_s = asyncio.run(_through_emitter(n))
    single_bytes = sum(len(single_event(i)) + len(b"gpu-node-07|llama-3-70b") for i in range(n))
    row("CPU per sample, whole pipeline", f"{cpu_s / n * 1e6:.2f} µs")
    row("Kafka messages", f"{producer.messages}", f"vs {n} single events ({n / producer.messages:.0f}x fewer)")
    row("bytes on the wire per sample (key + value)", f"{producer.bytes_sent / n:.1f} B",
        f"vs {single_bytes / n:.1f} B single form ({single_bytes / producer.bytes_sent:.1f}x less)")


def bench_threads(n_threads: int, per_thread: int) -> None:
    print(f"SyncEmitter.record() from {n_threads} threads × {per_thread} (wall clock, all threads)")
    em = SyncEmitter("bench:9092", max_buffered=n_threads * per_thread + 1, producer_factory=NullProducer,
                     linger_s=0.05).start()
    barrier = threading.Barrier(n_threads + 1)

    def work() -> None:
        barrier.wait()
        for i in range(per_thread):
            em.record("gpu-node-07", "llama-3-70b", 1000 + i)

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    em.close()
    total = n_threads * per_thread
    row("records per second, all threads together", f"{total / wall:,.0f}/s",
        f"sent {em.stats.sent}, dropped {em.stats.dropped}")


async def bench_kafka(bootstrap: str, n: int) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"tgbench-emitter-{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    try:
        print(f"real Kafka at {bootstrap}: {n} samples, wall clock until all acknowledged")
        t0, c0 = time.perf_counter(), time.process_time()
        async with LatencyEmitter(bootstrap, topic=topic, max_buffered=n + 1) as em:
            for i in range(n):
                em.record("gpu-node-07", "llama-3-70b", 180_000 + i, input_tokens=800, output_tokens=200,
                          ttft_us=40_000.0)
                if i % 1000 == 0:
                    await asyncio.sleep(0)
            await em.flush()
        t_em, c_em = time.perf_counter() - t0, time.process_time() - c0
        assert em.stats.sent == n, em.stats

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1)
        await producer.start()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            futs = [await producer.send(topic, single_event(i), key=b"gpu-node-07|llama-3-70b") for i in range(n)]
            await asyncio.gather(*futs)
        finally:
            t_naive, c_naive = time.perf_counter() - t0, time.process_time() - c0
            await producer.stop()
        row("LatencyEmitter (batch form): throughput", f"{n / t_em:,.0f}/s", f"CPU {c_em / n * 1e6:.1f} µs/sample")
        row("one single-form message per sample via aiokafka", f"{n / t_naive:,.0f}/s",
            f"CPU {c_naive / n * 1e6:.1f} µs/sample")
        row("ratio (emitter vs per-sample messages)", f"{t_naive / t_em:.1f}x faster",
            f"{c_naive / c_em:.1f}x less CPU")
    finally:
        await admin.delete_topics([topic])
        await admin.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--kafka", metavar="BOOTSTRAP", help="also measure against this broker")
    args = p.parse_args(argv)
    n = 20_000 if args.quick else 200_000
    bench_request_path(n)
    bench_end_to_end(n)
    bench_threads(8, n // 8)
    if args.kafka:
        asyncio.run(bench_kafka(args.kafka, n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
