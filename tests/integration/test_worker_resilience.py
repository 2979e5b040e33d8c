"""The worker under failures, against the real Kafka and Redis.

* SIGKILL + restart keeps quarantine states (changelog-backed state table);
* two workers sharing the partitions publish exactly one event per transition;
* Redis stopped and restarted mid-run: decisions go on, the routing set
  catches up afterwards and is never emptied;
* the broker frozen for 30 s (SIGSTOP of the one ``scripts/kafka`` started):
  the worker stays up, routing stays, and it goes on deciding afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from worker_harness import (
    HEALTHY,
    NODES,
    Feeder,
    Worker,
    WorkerEnv,
    free_port,
    health_events,
    routing,
    running_worker,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]



async def test_sigkilled_worker_restarts_with_its_quarantine_states(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    env = WorkerEnv(unique_name("kill"), kafka_bootstrap, redis_url)
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    first = Worker(env.environ(), tmp_path / "first.log")
    second: Worker | None = None
    try:
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": list(NODES)},
                          slow={("slow", "llm")}) as feed:
            async def quarantined() -> bool:
                return any(e["node_id"] == "slow" and e["to"] == "quarantined"
                           for e in await health_events(kafka_bootstrap, env))
            await wait_for(quarantined, 60, "the slow node's quarantine", first.tail)
            await asyncio.sleep(2.5)            # a couple more ticks: state in the changelog
            first.kill()
            before = len(await health_events(kafka_bootstrap, env))
            assert await routing(r, env.name, "llm") == HEALTHY

            second = Worker(env.environ(), tmp_path / "second.log")
            feed.models["llm"].append("late")   # proves the second worker is evaluating

            async def late_seen() -> bool:
                return any(e["node_id"] == "late" for e in await health_events(kafka_bootstrap, env))
            await wait_for(late_seen, 90, "the restarted worker's first evaluation", second.tail)
            await asyncio.sleep(3.5)            # three more ticks of the restarted worker
            feed.check()
        after = (await health_events(kafka_bootstrap, env))[before:]
        assert not [e for e in after if e["node_id"] == "slow"], after
        assert await routing(r, env.name, "llm") == HEALTHY | {"late"}
        status = json.loads(await r.hget(f"{env.name}:nodes:llm", "slow"))
        assert status["state"] == "quarantined", status
        assert second.proc.poll() is None, second.tail()
    finally:
        first.kill()
        if second is not None:
            second.stop()
        await r.aclose()


async def test_two_workers_share_stage_2_and_give_each_transition_one_event_id(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    env = WorkerEnv(unique_name("two"), kafka_bootstrap, redis_url)
    await env.create_topics()
    models = {f"model-{i}": list(NODES) for i in range(6)}
    r = aioredis.Redis.from_url(redis_url)
    ports = [free_port(), free_port()]
    workers = [Worker(env.environ(TAILGUARD_METRICS_PORT=str(port)), tmp_path / f"w{i}.log")
               for i, port in enumerate(ports)]

    def tails() -> str:
        return "\n---\n".join(w.tail(15) for w in workers)
    try:
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), models,
                          slow={("slow", m) for m in models}, per_batch=15) as feed:
            async def all_quarantined() -> bool:
                q = {e["model"] for e in await health_events(kafka_bootstrap, env)
                     if e["node_id"] == "slow" and e["to"] == "quarantined"}
                return q == set(models)
            await wait_for(all_quarantined, 120, "every model's slow node quarantined", tails)
            await asyncio.sleep(3.5)
            feed.check()
            # Cluster latency per model: each worker's stage 1 holds part of the model's
            # series, the model's stage-2 owner merges both workers' digests. Four nodes at
            # ~1000 µs (their own P99 ~1420 µs) and the slow one at ~3000 µs: the cluster P99
            # lies in the slow node's samples wherever they are held (seen: 3600-4000 µs,
            # down to ~2470 µs while windows restarted by the stage-1 rebalance refill).
            for m in models:
                name = f'tailguard_cluster_latency_us{{model="{m}",quantile='
                # A tick without a fresh digest from every stage 1 (a loaded machine delays one)
                # clears the gauge until the next, and windows restarted by a stage-1 rebalance
                # hold none of the slow node's samples until they refill: look for a few ticks,
                # not at one instant (seen once under load: P99 1,488 µs at the first look).
                deadline = time.monotonic() + 30
                while True:
                    shown = [(_metric(port, name + '"0.5"}'), _metric(port, name + '"0.99"}'))
                             for port in ports if name in _metrics_body(port)]
                    settled = len(shown) == 1 and 900 < shown[0][0] < 1300 and 2000 < shown[0][1] < 5000
                    if settled or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                assert len(shown) == 1, (m, shown)          # only the model's owner
                ((p50, p99),) = shown
                assert 900 < p50 < 1300 and 2000 < p99 < 5000, (m, p50, p99)
        for m in models:
            assert await routing(r, env.name, m) == HEALTHY, m
    finally:
        codes = [w.stop() for w in workers]
        await r.aclose()
    events = await health_events(kafka_bootstrap, env)
    # Publishing is at least once (a stage-2 handover may repeat the changes of the tick whose
    # state write did not land); consumers drop repeats by event_id, so: one id per change.
    ids: dict[tuple[str, str, str, str], set[str]] = collections.defaultdict(set)
    for e in events:
        ids[(e["model"], e["node_id"], e["from"], e["to"])].add(e["event_id"])
    assert all(len(v) == 1 for v in ids.values()), {k: v for k, v in ids.items() if len(v) > 1}
    for m in models:
        assert len(ids[(m, "slow", "unhealthy", "quarantined")]) == 1
    # Both workers did stage-2 work: each owned some node-window-stats partitions.
    owned = []
    for w in workers:
        found = re.findall(r"stage 2 owns \S+ partitions \[([0-9, ]*)\]", w.log())
        owned.append(found[-1] if found else "")
    assert all(owned), f"stage-2 ownership per worker: {owned}"
    assert codes == [0, 0], tails()


def _metrics_body(port: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


def _metric(port: int, name: str) -> float:
    """Sum of the samples whose line starts with ``name`` (a name or name{labels})."""
    total = 0.0
    for line in _metrics_body(port).splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


class OwnRedis:
    """A throwaway redis-server (AOF on, so a restart keeps the data like a real deployment)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.dir = tmp / "redis"
        self.dir.mkdir()
        self.proc: subprocess.Popen[Any] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server not installed (scripts/redis installs it)"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--save", "", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:                     # answers PING (loaded its AOF) before we go on
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, f"redis-server on port {self.port} exited"
            assert time.monotonic() < deadline, f"redis-server on port {self.port} not ready"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


async def test_redis_outage_routing_catches_up_and_is_never_emptied(
        kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    own = OwnRedis(tmp_path)
    own.start()
    url = f"redis://127.0.0.1:{own.port}/0"
    metrics_port = free_port()
    env = WorkerEnv(unique_name("redis"), kafka_bootstrap, url,
                    extra={"TAILGUARD_METRICS_PORT": str(metrics_port)})
    await env.create_topics()
    r = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    worker = Worker(env.environ(), tmp_path / "worker.log")
    seen: list[set[str]] = []

    async def current() -> set[str]:
        got = await routing(r, env.name, "llm")
        seen.append(got)
        return got
    try:
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES}) as feed:
            async def all_in() -> bool:
                return await current() == set(NODES)
            await wait_for(all_in, 60, "all five nodes routed", worker.tail)
            own.stop()                                      # Redis goes away …
            feed.slow.add(("slow", "llm"))                  # … and then a node degrades

            async def quarantined() -> bool:
                return any(e["node_id"] == "slow" and e["to"] == "quarantined"
                           for e in await health_events(kafka_bootstrap, env))
            await wait_for(quarantined, 60, "a decision while Redis is down", worker.tail)
            assert _metric(metrics_port, "tailguard_redis_write_failures_total") > 0
            assert _metric(metrics_port, "tailguard_samples_in_total") > 0
            assert _metric(metrics_port, "tailguard_series_tracked") == len(NODES)
            assert _metric(metrics_port, "tailguard_evaluation_seconds_count") > 0
            assert _metric(metrics_port, 'tailguard_nodes{model="llm",state="quarantined"}') == 1
            assert 'tailguard_consumer_lag{' in _metrics_body(metrics_port)
            # Cluster-wide latency from the merged stage-1 digests: four nodes at ~1000 µs,
            # one at 3000 µs. (The gauge is absent, and the sum 0, until a tick sets it.)
            p50 = _metric(metrics_port, 'tailguard_cluster_latency_us{model="llm",quantile="0.5"}')
            p99 = _metric(metrics_port, 'tailguard_cluster_latency_us{model="llm",quantile="0.99"}')
            assert 900 < p50 < 1300 and 2000 < p99 < 4000, (p50, p99)
            seen.clear()
            own.start()                                     # Redis is back with its old data
            await r.connection_pool.disconnect()

            async def caught_up() -> bool:
                try:
                    return await current() == HEALTHY
                except (aioredis.ConnectionError, OSError):
                    return False
            await wait_for(caught_up, 60, "the routing set to catch up", worker.tail)
            feed.check()
        assert seen and all(s in (set(NODES), HEALTHY) for s in seen), seen
        assert int(await r.get(f"{env.name}:routing:llm:version")) >= 2
        assert worker.proc.poll() is None, worker.tail()
    finally:
        worker.stop()
        await r.aclose()
        own.stop()


def _local_broker_pid() -> int:
    """The pid of the broker ``scripts/kafka`` started (fails when there is none)."""
    run = Path(os.environ.get("TAILGUARD_RUN") or
               Path(os.environ.get("TMPDIR") or "/tmp") / "tailguard-stack")
    pidfile = run / "kafka.pid"
    assert pidfile.is_file(), f"no {pidfile}: this test freezes the broker scripts/kafka started"
    pid = int(pidfile.read_text().strip())
    os.kill(pid, 0)
    return pid


@pytest.mark.serial        # freezes the shared broker: every other test's Kafka would freeze too
async def test_worker_rides_out_a_frozen_broker_and_keeps_deciding(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with (running_worker(kafka_bootstrap, redis_url, unique_name("freeze"),
                               tmp_path) as (env, r, worker),
                Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES}) as feed):
        async def all_in() -> bool:
            return await routing(r, env.name, "llm") == set(NODES)
        await wait_for(all_in, 60, "all five nodes routed", worker.tail)
        pid = _local_broker_pid()
        os.kill(pid, signal.SIGSTOP)     # the broker stops answering, connections stay open
        try:
            await asyncio.sleep(30)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert worker.proc.poll() is None, worker.tail()
        assert await routing(r, env.name, "llm") == set(NODES)   # nothing emptied meanwhile
        feed.check()
        feed.slow.add(("slow", "llm"))

        async def slow_out() -> bool:
            return await routing(r, env.name, "llm") == HEALTHY
        await wait_for(slow_out, 90, "the node that slowed after the freeze to leave",
                       worker.tail)
