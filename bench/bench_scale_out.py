"""Scale-out: samples/s of 1, 2 and 4 ``tailguard worker``s of one group on 16 partitions.

Run: ``python -m bench.bench_scale_out [--quick] [--workers 1,2,4] [--messages N] [--rounds R]``
(``scripts/bench bench_scale_out`` runs it after ``scripts/up``; ``bench_cost_curve --workers``
runs it too). Real Kafka, the real worker processes, each in a session of its own
(:func:`bench.bench_cost_curve.start_worker`), as separate machines would run them.

- Each run's backlog (``--messages`` binary batches of 1,000 samples, 600 nodes x 3 models) is
  produced inside one open Kafka transaction and committed once every worker owns its share of
  the partitions: the producer does not compete and no worker reads a head start alone.
- Samples are counted on the workers' side only (``tailguard_samples_in_total``).
- Beside every figure: each worker's CPU seconds, the broker's, everything else's, the load
  average and the CPU pressure. Samples per worker CPU-second is the cost of a sample whatever
  share of the cores the workers got.
- ``--rounds`` alternates the worker counts and prints each ratio against the 1-worker run of
  its round, with their median. Why it is built so: docs/performance.md, "Scale-out".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from bench.bench_cost_curve import PARTITIONS, create_topic, scrape, send_all, start_worker, stop
from bench.bench_streaming import free_port, worker_env
from tailguard.core.contract import binary

SAMPLES_PER_MESSAGE = 1000
POLL_S = 0.2
_TICK = os.sysconf("SC_CLK_TCK")


def say(msg: str) -> None:
    print(f"[scale-out] {msg}", file=sys.stderr, flush=True)


def backlog(n_messages: int, nodes: int = 600) -> tuple[list[tuple[bytes, bytes]], int]:
    """``n_messages`` binary batches of 1,000 samples (``nodes`` nodes x 3 models)."""
    rng = np.random.default_rng(4)
    now = time.time()
    out = []
    for i in range(n_messages):
        node, model = f"node-{i % nodes:04d}", f"model-{i % 3}"
        value = binary.encode(node, model, "A100", np.full(SAMPLES_PER_MESSAGE, now),
                              rng.lognormal(12.0, 0.3, SAMPLES_PER_MESSAGE).round(1))
        out.append((f"{node}|{model}".encode(), value))
    return out, n_messages * SAMPLES_PER_MESSAGE


# ------------------------------------------------------------------ the machine

def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it is gone or None)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy so far (``/proc/stat``)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / _TICK       # all but idle and iowait


def cpu_pressure() -> str:
    """``some avg10`` of ``/proc/pressure/cpu``: the share of time some task waited for a core."""
    try:
        first = Path("/proc/pressure/cpu").read_text().split("\n", 1)[0]
    except OSError:
        return "n/a"
    m = re.search(r"avg10=([0-9.]+)", first)
    return f"{float(m.group(1)):.0f} %" if m else "n/a"


def broker_pid() -> int | None:
    """The local Kafka broker's pid (``kafka.Kafka`` in its command line), if it runs here."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if b"kafka.Kafka" in (p / "cmdline").read_bytes():
                    return int(p.name)
            except OSError:
                continue
    return None


@dataclass(frozen=True)
class Snapshot:
    mono: float
    workers_cpu: tuple[float, ...]
    broker_cpu: float
    busy_s: float

    @classmethod
    def take(cls, pids: list[int], broker: int | None) -> Snapshot:
        return cls(time.monotonic(), tuple(cpu_s(p) for p in pids), cpu_s(broker), machine_busy_s())


@dataclass(frozen=True)
class Run:
    """One run of ``workers`` workers over a backlog of ``samples`` samples."""

    workers: int
    samples: int
    wall_s: float
    worker_cpu_s: tuple[float, ...]
    broker_cpu_s: float
    others_cpu_s: float
    load: tuple[float, float]
    pressure: str

    @property
    def rate(self) -> float:
        return self.samples / self.wall_s

    @property
    def per_cpu_s(self) -> float:
        return self.samples / max(sum(self.worker_cpu_s), 1e-9)

    def cores(self, cpu: float) -> float:
        return cpu / self.wall_s


# ------------------------------------------------------------------ one run

def _shares(logs: list[Any], topic: str) -> list[set[int]]:
    owns = re.compile(r"stage 1 owns " + re.escape(topic) + r" partitions \[([0-9, ]*)\]")
    out = []
    for log in logs:
        found = owns.findall(Path(log.name).read_text(errors="replace"))
        out.append({int(p) for p in found[-1].split(",") if p.strip()} if found else set())
    return out


async def _wait_shared(procs: list[Any], logs: list[Any], ports: list[int], topic: str,
                       timeout_s: float) -> None:
    """Until every worker owns its share of the partitions (none read a sample yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited; see {[log.name for log in logs]}")
        shares = _shares(logs, topic)
        if all(shares) and sum(map(len, shares)) == PARTITIONS:
            read = sum(scrape(p).get("tailguard_samples_in_total", 0.0) for p in ports)
            if read:
                raise RuntimeError(f"the workers read {read:,.0f} uncommitted samples: is stage 1"
                                   " still read_committed?")
            say(f"  every worker owns its share {[len(s) for s in shares]}; committing")
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not share the partitions in {timeout_s} s:"
                               f" {shares}; see {[log.name for log in logs]}")
        await asyncio.sleep(POLL_S)


async def _wait_read(procs: list[Any], logs: list[Any], ports: list[int], samples: int,
                     timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    while True:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited; see {[log.name for log in logs]}")
        got = sum(scrape(p).get("tailguard_samples_in_total", 0.0) for p in ports)
        if got >= samples:
            return
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"the workers read {got:,.0f} of {samples:,} samples in"
                               f" {timeout_s} s; see {[log.name for log in logs]}")
        if now - shown >= 2.0:
            say(f"  {got:,.0f} of {samples:,} samples read")
            shown = now
        await asyncio.sleep(POLL_S)


async def one_run(bootstrap: str, msgs: list[tuple[bytes, bytes]], samples: int, n_workers: int,
                  timeout_s: float = 600) -> Run:
    """``n_workers`` workers of a new group over a new backlog of ``msgs`` (module docstring)."""
    tag = uuid.uuid4().hex[:8]
    topic, name = f"bench-scale-{tag}-latency-events", f"bench-w{n_workers}-{tag}"
    await create_topic(bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"bench-scale-{tag}",
                                enable_idempotence=True, linger_ms=20, max_batch_size=1 << 20,
                                transaction_timeout_ms=600_000)
    await producer.start()
    procs: list[Any] = []
    try:
        say(f"{n_workers} worker(s): the backlog ({len(msgs):,} messages) in an open transaction")
        await producer.begin_transaction()
        await send_all(producer, topic, msgs, 5000, "  {} messages acknowledged (not committed)", say)
        ports = [free_port() for _ in range(n_workers)]
        started = [start_worker(worker_env(bootstrap, topic, name, port, TAILGUARD_LOG_LEVEL="info"),
                                f"w{i}") for i, port in enumerate(ports)]
        procs = [p for p, _ in started]
        logs = [log for _, log in started]
        await _wait_shared(procs, logs, ports, topic, timeout_s)
        broker = broker_pid()
        pids = [p.pid for p in procs]
        load0 = os.getloadavg()[0]
        before = Snapshot.take(pids, broker)
        await producer.commit_transaction()
        await _wait_read(procs, logs, ports, samples, timeout_s)
        after = Snapshot.take(pids, broker)
        workers_cpu = tuple(b - a for a, b in zip(before.workers_cpu, after.workers_cpu, strict=True))
        broker_cpu = after.broker_cpu - before.broker_cpu
        others = after.busy_s - before.busy_s - sum(workers_cpu) - broker_cpu
        return Run(n_workers, samples, after.mono - before.mono, workers_cpu, broker_cpu,
                   max(0.0, others), (load0, os.getloadavg()[0]), cpu_pressure())
    finally:
        stop(procs)
        await producer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


# ------------------------------------------------------------------ the report

def report_run(r: Run, one: Run | None) -> None:
    cores = os.cpu_count() or 1
    vs = f"{r.rate / one.rate:5.2f}x" if one else "  -  "
    eff = f"{r.per_cpu_s / one.per_cpu_s:4.2f}x" if one else "  - "
    got = "+".join(f"{r.cores(c):.2f}" for c in r.worker_cpu_s)
    print(f"  {r.workers} worker(s): {r.rate:>11,.0f} samples/s ({vs} of 1 worker;"
          f" {r.rate / r.workers:,.0f} per worker) in {r.wall_s:5.2f} s |"
          f" the workers got {r.cores(sum(r.worker_cpu_s)):.2f} cores ({got}),"
          f" {r.per_cpu_s:,.0f} samples per worker CPU-s ({eff} of 1 worker's) |"
          f" broker {r.cores(r.broker_cpu_s):.2f} cores, other processes"
          f" {r.cores(r.others_cpu_s):.2f} of {cores} | load {r.load[0]:.1f} -> {r.load[1]:.1f},"
          f" CPU pressure {r.pressure}", flush=True)


def scale_out(bootstrap: str, workers: list[int], messages: int, rounds: int = 1,
              ) -> list[dict[int, Run]]:
    """Every count of ``workers`` in ``rounds`` alternating rounds; the runs of each round."""
    say(f"encoding {messages:,} binary batches of {SAMPLES_PER_MESSAGE:,} samples")
    msgs, samples = backlog(messages)
    print(f"samples/s with {', '.join(map(str, workers))} workers of one group on {PARTITIONS}"
          f" partitions: {samples:,} samples in binary batches of {SAMPLES_PER_MESSAGE:,} (600 nodes"
          f" x 3 models), produced before the workers start and committed (one transaction) once"
          f" every worker owns its share; counted by the workers; each worker in a session (CPU"
          f" autogroup) of its own; {os.cpu_count()} cores shared with every other process;"
          f" {rounds} alternating round(s)", flush=True)
    done: list[dict[int, Run]] = []
    for rnd in range(rounds):
        runs: dict[int, Run] = {}
        print(f"  round {rnd + 1}:")
        for w in workers:
            runs[w] = asyncio.run(one_run(bootstrap, msgs, samples, w))
            report_run(runs[w], runs.get(1))
        done.append(runs)
    for w in (w for w in workers if w != 1 and 1 in workers):
        rate = [r[w].rate / r[1].rate for r in done]
        cores = [r[w].cores(sum(r[w].worker_cpu_s)) / r[1].cores(sum(r[1].worker_cpu_s)) for r in done]
        cost = [r[w].per_cpu_s / r[1].per_cpu_s for r in done]
        target = "  (target >= 1.7x)" if w == 2 else ""
        print(f"  1 -> {w} workers, round by round: samples/s {_xs(rate)}{target}; the cores the"
              f" workers got {_xs(cores)}; samples per worker CPU-second {_xs(cost)}", flush=True)
    return done


def _xs(values: list[float]) -> str:
    med = f" (median {statistics.median(values):.2f}x)" if len(values) > 1 else ""
    return ", ".join(f"{v:.2f}x" for v in values) + med


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10,000 messages, one round")
    ap.add_argument("--workers", default="1,2,4", help="worker counts")
    ap.add_argument("--messages", type=int, default=None,
                    help="binary batches of 1,000 samples per run (default 30,000)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3)")
    args = ap.parse_args(argv)
    bootstrap = os.environ.get("TAILGUARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    workers = [int(x) for x in args.workers.split(",") if x]
    scale_out(bootstrap, workers, args.messages or (10_000 if args.quick else 30_000),
              args.rounds or (1 if args.quick else 3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
