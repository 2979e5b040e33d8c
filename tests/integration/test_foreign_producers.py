"""What other Kafka clients send, against the real broker, Redis and `tailguard worker`.

kcat (librdkafka) and the Java producer (``ConsoleProducer``, a transactional
``KafkaProducer``) write to the worker's input topic: compressed batches of
every codec, tombstones, empty and binary values, huge messages, any keys,
headers, JSON that is not an object, aborted transactions, and topics with
more partitions than the worker would create. Good events are used (they show
up in Redis ``<prefix>:nodes:<model>``), the rest is dead-lettered, and the
stream never stops.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from foreign_clients import (
    CODECS,
    event_lines,
    java_console_produce,
    java_tx_produce,
    kcat_partitions,
    kcat_produce,
    node_status,
)
from worker_harness import ROOT, WorkerEnv, read_topic, running_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIN = 50  # TAILGUARD_MIN_SAMPLES of the harness


async def _nodes_with_samples(r: Any, env: WorkerEnv, model: str, want: Iterable[str],
                              at_least: int = MIN) -> Callable[[], Awaitable[bool]]:
    want = set(want)

    async def pred() -> bool:
        st = await node_status(r, env.name, model)
        return all(n in st and (st[n].get("samples") or 0) >= at_least for n in want)
    return pred


def _kcat_lines(kafka: str, topic: str, lines: list[str], *args: str) -> None:
    kcat_produce(kafka, topic, ("\n".join(lines) + "\n").encode(), *args)


async def test_without_cramjam_snappy_lz4_zstd_batches_are_undecodable(
        kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """Why cramjam is a dependency: the batches kcat and Java send really are compressed,
    and without it aiokafka fails on them (the worker would stall) — so the worker refuses
    to start."""
    topics = {}
    now = time.time()
    for codec in CODECS:
        t = topics[codec] = unique_name(codec)
        lines = event_lines(f"kcat-{codec}", "codecs", now, 200)
        await asyncio.to_thread(_kcat_lines, kafka_bootstrap, t, lines, "-z", codec, "-p", "0")
    (tmp_path / "cramjam.py").write_text("raise ImportError('blocked by the test')\n")
    probe = textwrap.dedent(f"""
        import asyncio, json, sys
        from aiokafka import AIOKafkaConsumer
        from tailguard.streaming.ingest import missing_codecs
        print("missing", ",".join(missing_codecs()))
        async def main():
            for codec, topic in {json.dumps(topics)}.items():
                c = AIOKafkaConsumer(topic, bootstrap_servers={kafka_bootstrap!r},
                                     auto_offset_reset="earliest")
                await c.start()
                try:
                    got = await c.getmany(timeout_ms=5000)
                    print(codec, "ok", sum(map(len, got.values())))
                except Exception as e:
                    print(codec, type(e).__name__)
                finally:
                    await c.stop()
        asyncio.run(main())
    """)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == [
        "missing snappy,lz4,zstd", "gzip ok 200", "snappy UnsupportedCodecError",
        "lz4 UnsupportedCodecError", "zstd UnsupportedCodecError", ""], out.stdout + out.stderr
    worker = subprocess.run([sys.executable, "-m", "tailguard.cli", "worker"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode == 1, worker.stderr
    assert "cannot decompress snappy/lz4/zstd" in worker.stderr and "cramjam" in worker.stderr


async def test_compressed_events_from_kcat_and_the_java_producer_are_used(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with running_worker(kafka_bootstrap, redis_url, unique_name("codec"),
                              tmp_path) as (env, r, worker):
        topic = env.topic("latency_events")
        nodes = [f"{client}-{codec}" for client in ("kcat", "java") for codec in CODECS]
        used = await _nodes_with_samples(r, env, "codecs", nodes, at_least=150)

        async def produce_round() -> None:
            now = time.time()
            jobs = []
            for codec in CODECS:
                kl = [f"kcat-{codec}|codecs\t{v}" for v in event_lines(f"kcat-{codec}", "codecs",
                                                                      now, 200)]
                jobs.append(asyncio.to_thread(_kcat_lines, kafka_bootstrap, topic, kl, "-K", "\t",
                                              "-z", codec))
                jl = [(f"java-{codec}|codecs", v) for v in event_lines(f"java-{codec}", "codecs",
                                                                      now, 200)]
                jobs.append(asyncio.to_thread(java_console_produce, kafka_bootstrap, topic, jl,
                                              codec))
            await asyncio.gather(*jobs)

        await produce_round()
        await wait_for(used, 60, f"{nodes} in Redis with 150+ samples each", worker.tail)
        assert not await read_topic(kafka_bootstrap, env.topic("dead_letter"))
        assert "cannot decode" not in worker.log() and "poll failed" not in worker.log()
        assert worker.proc.poll() is None, worker.tail()


async def test_odd_messages_are_dead_lettered_and_good_ones_around_them_used(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with running_worker(kafka_bootstrap, redis_url, unique_name("odd"),
                              tmp_path) as (env, r, worker):
        topic = env.topic("latency_events")
        k = kafka_bootstrap
        now = time.time()
        good = {n: event_lines(n, "odd", now, 60) for n in
                ("before", "nokey", "binkey", "emptykey", "headers", "after")}
        big = json.dumps({"node_id": "big", "model": "odd", "hardware": "A100",
                          "samples": [[now, 1000.0 + i % 50] for i in range(30_000)]})
        assert 500_000 < len(big) < 1_000_000
        huge_junk = b"x" * 990_000
        huge_gzip = b"y" * 3_000_000

        def produce() -> None:
            p0 = ("-p", "0")
            # Everything on partition 0, in this order: the odd ones sit between good events.
            _kcat_lines(k, topic, [f"before|odd\t{v}" for v in good["before"]], "-K", "\t", *p0)
            kcat_produce(k, topic, b"n0|odd:\n", "-K", ":", "-Z", *p0)               # tombstone
            kcat_produce(k, topic, b"n0|odd:\n", "-K", ":", *p0)                     # empty value
            kcat_produce(k, topic, b"n0|odd:\xff\xfe\x00\x80 not utf-8\n", "-K", ":", *p0)
            kcat_produce(k, topic, b"[1, 2, 3]\n42\n\"a string\"\nnull\ntrue\n", *p0)
            kcat_produce(k, topic, huge_junk + b"\n", *p0)
            kcat_produce(k, topic, huge_gzip + b"\n", "-z", "gzip", "-X",
                         "message.max.bytes=4000000", *p0)
            kcat_produce(k, topic, b"\xff\x00\x01binkey\t" + big.encode() + b"\n", "-K", "\t", *p0)
            _kcat_lines(k, topic, good["nokey"], *p0)                               # no key
            kcat_produce(k, topic, b"".join(b"\xff\x00\x01\t" + v.encode() + b"\n"
                                            for v in good["binkey"]), "-K", "\t", *p0)
            _kcat_lines(k, topic, [f"\t{v}" for v in good["emptykey"]], "-K", "\t", *p0)
            _kcat_lines(k, topic, good["headers"], "-H", "trace-id=abc", "-H", "no-value",
                        "-H", "bin=\u00e9", *p0)
            _kcat_lines(k, topic, ['{"not": "an event"}'], "-H", "trace-id=keep-me", *p0)
            # A header name aiokafka cannot decode (not UTF-8): the record is skipped, not a stall.
            kcat_produce(k, topic, good["headers"][0].encode() + b"\n", "-H",
                         b"\xff\xfe=v".decode("utf-8", "surrogateescape"), *p0)
            _kcat_lines(k, topic, [f"after|odd\t{v}" for v in good["after"]], "-K", "\t", *p0)

        await asyncio.to_thread(produce)
        expect = {"empty_message": 2, "bad_json": 3, "not_object": 5, "missing_field": 1,
                  "undecodable": 1}
        n_dead = sum(expect.values())

        async def all_dead() -> list[Any]:
            recs = await read_topic(k, env.topic("dead_letter"))
            return recs if len(recs) >= n_dead else []
        dead = await wait_for(all_dead, 60, f"{n_dead} dead letters", worker.tail)
        used = await _nodes_with_samples(r, env, "odd", [*good, "big"])
        await wait_for(used, 30, "every good event's node in Redis", worker.tail)
        st = await node_status(r, env.name, "odd")
        assert st["big"]["samples"] == 1000  # window_size: the 30,000-sample batch was used
        assert st["headers"]["samples"] == 60  # the one behind the undecodable header is lost

        h = [dict(rec.headers) for rec in dead]
        reasons = [x["tailguard.reason"].decode() for x in h]
        assert {x: reasons.count(x) for x in set(reasons)} == expect, reasons
        by_reason = {x["tailguard.reason"].decode(): (rec, x) for rec, x in zip(dead, h, strict=True)}
        assert all(x["tailguard.topic"].decode() == topic and x["tailguard.partition"] == b"0"
                   for x in h)
        offsets = [int(x["tailguard.offset"]) for x in h]
        assert len(set(offsets)) == n_dead
        # Original key and value are kept; huge ones are cut to fit the dead-letter topic.
        rec, x = by_reason["missing_field"]
        assert rec.value == b'{"not": "an event"}' and x["trace-id"] == b"keep-me"
        junk = [(rec, x) for rec, x in zip(dead, h, strict=True) if "tailguard.truncated" in x]
        assert sorted(x["tailguard.truncated"] for _, x in junk) == [b"value=3000000",
                                                                     b"value=990000"]
        assert all(400_000 < len(rec.value) <= 512 * 1024 for rec, _ in junk)
        tombs = [rec for rec, x in zip(dead, h, strict=True)
                 if x["tailguard.reason"] == b"empty_message"]
        assert [t.key for t in tombs] == [b"n0|odd", b"n0|odd"]
        rec, x = by_reason["undecodable"]
        assert rec.key is None and not rec.value and b"UnicodeDecodeError" in x["tailguard.error"]
        bad_utf8 = [rec for rec in dead if rec.value.startswith(b"\xff\xfe")]
        assert [b.key for b in bad_utf8] == [b"n0|odd"]
        assert worker.proc.poll() is None, worker.tail()


async def test_aborted_transactions_are_not_read(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with running_worker(kafka_bootstrap, redis_url, unique_name("tx"),
                              tmp_path) as (env, r, worker):
        topic = env.topic("latency_events")
        now = time.time()

        def sends(node: str) -> list[str]:
            return [f"send\t{node}|tx\t{v}" for v in event_lines(node, "tx", now, 80)]
        script = ["begin", *sends("aborted"), "abort", "begin", *sends("committed"), "commit"]
        await asyncio.to_thread(java_tx_produce, kafka_bootstrap, topic, 0, script)
        await asyncio.to_thread(_kcat_lines, kafka_bootstrap, topic,
                                event_lines("plain", "tx", now, 80), "-p", "0")
        used = await _nodes_with_samples(r, env, "tx", ["committed", "plain"], at_least=80)
        await wait_for(used, 60, "the committed and plain events in Redis", worker.tail)
        await asyncio.sleep(2.5)  # two more ticks
        st = await node_status(r, env.name, "tx")
        assert set(st) == {"committed", "plain"}, st
        # The aborted records are in the log: a read_uncommitted consumer would have used them.
        c = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                             isolation_level="read_uncommitted")
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            got = await c.getmany(tp, timeout_ms=5000)
            nodes = {json.loads(rec.value)["node_id"] for rec in got.get(tp, [])}
            assert "aborted" in nodes
        finally:
            await c.stop()
        assert not await read_topic(kafka_bootstrap, env.topic("dead_letter"))


async def test_input_topic_with_more_partitions_than_the_worker_creates(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    """The user created latency-events with 6 partitions and node-window-stats with 2 (the
    worker would make 4 of each), and adds 3 partitions to latency-events while the worker
    runs: events on every partition are used, and windows of the partitions the worker keeps
    survive the rebalance."""
    async with running_worker(kafka_bootstrap, redis_url, unique_name("parts"), tmp_path,
                              {"latency_events": 6, "window_stats": 2}) as (env, r, worker):
        topic = env.topic("latency_events")

        async def feed(parts: range) -> None:
            now = time.time()
            for p in parts:
                await asyncio.to_thread(_kcat_lines, kafka_bootstrap, topic,
                                        event_lines(f"p{p}", "parts", now, 60), "-p", str(p))
        await feed(range(6))
        await wait_for(await _nodes_with_samples(r, env, "parts", [f"p{p}" for p in range(6)]),
                       60, "events of partitions 0-5 in Redis", worker.tail)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({topic: NewPartitions(9)})
        finally:
            await admin.close()

        async def nine_partitions() -> bool:   # the broker lists them a moment later
            return await asyncio.to_thread(kcat_partitions, kafka_bootstrap, topic) == 9
        await wait_for(nine_partitions, 30, f"9 partitions of {topic} in the metadata")
        await feed(range(6, 9))
        # No more events for p0-p5: their windows must outlive the rebalance.
        await wait_for(await _nodes_with_samples(r, env, "parts", [f"p{p}" for p in range(9)]),
                       45, "events of the added partitions 6-8 in Redis", worker.tail)
        assert "stage 1 owns" in worker.log() and "6, 7, 8]" in worker.log()


async def test_undecodable_diagnostics_results_are_dead_lettered_and_the_worker_goes_on(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    # A faust agent's consumer thread died on such a record and took the worker with it.
    async with running_worker(kafka_bootstrap, redis_url, unique_name("diag"),
                              tmp_path) as (env, r, worker):
        k = kafka_bootstrap
        diag = env.topic("diagnostics_results")
        bad_header = b"\xff\xfe=v".decode("utf-8", "surrogateescape")

        # A new group reads results partitions from their end: produce once stage 1 has them.
        async def reading_results() -> bool:
            return f"reads {diag} partitions" in worker.log()
        await wait_for(reading_results, 60, f"stage 1 to read {diag}", worker.tail)

        def produce() -> None:
            kcat_produce(k, diag, b'{"node_id": "x", "model": "diag", "recoverable": true}\n',
                         "-H", bad_header, "-p", "0")
            kcat_produce(k, diag, b"\xff\xfe not json\n", "-p", "0")
            now = time.time()
            _kcat_lines(k, env.topic("latency_events"),
                        [f"{n}|diag\t{v}" for n in ("a", "b", "c")
                         for v in event_lines(n, "diag", now, 60)], "-K", "\t")
        await asyncio.to_thread(produce)

        async def two_dead() -> list[Any]:
            recs = await read_topic(k, env.topic("dead_letter"))
            return recs if len(recs) >= 2 else []
        dead = await wait_for(two_dead, 60, "2 dead letters", worker.tail)
        h = [dict(rec.headers) for rec in dead]
        assert sorted(x["tailguard.reason"] for x in h) == [b"bad_json", b"undecodable"]
        assert all(x["tailguard.topic"].decode() == diag for x in h)
        used = await _nodes_with_samples(r, env, "diag", ["a", "b", "c"])
        await wait_for(used, 40, "the latency events after them in Redis", worker.tail)
