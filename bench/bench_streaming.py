"""End-to-end ingestion throughput of the worker, against the real Kafka broker.

Run: ``python -m bench.bench_streaming [--quick]`` (``scripts/bench`` runs it
after ``scripts/up``). For each event form (JSON batch of 100 samples per
message, the binary batch of docs/contracts-binary.md with the same samples,
and single events) it:

1. produces a backlog of latency events to a fresh topic (8 partitions);
2. starts ``tailguard worker`` (``python -m tailguard.cli worker``, the real
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
4. prints both rates and their ratio;
5. for the JSON batch topic, the baseline of batch ingestion: a bare aiokafka
   consumer that only ``json.loads`` every message of the same topic
   (``raw_drain``), in the same run; the JSON and binary batch rates are
   printed as ratios of it.

Then the scale-out figure (``scale_out``): 1 and then 2 ``tailguard worker``
processes of one group on a fresh 8-partition topic holding a binary backlog
with one 3x-slow node per model; samples/s per worker, and the health changes
the workers published: exactly one event per (model, node, from, to).

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
import threading
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


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()


def backlog(form: str, messages: int, nodes: int = 200, slow: str | None = None,
            ) -> tuple[list[tuple[bytes, bytes]], int]:
    """``messages`` (key, value) pairs of ``form`` and their number of samples.

    ``form``: ``batch`` (JSON), ``binary`` or ``single``; ``slow``: a node id whose
    latency is 3x the others'. Event time is now.
    """
    import numpy as np

    from tailguard.core.contract import binary

    rng = random.Random(1)
    now = time.time()
    samples = 0
    out = []
    for i in range(messages):
        node = f"node-{i % nodes:04d}"
        model = f"model-{i % 3}"
        base = 3000.0 if node == slow else 1000.0
        if form in ("batch", "binary"):
            lat = [round(base * rng.lognormvariate(0, 0.3), 1) for _ in range(BATCH_SAMPLES)]
            if form == "binary":
                value = binary.encode(node, model, "A100", np.full(BATCH_SAMPLES, now),
                                      np.array(lat))
            else:
                value = json.dumps({"node_id": node, "model": model, "hardware": "A100",
                                    "samples": [[now, x] for x in lat]}).encode()
            samples += BATCH_SAMPLES
        else:
            value = json.dumps({"node_id": node, "model": model, "ts": now, "hardware": "A100",
                                "latency_us": round(base * rng.lognormvariate(0, 0.3), 1)}
                               ).encode()
            samples += 1
        out.append((f"{node}|{model}".encode(), value))
    return out, samples


async def send_all(bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await p.start()
    try:
        futs = []
        for key, value in msgs:
            futs.append(await p.send(topic, value, key=key))
            if len(futs) >= 20_000:
                await asyncio.gather(*futs)
                futs = []
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def produce(bootstrap: str, topic: str, form: str, messages: int) -> int:
    """Create ``topic`` and fill it with a :func:`backlog`; returns the samples sent."""
    await create_topic(bootstrap, topic)
    msgs, samples = backlog(form, messages)
    await send_all(bootstrap, topic, msgs)
    return samples


async def raw_drain(bootstrap: str, topic: str, samples: int, timeout_s: float = 300) -> float:
    """samples/s of a bare aiokafka consumer that ``json.loads`` every message of ``topic``.

    The baseline of batch ingestion: what reading the topic and parsing its JSON costs
    with nothing else (no validation, no windows). Timed like the worker: from the
    first record to the last.
    """
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"raw-{uuid.uuid4().hex[:8]}",
                         enable_auto_commit=False, auto_offset_reset="earliest",
                         max_partition_fetch_bytes=4 << 20, fetch_max_bytes=16 << 20)
    await c.start()
    try:
        n = 0
        first_t: float | None = None
        deadline = time.monotonic() + timeout_s
        loads = json.loads
        while n < samples and time.monotonic() < deadline:
            got = await c.getmany(timeout_ms=200, max_records=5000)
            for recs in got.values():
                if first_t is None and recs:
                    first_t = time.monotonic()
                for r in recs:
                    doc = loads(r.value)
                    n += len(doc["samples"]) if "samples" in doc else 1
        if first_t is None or n < samples:
            raise RuntimeError(f"raw drain read {n} of {samples} samples in {timeout_s} s")
        return n / (time.monotonic() - first_t)
    finally:
        await c.stop()


def _counter(port: int, name: str) -> float | None:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return None
    m = re.search(rb"^" + name.encode() + rb" ([0-9.e+]+)$", body, re.M)
    return float(m.group(1)) if m else None


def worker_env(bootstrap: str, topic: str, name: str, port: int, **more: str) -> dict[str, str]:
    """The environment of one benchmarked ``tailguard worker`` (its own topics and keys)."""
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
    env.update(more)
    return env


def run_tailguard(bootstrap: str, topic: str, samples: int, timeout_s: float) -> float:
    """samples/s of ``tailguard worker`` over the backlog in ``topic``."""
    name = f"bench-{uuid.uuid4().hex[:10]}"
    port = free_port()
    env = worker_env(bootstrap, topic, name, port)
    with tempfile.NamedTemporaryFile(prefix="tailguard-bench-", suffix=".log",
                                     delete=False) as log:
        return _measure(env, log, port, samples, timeout_s)


def _measure(env: dict[str, str], log: Any, port: int, samples: int, timeout_s: float) -> float:
    proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "worker"], cwd=ROOT, env=env,
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


# ------------------------------------------------------------------ scale-out

SCALE_DETECTOR = {   # fast decisions on a backlog: 1 s ticks, no warm-up, 2 windows to confirm
    "TAILGUARD_TICK_INTERVAL_S": "1", "TAILGUARD_WARMUP_S": "0",
    "TAILGUARD_CONFIRM_WINDOWS": "2", "TAILGUARD_MIN_SAMPLES": "50",
    "TAILGUARD_BACKOFF_INITIAL_S": "900", "TAILGUARD_BACKOFF_MAX_S": "900",
}
SLOW_NODE = "node-0007"
SCALE_NODES = 61           # coprime with the 3 models: every node serves every model


async def read_all(bootstrap: str, topic: str, idle_s: float = 2.0) -> list[Any]:
    """The records of ``topic`` from its beginning, until none came for ``idle_s``."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"read-{uuid.uuid4().hex[:8]}",
                         enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    try:
        out: list[Any] = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < idle_s:
            got = await c.getmany(timeout_ms=250)
            if not c.assignment():               # the group is still forming
                quiet_since = time.monotonic()
            for recs in got.values():
                out.extend(recs)
                quiet_since = time.monotonic()
        return out
    finally:
        await c.stop()


def scale_out(bootstrap: str, n_workers: int, messages: int, timeout_s: float = 300) -> None:
    """``n_workers`` workers of one group over a binary backlog on 8 partitions (module doc)."""
    from tailguard.settings import load
    from tailguard.streaming.topics import ensure_topics

    name = f"bench-scale{n_workers}-{uuid.uuid4().hex[:8]}"
    topic = f"{name}-latency-events"
    asyncio.run(create_topic(bootstrap, topic))
    msgs, samples = backlog("binary", messages, nodes=SCALE_NODES, slow=SLOW_NODE)
    ports = [free_port() for _ in range(n_workers)]
    envs = [worker_env(bootstrap, topic, name, port, TAILGUARD_LOG_LEVEL="info", **SCALE_DETECTOR)
            for port in ports]
    asyncio.run(ensure_topics(load({k: v for k, v in envs[0].items() if k.startswith("TAILGUARD_")})))
    logs = [tempfile.NamedTemporaryFile(prefix=f"tailguard-scale{i}-", suffix=".log", delete=False)  # noqa: SIM115
            for i in range(n_workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "tailguard.cli", "worker"], cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)   # own autogroup (bench_cost_curve.start_worker)
             for env, log in zip(envs, logs, strict=True)]
    health_topic = envs[0]["TAILGUARD_TOPIC_HEALTH_CHANGES"]
    owns = re.compile(r"stage 1 owns " + re.escape(topic) + r" partitions \[([0-9, ]*)\]")
    try:
        # Every worker must own its share before the backlog comes: otherwise the first
        # worker up reads it all while the group still forms.
        deadline = time.monotonic() + 120
        while True:
            shares = []
            for log in logs:
                found = owns.findall(Path(log.name).read_text(errors="replace"))
                shares.append({int(p) for p in found[-1].split(",") if p.strip()} if found else set())
            if all(shares) and set().union(*shares) == set(range(PARTITIONS)) \
                    and sum(map(len, shares)) == PARTITIONS:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the workers did not share the partitions: {shares};"
                                   f" see {[log.name for log in logs]}")
            time.sleep(0.25)
        result: dict[str, float] = {}

        def feed() -> None:
            t0 = time.monotonic()
            asyncio.run(send_all(bootstrap, topic, msgs))
            result["seconds"] = time.monotonic() - t0
        producer = threading.Thread(target=feed, daemon=True)
        producer.start()
        first: list[float | None] = [None] * n_workers
        last = [0.0] * n_workers
        count = [0.0] * n_workers
        deadline = time.monotonic() + timeout_s
        while sum(count) < samples:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n_workers} workers took {sum(count):.0f} of {samples} samples"
                                   f" in {timeout_s} s; see {[log.name for log in logs]}")
            for i, (proc, port) in enumerate(zip(procs, ports, strict=True)):
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {i} exited with {proc.returncode}; see {logs[i].name}")
                n = _counter(port, "tailguard_samples_in_total") or 0.0
                now = time.monotonic()
                if n > count[i]:
                    if first[i] is None:
                        first[i] = now
                    last[i], count[i] = now, n
            time.sleep(0.05)
        # The decisions: wait until every model's slow node is quarantined (or 60 s).
        events: list[dict[str, Any]] = []
        until = time.monotonic() + 60
        while time.monotonic() < until:
            events = [json.loads(r.value) for r in asyncio.run(read_all(bootstrap, health_topic))]
            if len({e["model"] for e in events
                    if e["node_id"] == SLOW_NODE and e["to"] == "quarantined"}) == 3:
                break
            time.sleep(1.0)
        time.sleep(3.0)                      # a duplicate, if any, would come within a tick
        events = [json.loads(r.value) for r in asyncio.run(read_all(bootstrap, health_topic))]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    producer.join(60)
    span = max(last) - min(t for t in first if t is not None)
    print(f"  {n_workers} worker(s), {PARTITIONS} partitions, {samples:,} samples in binary batches"
          f" ({SCALE_NODES} nodes x 3 models, {SLOW_NODE} 3x slow), sent (encoded beforehand)"
          f" once the workers shared the partitions, at"
          f" {samples / result.get('seconds', float('nan')):,.0f} samples/s")
    print(f"    stage-1 partitions per worker: {[sorted(s) for s in shares]}")
    for i in range(n_workers):
        f = first[i]
        rate = count[i] / (last[i] - f) if f is not None and last[i] > f else float("nan")
        print(f"    worker {i}: {count[i]:>10,.0f} samples  {rate:>11,.0f} samples/s while it read")
    print(f"    all workers: {samples / span:>11,.0f} samples/s"
          f" ({samples / span / n_workers:,.0f} per worker)")
    changes: dict[tuple[str, str, str, str], int] = {}
    for e in events:
        k = (e["model"], e["node_id"], e["from"], e["to"])
        changes[k] = changes.get(k, 0) + 1
    dup = {k: n for k, n in changes.items() if n > 1}
    quarantined = sorted(e["model"] for e in events
                         if e["node_id"] == SLOW_NODE and e["to"] == "quarantined")
    print(f"    health changes: {len(events)} events for {len(changes)} transitions,"
          f" duplicates {len(dup)}{' ' + str(dup) if dup else ''};"
          f" {SLOW_NODE} quarantined in {len(quarantined)}/3 models"
          f" — {'exactly one event per transition' if not dup and events else 'CHECK'}",
          flush=True)


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

    from tailguard.core.contract.config import DetectorSettings
    from tailguard.core.contract.errors import BadEvent
    from tailguard.core.contract.events import Heartbeat, decode
    from tailguard.core.window.accumulate import Accumulator
    from tailguard.core.window.window import WindowStore

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
    ap.add_argument("--forms", help="comma-separated subset of batch,binary,single")
    ap.add_argument("--no-naive", action="store_true", help="skip the faust alternatives")
    ap.add_argument("--no-scale-out", action="store_true", help="skip the 1- and 2-worker runs")
    args = ap.parse_args(argv)
    if args.naive_worker:
        naive_worker_main(args.naive_worker, args.naive_seconds or 10.0, args.naive_out,
                          args.variant, args.naive_samples)
        return 0
    bootstrap = os.environ.get("TAILGUARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    naive_s = args.naive_seconds or (8.0 if args.quick else 15.0)
    plan = {"batch": 6_000 if args.quick else 15_000,       # messages of 100 samples
            "binary": 6_000 if args.quick else 15_000,
            "single": 60_000 if args.quick else 250_000}
    forms = args.forms.split(",") if args.forms else list(plan)
    print(f"streaming ingestion end to end, real broker {bootstrap}, {PARTITIONS} partitions, "
          f"one worker process ({os.cpu_count()} cores)")
    results = []
    raw: float | None = None
    for form in forms:
        messages = plan[form]
        topic = f"bench-{form}-{uuid.uuid4().hex[:10]}"
        samples = asyncio.run(produce(bootstrap, topic, form, messages))
        ours = run_tailguard(bootstrap, topic, samples, timeout_s=300)
        print(f"  {form:<7} {messages:>8} msgs {samples:>9} samples\n"
              f"    tailguard worker (aiokafka getmany → windows)  {ours:>11,.0f} samples/s",
              flush=True)
        results.append((form, ours))
        if form == "batch":
            raw = asyncio.run(raw_drain(bootstrap, topic, samples))
            print(f"    baseline: bare aiokafka + json.loads, same topic {raw:>11,.0f} samples/s"
                  f"   tailguard is {ours / raw:5.2f}x of it (target >= 0.6)", flush=True)
        elif form == "binary" and raw is not None:
            print(f"    vs the JSON batch baseline above ({raw:,.0f}/s)           "
                  f"   tailguard is {ours / raw:5.2f}x of it", flush=True)
        if form == "binary" or args.no_naive:
            continue
        take = run_naive(bootstrap, topic, naive_s, samples, "take")
        naive = run_naive(bootstrap, topic, naive_s, samples)
        print(f"    faust agent over stream.take(), same windows    {take:>11,.0f} samples/s"
              f"   tailguard is {ours / take:>5.1f}x\n"
              f"    naive: faust agent, table write per event       {naive:>11,.0f} samples/s"
              f"   tailguard is {ours / naive:>5.1f}x", flush=True)
    targets = {"batch": 100_000, "binary": 100_000, "single": 10_000}
    for form, ours in results:
        ok = "meets" if ours >= targets[form] else "BELOW"
        print(f"  target {form}: >= {targets[form]:,} samples/s per worker — {ok} ({ours:,.0f})")
    if not args.no_scale_out:
        print("scale-out: one group of workers over 8 partitions (2 cores shared by all processes)")
        for n in (1, 2):
            scale_out(bootstrap, n, 15_000 if args.quick else 30_000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
