"""A cardinality flood through the real worker: kcat, real Kafka and Redis.

Six real nodes of one model report (the harness's Feeder, 100 samples/s each). Then
distinct node ids send one event each for the same model (kcat from a
file), and one real node turns 3x slow at the same moment. Held: the real nodes get a
summary at every stage-1 tick (read back from ``node-window-stats``); the slow node
leaves routing within the usual time; no flood id is ever in the routing set; the flood
is admitted at most ``max_new_pairs_per_tick`` pairs per tick, the rest counted
(``tailguard_samples_dropped_total{reason="new_pair_limit"}``); once both stages have
forgotten the flood's ids, the worker's RSS is within 10 % of its pre-flood level (issue 28),
both measured the same way (:func:`settled_rss_mb`: the largest reading over two ticks, after
the ticks that give memory back). The worker runs as it starts by default: on jemalloc
(``TAILGUARD_ALLOCATOR=auto``; the test checks its log says so). Two floods, at the default
admission limit (1,000 new pairs a tick): 200,000 ids at once (1,000-3,000 pairs admitted, as
many ticks as the flood takes to read), and 8 waves of 1,000 new ids, one a stage-2 tick
(8,000 pairs admitted over 8 ticks). ``FLOOD_TEST_ALLOCATOR=pymalloc`` runs the same on
CPython's allocator, for a side-by-side measurement (docs/performance.md#floods).

Flood ids stay out of routing here because they go silent (``silent_after_s`` 6 s)
before their warm-up (12 s) ends; admission by evidence (issue 16 item 1) keeps them
out whatever the timing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from worker_harness import Feeder, Worker, WorkerEnv, free_port, read_topic, routing

from tailguard.core.contract.types import WindowSummary
from tailguard.streaming.memory import GIVE_BACK_TICKS
from tailguard.streaming.summary_batch import SummaryBatch
from tailguard.streaming.wire import Stage2Message, decode_stage2

# serial: RSS before/after and a summary at every tick, under a 200,000-id flood: not beside other tests.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]

MODEL = "llama"
REAL = [f"real-{i}" for i in range(6)]
SLOW = "real-5"
TICK_S = 2.0
LIMIT = 1000                       # the default of max_new_pairs_per_tick
# (waves, new ids a wave): one wave a stage-2 tick
FLOODS = {"200000-ids-at-once": (1, 200_000), "8-waves-of-1000-ids": (8, 1_000)}
ALLOCATOR = os.environ.get("FLOOD_TEST_ALLOCATOR", "auto")     # TAILGUARD_ALLOCATOR
FLOOD_IDS = int(os.environ.get("FLOOD_TEST_IDS", 200_000))   # 0: the usual time, no flood
# Whether this code base routes a new pair while it warms up (before issue 16 item 1).

def cpu_s(pid: int) -> float:
    """The process's user + system CPU time so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of the worker's samples ``name`` with ``labels`` (0 when there is none)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def settled_rss_mb(pid: int, port: int, poll: Callable[[], Awaitable[object]],
                         ticks: int = GIVE_BACK_TICKS + 1, timeout_s: float = 60) -> float:
    """The worker's RSS once ``ticks`` more stage-2 ticks have run (counted on
    ``tailguard_last_tick_timestamp_seconds``; the worker gives memory back over the
    ``GIVE_BACK_TICKS`` after a forget): the largest reading over the last two ticks."""
    deadline = time.monotonic() + timeout_s
    last, ran, readings = metric(port, "tailguard_last_tick_timestamp_seconds"), 0, []
    while ran < ticks:
        assert time.monotonic() < deadline, f"{ran} of {ticks} stage-2 ticks in {timeout_s} s"
        await poll()
        tick = metric(port, "tailguard_last_tick_timestamp_seconds")
        ran, last = ran + (tick != last), tick
        if ran >= ticks - 2:
            readings.append(rss_mb(pid))
        await asyncio.sleep(0.25)
    return max(readings)


async def next_tick(port: int, poll: Callable[[], Awaitable[object]], timeout_s: float = 30) -> None:
    """Return once the worker's next stage-2 tick has run."""
    deadline, last = time.monotonic() + timeout_s, metric(port, "tailguard_last_tick_timestamp_seconds")
    while metric(port, "tailguard_last_tick_timestamp_seconds") == last:
        assert time.monotonic() < deadline, f"no stage-2 tick in {timeout_s} s"
        await poll()
        await asyncio.sleep(0.1)


async def produce(kafka: str, topic: str, paths: list[Path], port: int,
                  poll: Callable[[], Awaitable[object]]) -> float:
    """kcat each file of flood events, the next after the worker's next stage-2 tick; the
    seconds spent producing."""
    produced_s = 0.0
    for k, path in enumerate(paths):
        if k:
            await next_tick(port, poll)
        t0 = time.monotonic()
        with path.open("rb") as f:
            out = await asyncio.to_thread(subprocess.run, [
                "kcat", "-P", "-b", kafka, "-t", topic, "-K", "\t", "-z", "lz4"],
                stdin=f, capture_output=True, timeout=120)
        assert out.returncode == 0, f"kcat, wave {k + 1}: {out.stderr.decode(errors='replace')[-2000:]}"
        produced_s += time.monotonic() - t0
    return produced_s


def summaries_of(msg: Stage2Message) -> tuple[WindowSummary, ...]:
    """The window summaries in one node-window-stats message (a batch holds many)."""
    if isinstance(msg, SummaryBatch):
        return msg.summaries
    return (msg,) if isinstance(msg, WindowSummary) else ()


def flood_file(path: Path, n: int, first: int = 0) -> Path:
    now = time.time()
    with path.open("w") as f:
        for i in range(first, first + n):
            node = f"flood-{i:06d}"
            ev = json.dumps({"node_id": node, "model": MODEL, "ts": now, "latency_us": 900.0})
            f.write(f"{node}|{MODEL}\t{ev}\n")
    return path


@pytest.mark.parametrize("flood", FLOODS)
async def test_a_flood_of_new_ids_does_not_blind_detection_and_memory_comes_back(
        flood: str, kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    metrics_port = free_port()
    waves, wave_ids = FLOODS[flood]
    wave_ids = min(wave_ids, FLOOD_IDS)
    env = WorkerEnv(unique_name("flood"), kafka_bootstrap, redis_url, extra={
        "TAILGUARD_TICK_INTERVAL_S": str(TICK_S), "TAILGUARD_WARMUP_S": "12",
        "TAILGUARD_SILENT_AFTER_S": "6", "TAILGUARD_RESTART_GAP_S": "2",
        "TAILGUARD_FORGET_AFTER_S": "20", "TAILGUARD_WINDOW_SIZE": "200",
        "TAILGUARD_METRICS_PORT": str(metrics_port),
        "TAILGUARD_MAX_NEW_PAIRS_PER_TICK": str(LIMIT), "TAILGUARD_ALLOCATOR": ALLOCATOR})
    topic = env.topic("latency_events")
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    worker = Worker(env.environ(), tmp_path / "worker.log")
    ever_routed: set[str] = set()

    async def routed() -> set[str]:
        now = await routing(r, env.name, MODEL)
        ever_routed.update(now)
        return now

    async def until(pred: Callable[[set[str]], bool], timeout_s: float, what: str) -> float:
        deadline = time.monotonic() + timeout_s
        while not pred(await routed()):
            feeder.check()
            assert time.monotonic() < deadline, f"{what}\n{worker.tail()}"
            await asyncio.sleep(0.25)
        return time.time()

    try:
        async with Feeder(kafka_bootstrap, topic, {MODEL: REAL}) as feeder:
            await until(lambda s: s == set(REAL), 60, "the real nodes were never routed")
            # Steady state before the flood, measured as after it (settled_rss_mb).
            rss_before = await settled_rss_mb(worker.proc.pid, metrics_port, routed)

            paths = [await asyncio.to_thread(flood_file, tmp_path / f"flood-{k}.txt", wave_ids,
                                             k * wave_ids) for k in range(waves)]
            t_flood = time.time()
            feeder.slow.add((SLOW, MODEL))
            producing = asyncio.create_task(produce(kafka_bootstrap, topic, paths, metrics_port, routed))
            t_out = await until(lambda s: SLOW not in s, 60, "the slow node never left routing")
            produced_s = await producing
            # (Flood ids in the routing set are checked at the end.)
            assert {n for n in await routed() if not n.startswith("flood-")} == set(REAL) - {SLOW}

            # The flood's series and pairs are forgotten by both stages (forget_after_s), then
            # memory is given back over the next ticks.
            deadline = time.monotonic() + 90
            while (metric(metrics_port, "tailguard_series_tracked") > len(REAL)
                   or metric(metrics_port, "tailguard_nodes", model=MODEL) > len(REAL)):
                assert time.monotonic() < deadline, worker.tail()
                await routed()
                await asyncio.sleep(0.5)
            rss_after = await settled_rss_mb(worker.proc.pid, metrics_port, routed)
            t_end = time.time()
            dropped = metric(metrics_port, "tailguard_samples_dropped_total",
                             reason="new_pair_limit")
            worker_cpu_s = cpu_s(worker.proc.pid)
        assert worker.proc.poll() is None, worker.tail()
    finally:
        worker.stop()
        await r.aclose()

    summaries = [s for rec in await read_topic(kafka_bootstrap, env.topic("window_stats"), 60)
                 for s in summaries_of(decode_stage2(rec.value))]
    flood_seen = {s.node_id for s in summaries if s.node_id.startswith("flood-")}
    report = (f"flood of {waves} x {wave_ids} ids produced in {produced_s:.1f} s; slow node out "
              f"{t_out - t_flood:.1f} s after; {len(flood_seen)} flood ids summarized, {dropped:.0f}"
              f" events dropped at admission; RSS {rss_before:.0f} -> {rss_after:.0f} MB "
              f"({rss_after / rss_before:.2f}x); worker CPU {worker_cpu_s:.1f} s ({ALLOCATOR})")
    print(report)
    # Detection was not blinded: out within the usual time. Measured 2026-12-03 on the 2-core
    # machine: 4.1 s without a flood (FLOOD_TEST_IDS=0), 7.7 s with it; bound: a few ticks more.
    assert t_out - t_flood < 16, report
    # Every tick from just before the flood to the end has a summary of every real node (a
    # tick starts when the poll in progress is done: its time is a little after the boundary).
    for node in REAL:
        ticks = sorted({s.tick_ts for s in summaries
                        if s.node_id == node and t_flood - 2 * TICK_S <= s.tick_ts <= t_end - TICK_S})
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(ticks)]
        assert len(ticks) >= (t_end - t_flood) / TICK_S - 1, (node, gaps)
        assert max(gaps) < 1.5 * TICK_S, (node, gaps)
        # ... judged on samples (the slow node, once suspect, on the samples since: maybe none).
        assert node == SLOW or all(s.samples > 0 for s in summaries
                                   if s.node_id == node and s.tick_ts >= t_flood), node
    # Admission was limited and the rest counted, not dead-lettered.
    admitted = waves * wave_ids - dropped
    assert len(flood_seen) <= admitted <= LIMIT * ((t_end - t_flood) / TICK_S + 1), report
    assert not await read_topic(kafka_bootstrap, env.topic("dead_letter"))
    # Memory comes back (issue 28: within 10 %). On CPython's allocator what stays grows with
    # the flood pairs admitted (1.02-1.03x at 1,000, 1.14x at 3,000, 1.34x at 8,000 on
    # 2026-12-05: its arenas kept by each tick's ordinary objects); on jemalloc, which the
    # worker starts on, it goes back: docs/performance.md#floods.
    if ALLOCATOR != "pymalloc":
        assert "memory allocator: jemalloc" in worker.log(), worker.tail()
    assert rss_after <= 1.10 * rss_before, report
    # Flood ids are never routed: admission by evidence (issue 16 item 1). Where that is not
    # in yet, a new pair is routed as soon as it is warming, and this check is an expected
    # failure; as soon as warming pairs are not routed it is enforced.
    flood_routed = {n for n in ever_routed if n.startswith("flood-")}
    assert ever_routed - flood_routed <= set(REAL)
    assert not flood_routed, report
