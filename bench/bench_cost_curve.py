"""The cost curve through the worker: 1,000 to 100,000 series on one worker, and 1/2/4 workers.

Run: ``python -m bench.bench_cost_curve [--quick] [--sizes 1000,10000,100000] [--workers 1,2,4]``
(``scripts/bench bench_cost_curve`` runs it after ``scripts/up``). Real Kafka and Redis, the
real ``tailguard worker`` process, summaries on the wire included.

1. For each size N (``N/1000`` models of 1,000 nodes): a backlog of one binary batch of
   ``--samples`` samples per series, then one ``tailguard worker`` that reads it, then steady
   traffic (``--trickle`` samples per series per tick, spread over the tick). After two warm
   ticks (the first verdicts of every node), for ``--ticks`` ticks: the stage-1 tick (from the
   tick's boundary until its summaries were sent: ``tailguard_stage1_tick_seconds``), when
   stage 2 held every summary (``tailguard_summaries_in_total``), the stage-2 evaluation
   (``tailguard_evaluation_seconds``), when every model's statuses in Redis carried this
   tick's write, and the worker's RSS (``/proc``).
2. Baselines measured in the same run, in this process, on the same windows: the floor (one
   uint32 ``np.sort`` of every window) and the core alone (``WindowStore.summaries`` for
   stage 1, ``FleetEvaluator.evaluate`` per model for stage 2: what the worker's ticks cost
   without Kafka, faust and Redis). RSS against the empty worker and the samples' bytes.
3. samples/s with 1, 2 and 4 workers of one group on 16 partitions: :mod:`bench.bench_scale_out`
   (how it measures fairly on a loaded machine: its docstring).

Wall-clock time on a shared 2-core machine: numbers move between runs; read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.bench_streaming import ROOT, free_port, worker_env
from bench.timing import best
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import WindowStore
from tailguard.sim import worker_metrics
from tailguard.sim.series_feed import feed_messages, fleet_pairs, series_batches
from tailguard.streaming.service import stage2_offset_s

PARTITIONS = 16
NODES_PER_MODEL = 1000
MEDIAN_US = 162_755.0   # lognormal latency of every series: median ~163 ms, sigma 0.3
SIGMA = 0.3
# How often a tick is watched. Each scrape of /metrics costs the worker: at 100,000 series,
# scraped every 50 ms, 11-17 % of its samples (py-spy) were the exposition (docs/performance.md).
WATCH_S = 0.25


def say(msg: str) -> None:
    print(f"[cost] {msg}", file=sys.stderr, flush=True)


def scrape(port: int) -> dict[str, float]:
    """The worker's metrics by name and reason (:func:`tailguard.sim.worker_metrics.read`),
    ``{}`` while it starts."""
    return worker_metrics.read(port, labels=("reason",))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def send(bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes]],
               progress: str = "") -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await p.start()
    try:
        await send_all(p, topic, msgs, 20_000, progress and f"{progress}: {{}} messages sent")
    finally:
        await p.stop()


async def send_all(producer: AIOKafkaProducer, topic: str, msgs: list[tuple[bytes, bytes]],
                   every: int, progress: str = "", tell: Callable[[str], None] = say) -> None:
    """Send ``msgs`` (key, value) pipelined, waiting for the acknowledgements every ``every``
    messages; ``progress`` (with ``{}`` for "i of n"): told at each wait."""
    futs = []
    for i, (key, value) in enumerate(msgs):
        futs.append(await producer.send(topic, value, key=key))
        if len(futs) >= every:
            await asyncio.gather(*futs)
            futs = []
            if progress:
                tell(progress.format(f"{i + 1:,} of {len(msgs):,}"))
    await asyncio.gather(*futs)


@dataclass(frozen=True)
class Fleet:
    """N series: ``models`` models of :data:`NODES_PER_MODEL` nodes, lognormal latencies."""

    series: int

    @property
    def models(self) -> int:
        return max(1, self.series // NODES_PER_MODEL)

    def pairs(self) -> list[tuple[str, str]]:
        return fleet_pairs(self.models, self.series // self.models)

    def windows(self, k: int, now: float, seed: int = 1) -> list[SampleBatch]:
        return series_batches(self.pairs(), k, now, np.random.default_rng(seed), median_us=MEDIAN_US,
                              sigma=SIGMA, spread_s=25.0)


@dataclass
class Baseline:
    floor_s: float
    core_stage1_s: float
    core_stage2_s: float
    sample_mb: float


def baseline(fleet: Fleet, k: int, trickle: int, settings: DetectorSettings) -> Baseline:
    """The floor and the core alone on the same windows (module docstring)."""
    now = time.time()
    batches = fleet.windows(k, now)
    window = k + 3 * trickle
    lat = np.random.default_rng(2).integers(1, 1 << 31, (fleet.series, window), dtype=np.uint32)
    floor = best(lambda: np.sort(lat, axis=1), 3)
    store = WindowStore(settings)
    for b in batches:
        store.observe(b)
    ev = FleetEvaluator(settings)
    s1 = s2 = 0.0
    for tick in range(3):   # the first verdicts of every node first, then a steady tick
        t0 = time.perf_counter()
        summ = store.summaries(now + tick)
        s1 = time.perf_counter() - t0
        by_model: dict[str, list[Any]] = {}
        for s in summ:
            by_model.setdefault(s.model, []).append(s)
        t0 = time.perf_counter()
        for model, rows in by_model.items():
            ev.evaluate(model, rows, now + tick)
        s2 = time.perf_counter() - t0
    return Baseline(floor, s1, s2, lat.nbytes / 2**20)


class Trickle(threading.Thread):
    """Steady traffic: ``per_tick`` samples per series per tick, sent in slices over the tick."""

    def __init__(self, bootstrap: str, topic: str, fleet: Fleet, per_tick: int, tick_s: float):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.fleet = bootstrap, topic, fleet
        self.per_tick, self.tick_s = per_tick, tick_s
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        rng = np.random.default_rng(3)
        pairs = self.fleet.pairs()
        slices = 20
        per_slice = -(-len(pairs) // slices)
        p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=20, max_batch_size=1 << 20)
        await p.start()
        try:
            while not self.stop.is_set():
                for j in range(slices):
                    t0 = time.monotonic()
                    now = time.time()
                    futs = []
                    batches = series_batches(pairs[j * per_slice:(j + 1) * per_slice], self.per_tick, now, rng,
                                             median_us=MEDIAN_US, sigma=SIGMA)
                    for key, value in feed_messages(batches):
                        futs.append(await p.send(self.topic, value, key=key))
                    await asyncio.gather(*futs)
                    self.sent += len(futs)
                    if self.stop.is_set():
                        return
                    await asyncio.sleep(max(0.0, self.tick_s / slices - (time.monotonic() - t0)))
        finally:
            await p.stop()


@dataclass
class TickFigures:
    stage1_s: float | None = None
    delivered_s: float | None = None      # boundary -> stage 2 held every summary
    received: float = 0.0
    stage2_s: float | None = None
    redis_s: float | None = None          # boundary -> every model's statuses written
    dropped: float = 0.0                  # send_deadline
    made: float = 0.0                     # summaries stage 1 made (sent or dropped)
    rss_mb: float = 0.0
    behind: list[str] = field(default_factory=list)


class Redis:
    """Each model's statuses: when they carry a write of this tick, and how many there are."""

    def __init__(self, url: str, prefix: str, fleet: Fleet) -> None:
        import redis

        self.r = redis.Redis.from_url(url)
        self.prefix = prefix
        self.models = sorted({m for _, m in fleet.pairs()})
        self.probe = {m: n for n, m in fleet.pairs()}     # the model's last node

    def written_since(self, ts: float) -> list[str]:
        """Models whose probe node's status was not written at or after ``ts``."""
        import json

        pipe = self.r.pipeline(transaction=False)
        for m in self.models:
            pipe.hget(f"{self.prefix}:nodes:{m}", self.probe[m])
        behind = []
        for m, raw in zip(self.models, pipe.execute(), strict=True):
            if raw is None or json.loads(raw).get("updated", 0) < ts:
                behind.append(m)
        return behind

    def counts(self) -> list[int]:
        pipe = self.r.pipeline(transaction=False)
        for m in self.models:
            pipe.hlen(f"{self.prefix}:nodes:{m}")
        return [int(x) for x in pipe.execute()]


def watch_tick(port: int, pid: int, redis: Redis, n: int, boundary: float,
               tick_s: float) -> TickFigures:
    """The figures of the tick at ``boundary`` (wall clock), watched every :data:`WATCH_S`."""
    while time.time() < boundary - 0.4:
        time.sleep(WATCH_S)
    m0 = scrape(port)
    f = TickFigures()
    stage2_at = boundary + stage2_offset_s(tick_s)
    end = boundary + tick_s - 0.5
    while time.time() < end:
        now = time.time()
        m = scrape(port)
        if not m:
            continue
        def delta(key: str, m: dict[str, float] = m) -> float:
            return m.get(key, 0.0) - m0.get(key, 0.0)
        got = delta("tailguard_summaries_in_total")
        if f.delivered_s is None and got >= n:
            f.delivered_s = now - boundary
        f.received = got
        if f.stage1_s is None and delta("tailguard_stage1_tick_seconds_count") > 0:
            f.stage1_s = delta("tailguard_stage1_tick_seconds_sum")
        if f.stage2_s is None and delta("tailguard_evaluation_seconds_count") > 0:
            f.stage2_s = delta("tailguard_evaluation_seconds_sum")
        if f.redis_s is None and now >= stage2_at:
            f.behind = redis.written_since(stage2_at)
            if not f.behind:
                f.redis_s = time.time() - boundary
        f.dropped = delta("tailguard_summaries_dropped_total|send_deadline")
        f.made = delta("tailguard_summaries_out_total")
        if f.redis_s is not None and f.stage2_s is not None and f.stage1_s is not None:
            break
        time.sleep(WATCH_S)
    f.rss_mb = rss_mb(pid)
    return f


def start_worker(env: dict[str, str], what: str) -> tuple[subprocess.Popen[bytes], Any]:
    """A ``tailguard worker`` in a session of its own: with the kernel's autogroup scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``) the processes of one session share one
    group's CPU time, so workers started in the benchmark's session shared one share of the
    machine (2 workers got 0.21 cores together where 1 got 0.28, 2026-12-05), as separate
    machines or containers do not."""
    log = tempfile.NamedTemporaryFile(prefix=f"tailguard-cost-{what}-", suffix=".log",  # noqa: SIM115
                                      delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "worker"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return proc, log


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cost_point(bootstrap: str, redis_url: str, n: int, k: int, trickle: int, tick_s: float,
               ticks: int, worker_pythonpath: str | None = None) -> None:
    """One size of the cost curve (module docstring, 1 and 2), printed."""
    fleet = Fleet(n)
    settings = DetectorSettings(warmup_s=0.0, tick_interval_s=tick_s)
    say(f"{n:,} series: baselines in this process (sort floor, core alone)")
    base = baseline(fleet, k, trickle, settings)
    name = f"bench-cost{n}-{uuid.uuid4().hex[:8]}"
    topic = f"{name}-latency-events"
    asyncio.run(create_topic(bootstrap, topic))
    say(f"{n:,} series: encoding and sending the backlog ({n:,} messages of {k} samples)")
    asyncio.run(send(bootstrap, topic, feed_messages(fleet.windows(k, time.time())), f"{n:,} series"))
    port = free_port()
    env = worker_env(bootstrap, topic, name, port, TAILGUARD_TOPIC_PARTITIONS=str(PARTITIONS),
                     TAILGUARD_REDIS_URL=redis_url, TAILGUARD_TICK_INTERVAL_S=f"{tick_s:g}",
                     TAILGUARD_WARMUP_S="0", TAILGUARD_MAX_NEW_PAIRS_PER_TICK="10000000",
                     TAILGUARD_MAX_MODELS="100000")
    if worker_pythonpath:   # another build's worker (the before of a before/after)
        env["PYTHONPATH"] = worker_pythonpath
    proc, log = start_worker(env, str(n))
    trickler = Trickle(bootstrap, topic, fleet, trickle, tick_s)
    try:
        deadline = time.monotonic() + 600
        rss_empty = 0.0
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode}; see {log.name}")
            m = scrape(port)
            if m and not rss_empty:
                rss_empty = rss_mb(proc.pid)
            held = m.get("tailguard_series_tracked", 0.0)
            if held >= n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker held {held:,.0f} of {n:,} series after 600 s;"
                                   f" see {log.name}")
            say(f"{n:,} series: worker reading the backlog, {held:,.0f} series held,"
                f" {m.get('tailguard_samples_in_total', 0):,.0f} samples in")
            time.sleep(2.0)
        trickler.start()
        redis = Redis(redis_url, name, fleet)
        boundary = (time.time() // tick_s + 1) * tick_s
        figures = []
        for i in range(2 + ticks):
            f = watch_tick(port, proc.pid, redis, n, boundary, tick_s)
            label = "warm-up" if i < 2 else "measured"
            say(f"{n:,} series: tick {i + 1} ({label}): stage 1 {f.stage1_s}, stage 2 held"
                f" {f.received:,.0f} at {f.delivered_s}, evaluation {f.stage2_s}, Redis"
                f" {f.redis_s} ({len(f.behind)} models behind), RSS {f.rss_mb:,.0f} MB")
            if i >= 2:
                figures.append(f)
            boundary += tick_s
        counts = redis.counts()
    finally:
        trickler.stop.set()
        stop([proc])
        trickler.join(30)
    report(n, fleet, k, trickle, tick_s, base, figures, counts, rss_empty)


def _med(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if len(got) == len(values) and got else None


def _met(x: float | None, limit: float) -> str:
    """Whether the median ``x`` of the measured ticks is within ``limit`` (every tick had one)."""
    return "met" if x is not None and x <= limit else "NOT met"


def _fmt(x: float | None, unit: str = "s") -> str:
    return "never" if x is None else f"{x:.3f} {unit}"


def report(n: int, fleet: Fleet, k: int, trickle: int, tick_s: float, base: Baseline,
           figures: list[TickFigures], counts: list[int], rss_empty: float) -> None:
    s1 = _med([f.stage1_s for f in figures])
    s2 = _med([f.stage2_s for f in figures])
    delivered = _med([f.delivered_s for f in figures])
    redis_s = _med([f.redis_s for f in figures])
    rss = max(f.rss_mb for f in figures)
    offset = stage2_offset_s(tick_s)

    def ratio(x: float | None, of: float) -> str:
        return "" if x is None else f"{x / of:7.1f}x"
    print(f"  {n:>7,} series ({fleet.models} models x {n // fleet.models:,} nodes), {k} samples"
          f" per window at the start + {trickle} per tick, {tick_s:g} s ticks; median of"
          f" {len(figures)} ticks")
    print(f"    baseline floor: one uint32 np.sort of every window ({k + 3 * trickle} samples)"
          f"  {base.floor_s * 1000:8.2f} ms")
    print(f"    baseline core alone: stage 1 WindowStore.summaries {base.core_stage1_s:8.3f} s,"
          f" stage 2 FleetEvaluator.evaluate {base.core_stage2_s:8.3f} s")
    print(f"    stage-1 tick (boundary -> summaries sent)        {_fmt(s1)}"
          f"  {ratio(s1, base.floor_s)} of the floor {ratio(s1, base.core_stage1_s)} of core stage 1"
          f"   (target <= 3 s: {_met(s1, 3.0)})")
    print(f"    every summary at stage 2                         {_fmt(delivered)} after the tick"
          f" (target <= 5 s: {_met(delivered, 5.0)})"
          f"  (stage 1 made {min(f.made for f in figures):,.0f}, sent"
          f" {min(f.made - f.dropped for f in figures):,.0f} and stage 2 received"
          f" {min(f.received for f in figures):,.0f} of {n:,} a tick at least; send_deadline"
          f" drops {sum(f.dropped for f in figures):,.0f}; stage 2 judges {offset:g} s after)")
    print(f"    stage-2 evaluation                               {_fmt(s2)}"
          f"  {ratio(s2, base.floor_s)} of the floor {ratio(s2, base.core_stage2_s)} of core stage 2")
    print(f"    every verdict in Redis                           {_fmt(redis_s)} after the tick"
          f" = {_fmt(None if redis_s is None else redis_s - offset)} after stage 2 began"
          f"  (statuses {sum(counts):,} of {n:,}; target <= 5 s after stage 2 began:"
          f" {_met(None if redis_s is None else redis_s - offset, 5.0)})")
    print(f"    worker RSS {rss:8,.0f} MB, empty worker {rss_empty:,.0f} MB:"
          f" {(rss - rss_empty) * 1024 / n:,.1f} KB per series; the windows' samples as uint32"
          f" {base.sample_mb:,.1f} MB ({(rss - rss_empty) / base.sample_mb:,.1f}x)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 and 10,000 series, 10 s ticks")
    ap.add_argument("--sizes", help="comma-separated series counts (default 1000,10000,100000)")
    ap.add_argument("--samples", type=int, default=100, help="samples per window at the start")
    ap.add_argument("--trickle", type=int, default=5, help="samples per series per tick")
    ap.add_argument("--tick-s", type=float, default=None, help="tick interval (default 30, quick 10)")
    ap.add_argument("--ticks", type=int, default=2, help="measured ticks per size")
    ap.add_argument("--workers", default="1,2,4", help="worker counts of the scale-out ('' = skip)")
    ap.add_argument("--scale-messages", type=int, default=None,
                    help="binary batches of 1,000 samples in the scale-out backlog (per run)")
    ap.add_argument("--worker-pythonpath", help="PYTHONPATH of the benchmarked workers (to"
                    " measure another build: its scripts/lib/typecheck holds its tailguard)")
    args = ap.parse_args(argv)
    bootstrap = os.environ.get("TAILGUARD_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    redis_url = os.environ.get("TAILGUARD_REDIS_URL", "redis://127.0.0.1:6379/0")
    sizes = [int(x) for x in (args.sizes if args.sizes is not None else (
        "1000,10000" if args.quick else "1000,10000,100000")).split(",") if x]
    tick_s = args.tick_s or (10.0 if args.quick else 30.0)
    print(f"cost curve through one tailguard worker: real broker {bootstrap}, Redis {redis_url},"
          f" {PARTITIONS} partitions, {os.cpu_count()} cores (load average"
          f" {os.getloadavg()[0]:.1f} at the start)", flush=True)
    for n in sizes:
        cost_point(bootstrap, redis_url, n, args.samples, args.trickle, tick_s, args.ticks,
                   args.worker_pythonpath)
    workers = [int(x) for x in args.workers.split(",") if x]
    if workers:
        from bench.bench_scale_out import scale_out  # it imports this module's helpers

        scale_out(bootstrap, workers, args.scale_messages or (10_000 if args.quick else 30_000),
                  rounds=1 if args.quick else 3)
    print(f"  (load average {os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
