"""End-to-end ingestion throughput of the worker, against the real Kafka broker.

Run: ``python -m bench.bench_streaming [--quick]`` (``scripts/bench`` runs it
after ``scripts/up``). For each event form (batch of 100 samples per message,
and single events) it:

1. produces a backlog of latency events to a fresh topic (8 partitions);
2. starts ``tailguard worker`` (``python -m app.cli worker``, the real
   service: aiokafka stage-1 ingestion in a faust worker, windows, stage-2
   agents, ticks) on that topic and reads its Prometheus counter
   ``tailguard_samples_in_total`` every 50 ms until every sample is in;
   samples/s = samples / (time of the last sample − time the first sample
   was seen);
3. runs, side by side, a faust agent over ``stream.take(2000)`` feeding the
   same decode and window code (what faust's own consumer path costs), and
   the naive per-event design in a faust worker: one
   agent iterating the stream event by event, one table write per latency
   sample (``table[node|model] = {count, last latency}``, the smallest
   write there is), over the same topic, for at most ``--naive-seconds``
   (it is ~100× slower; its rate is steady after a few seconds);
4. prints both rates and their ratio.

Wall-clock time on a shared 2-core machine: numbers move by ±20 % between
runs; the ratio is the point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 8
BATCH_SAMPLES = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def produce(bootstrap: str, topic: str, form: str, messages: int, nodes: int = 200) -> int:
    """Create ``topic`` and fill it; returns the number of latency samples sent."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await p.start()
    rng = random.Random(1)
    now = time.time()
    samples = 0
    try:
        futs = []
        for i in range(messages):
            node = f"node-{i % nodes:04d}"
            model = f"model-{i % 3}"
            if form == "batch":
                body = {"node_id": node, "model": model, "hardware": "A100", "samples": [
                    [now, round(1000.0 * rng.lognormvariate(0, 0.3), 1)]
                    for _ in range(BATCH_SAMPLES)]}
                samples += BATCH_SAMPLES
            else:
                body = {"node_id": node, "model": model, "ts": now, "hardware": "A100",
                        "latency_us": round(1000.0 * rng.lognormvariate(0, 0.3), 1)}
                samples += 1
            futs.append(await p.send(topic, json.dumps(body).encode(),
                                     key=f"{node}|{model}".encode()))
            if len(futs) >= 20_000:
                await asyncio.gather(*futs)
                futs = []
        await asyncio.gather(*futs)
    finally:
        await p.stop()
    return samples


def _counter(port: int, name: str) -> float | None:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return None
    m = re.search(rb"^" + name.encode() + rb" ([0-9.e+]+)$", body, re.M)
    return float(m.group(1)) if m else None


def run_tailguard(bootstrap: str, topic: str, samples: int, timeout_s: float) -> float:
    """samples/s of ``tailguard worker`` over the backlog in ``topic``."""
    name = f"bench-{uuid.uuid4().hex[:10]}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
    env.update({
        "TAILGUARD_KAFKA_BOOTSTRAP": bootstrap, "TAILGUARD_APP_ID": name,
        "TAILGUARD_KEY_PREFIX": name, "TAILGUARD_METRICS_PORT": str(port),
        "TAILGUARD_WEB_PORT": "0", "TAILGUARD_LOG_LEVEL": "warning",
        "TAILGUARD_TOPIC_PARTITIONS": str(PARTITIONS),
        "TAILGUARD_TOPIC_LATENCY_EVENTS": topic,
        "TAILGUARD_TICK_INTERVAL_S": "5",
        "TAILGUARD_MAX_SAMPLE_AGE_S": "3600",
    })
    for t in ("WINDOW_STATS", "HEALTH_CHANGES", "FLEET_EVENTS", "DIAGNOSTICS_REQUESTS",
              "DIAGNOSTICS_RESULTS", "DEAD_LETTER"):
        env[f"TAILGUARD_TOPIC_{t}"] = f"{name}-{t.lower()}"
    with tempfile.NamedTemporaryFile(prefix="tailguard-bench-", suffix=".log",
                                     delete=False) as log:
        return _measure(env, log, port, samples, timeout_s)


def _measure(env: dict[str, str], log: Any, port: int, samples: int, timeout_s: float) -> float:
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        first_t: float | None = None
        first_n = 0.0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"tailguard worker exited with {proc.returncode}; see {log.name}")
            n = _counter(port, "tailguard_samples_in_total")
            now = time.monotonic()
            if n and first_t is None:
                first_t, first_n = now, n
            if n is not None and n >= samples and first_t is not None:
                if now == first_t or n == first_n:
                    raise RuntimeError("backlog consumed within one poll; use more messages")
                return (n - first_n) / (now - first_t)
            time.sleep(0.05)
        raise RuntimeError(f"tailguard worker did not consume {samples} samples in {timeout_s} s;"
                           f" see {log.name}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ the naive design

def naive_worker_main(topic: str, seconds: float, out_path: str, variant: str,
                      samples: int) -> None:
    """The alternatives, as faust workers over ``topic``.

    ``naive``: one agent, event by event, one table write per latency sample.
    ``take``: one agent over ``stream.take(2000, within=0.2)`` feeding the same
    decode + window code as the worker (no table writes): what faust's own
    consumer path costs.
    """
    import faust

    from app.core.config import DetectorSettings
    from app.core.errors import BadEvent
    from app.core.events import Accumulator, Heartbeat, decode
    from app.core.window import WindowStore

    name = f"bench-{variant}-{uuid.uuid4().hex[:10]}"
    app = faust.App(name, broker=f"kafka://{os.environ.get('TAILGUARD_KAFKA_BOOTSTRAP', '127.0.0.1:9092')}",
                    store="memory://", autodiscover=False, web_enabled=False,
                    datadir=os.path.join(tempfile.gettempdir(), name),
                    consumer_auto_offset_reset="earliest", topic_partitions=PARTITIONS,
                    key_serializer="raw", value_serializer="raw",
                    stream_buffer_maxsize=16384, broker_max_poll_records=5000)
    src = app.topic(topic, partitions=PARTITIONS)
    table = app.Table("windows", partitions=PARTITIONS, key_type=str)
    state = {"n": 0, "t0": 0.0}

    def done() -> bool:
        elapsed = time.monotonic() - state["t0"]
        if elapsed < seconds and state["n"] < samples:
            return False
        Path(out_path).write_text(json.dumps({"samples": state["n"], "seconds": elapsed}))
        os._exit(0)  # a throwaway worker: faust's graceful stop can hang mid-stream

    @app.timer(0.5)
    async def watchdog() -> None:  # results even when no more batches arrive
        if state["t0"] == 0.0:
            state.setdefault("wait", time.monotonic())
            if time.monotonic() - state["wait"] > 90:
                Path(out_path).write_text(json.dumps({"error": "no events in 90 s"}))
                os._exit(1)
            return
        done()

    if variant == "naive":
        @app.agent(src)
        async def per_event(stream):  # type: ignore[no-untyped-def]
            async for raw in stream:
                if state["t0"] == 0.0:
                    state["t0"] = time.monotonic()
                try:
                    ev = decode(raw)
                except BadEvent:
                    continue
                if isinstance(ev, Heartbeat):
                    continue
                key = f"{ev.node_id}|{ev.model}"
                for lat in ev.latency_us.tolist():
                    cur = table.get(key) or {"count": 0}
                    table[key] = {"count": cur["count"] + 1, "last_us": lat}
                    state["n"] += 1
                if done():
                    return
    else:
        det = DetectorSettings()
        store = WindowStore(det)

        @app.agent(src)
        async def batches(stream):  # type: ignore[no-untyped-def]
            async for values in stream.take(2000, within=0.2):
                if state["t0"] == 0.0:
                    state["t0"] = time.monotonic()
                acc = Accumulator(now_s=time.time(), settings=det)
                for raw in values:
                    with contextlib.suppress(BadEvent):
                        acc.add(raw)
                for ev in acc.drain():
                    if not isinstance(ev, Heartbeat):
                        store.observe(ev)
                        state["n"] += len(ev)
                if done():
                    return

    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    worker.execute_from_commandline()


def run_naive(bootstrap: str, topic: str, seconds: float, samples: int,
              variant: str = "naive") -> float:
    with tempfile.NamedTemporaryFile(prefix="tailguard-naive-", suffix=".json",
                                     delete=False) as out:
        pass
    env = dict(os.environ, TAILGUARD_KAFKA_BOOTSTRAP=bootstrap)
    proc = subprocess.run([sys.executable, "-m", "bench.bench_streaming", "--naive-worker", topic,
                           "--naive-seconds", str(seconds), "--naive-out", out.name,
                           "--variant", variant, "--naive-samples", str(samples)],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=seconds + 120, check=False)
    text = Path(out.name).read_text()
    os.unlink(out.name)
    if not text:
        raise RuntimeError(f"naive worker produced no result: {proc.stderr.decode()[-2000:]}")
    res = json.loads(text)
    if "error" in res:
        raise RuntimeError(f"{variant} worker: {res['error']}: {proc.stderr.decode()[-2000:]}")
    return float(res["samples"]) / float(res["seconds"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller backlogs (about 1 minute)")
    ap.add_argument("--naive-seconds", type=float, default=None)
    ap.add_argument("--naive-worker", metavar="TOPIC", help=argparse.SUPPRESS)
    ap.add_argument("--naive-out", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="naive", help=argparse.SUPPRESS)
    ap.add_argument("--naive-samples", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.naive_worker:
        naive_worker_main(args.naive_worker, args.naive_seconds or 10.0, args.naive_out,
                          args.variant, args.naive_samples)
        return 0
    bootstrap = os.environ.get("TAILGUARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    naive_s = args.naive_seconds or (8.0 if args.quick else 15.0)
    plan = {"batch": 6_000 if args.quick else 15_000,       # messages of 100 samples
            "single": 60_000 if args.quick else 250_000}
    print(f"streaming ingestion end to end, real broker {bootstrap}, {PARTITIONS} partitions, "
          f"one worker process ({os.cpu_count()} cores)")
    results = []
    for form, messages in plan.items():
        topic = f"bench-{form}-{uuid.uuid4().hex[:10]}"
        samples = asyncio.run(produce(bootstrap, topic, form, messages))
        ours = run_tailguard(bootstrap, topic, samples, timeout_s=300)
        print(f"  {form:<7} {messages:>8} msgs {samples:>9} samples\n"
              f"    tailguard worker (aiokafka getmany → windows)  {ours:>11,.0f} samples/s",
              flush=True)
        take = run_naive(bootstrap, topic, naive_s, samples, "take")
        naive = run_naive(bootstrap, topic, naive_s, samples)
        results.append((form, messages, samples, ours, naive))
        print(f"    faust agent over stream.take(), same windows    {take:>11,.0f} samples/s"
              f"   tailguard is {ours / take:>5.1f}x\n"
              f"    naive: faust agent, table write per event       {naive:>11,.0f} samples/s"
              f"   tailguard is {ours / naive:>5.1f}x", flush=True)
    targets = {"batch": 100_000, "single": 10_000}
    for form, _m, _s, ours, _n in results:
        ok = "meets" if ours >= targets[form] else "BELOW"
        print(f"  target {form}: >= {targets[form]:,} samples/s per worker — {ok} ({ours:,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
