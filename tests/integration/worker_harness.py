"""Helpers for the worker's integration tests: run `tailguard worker` as a subprocess
against the real Kafka and Redis, feed it latency events, read its topics.

Every test gets its own app id, topics and Redis key prefix (``unique_name``),
so tests can run concurrently with others on the shared stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[2]
NODES = ["n0", "n1", "n2", "n3", "slow"]
HEALTHY = {"n0", "n1", "n2", "n3"}
TOPIC_FIELDS = ("latency_events", "window_stats", "health_changes", "fleet_events",
                "diagnostics_requests", "diagnostics_results", "dead_letter", "replacements")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WorkerEnv:
    """The TAILGUARD_* environment of one test's workers."""

    name: str
    kafka: str
    redis_url: str
    extra: dict[str, str] = field(default_factory=dict)

    def topic(self, fld: str) -> str:
        return f"{self.name}-{fld.replace('_', '-')}"

    async def create_topics(self) -> None:
        """Create the test's topics up front (the feeder may start before the worker)."""
        from tailguard.settings import load
        from tailguard.streaming.topics import ensure_topics

        env = {k: v for k, v in self.environ().items() if k.startswith("TAILGUARD_")}
        await ensure_topics(load(env))

    def environ(self, **more: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
        env.update({
            "TAILGUARD_KAFKA_BOOTSTRAP": self.kafka,
            "TAILGUARD_REDIS_URL": self.redis_url,
            "TAILGUARD_APP_ID": self.name,
            "TAILGUARD_KEY_PREFIX": self.name,
            "TAILGUARD_TOPIC_PARTITIONS": "4",
            "TAILGUARD_METRICS_PORT": "0",
            "TAILGUARD_WEB_PORT": "0",
            "TAILGUARD_LOG_LEVEL": "info",
            # 1 s ticks, no warm-up, 2 windows to confirm, long back-off: a
            # quarantined node stays quarantined for the whole test.
            "TAILGUARD_TICK_INTERVAL_S": "1",
            "TAILGUARD_WARMUP_S": "0",
            "TAILGUARD_CONFIRM_WINDOWS": "2",
            "TAILGUARD_MIN_SAMPLES": "50",
            "TAILGUARD_BACKOFF_INITIAL_S": "900",
            "TAILGUARD_BACKOFF_MAX_S": "900",
        })
        for fld in TOPIC_FIELDS:
            env[f"TAILGUARD_TOPIC_{fld.upper()}"] = self.topic(fld)
        env.update(self.extra)
        env.update(more)
        return env


class TailguardProcess:
    """One `python -m tailguard.cli ARGS…` subprocess (worker, scrape, k8s-sync …) with its log file."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", *args], cwd=ROOT,
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


class Worker(TailguardProcess):
    """`tailguard worker` as a subprocess."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__(["worker"], env, log_path)


async def wait_for(pred: Callable[[], Awaitable[Any]], timeout_s: float, what: str,
                   on_fail: Callable[[], str] = lambda: "", every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{on_fail()}")
        await asyncio.sleep(every_s)


async def ticks_written(r: Any, prefix: str, model: str, node: str, n: int, timeout_s: float,
                        on_fail: Callable[[], str] = lambda: "") -> None:
    """Wait until the worker has written ``n`` more stage-2 ticks of ``model``: each tick
    refreshes every node's status with the tick's time (``updated``), so counting the
    distinct times of ``node``'s status counts ticks (instead of sleeping for "a few ticks")."""
    seen: set[float] = set()
    first: list[float] = []

    async def counted() -> bool:
        raw = await r.hget(f"{prefix}:nodes:{model}", node)
        if raw is not None:
            updated = json.loads(raw)["updated"]
            if not first:
                first.append(updated)
            elif updated > first[0]:
                seen.add(updated)
        return len(seen) >= n
    await wait_for(counted, timeout_s, f"{n} stage-2 ticks of {model!r} after now", on_fail,
                   every_s=0.2)


class Feeder:
    """Publishes batch-form latency events for a set of nodes every ``period_s``.

    ``slow``: nodes whose latency is ``slow_factor`` (3) × the others' (P50 far above the peers').
    ``failing``: nodes that also fail as many requests as they serve (a batch with
    ``"ok": false`` next to each good one), at normal latency.
    ``tokens``: nodes whose samples carry request sizes (``[ts, latency_us, input_tokens,
    output_tokens, ttft_us]``: 30 output tokens, the first token at a fifth of the latency).
    ``probing``: nodes whose batches are flagged ``"probe": true`` (a load balancer's probes of
    a quarantined node).
    """

    def __init__(self, kafka: str, topic: str, models: dict[str, list[str]],
                 slow: set[tuple[str, str]] | None = None, period_s: float = 0.25,
                 per_batch: int = 25, failing: set[tuple[str, str]] | None = None,
                 slow_factor: float = 3.0, tokens: set[tuple[str, str]] | None = None) -> None:
        self.kafka, self.topic, self.models = kafka, topic, models
        self.slow = set(slow or ())
        self.failing = set(failing or ())
        self.tokens = set(tokens or ())
        self.probing: set[tuple[str, str]] = set()
        self.period_s, self.per_batch = period_s, per_batch
        self.slow_factor = slow_factor
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.rng = random.Random(7)

    def check(self) -> None:
        """Raise the feeder's own failure, if it failed."""
        if self._task is not None and self._task.done() and not self._task.cancelled():
            self._task.result()

    async def __aenter__(self) -> Feeder:
        self._producer = AIOKafkaProducer(bootstrap_servers=self.kafka, linger_ms=5)
        await self._producer.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._producer.stop()

    async def _run(self) -> None:
        while True:
            now = time.time()
            for model, nodes in self.models.items():
                for node in nodes:
                    base = 1000.0 * (self.slow_factor if (node, model) in self.slow else 1.0)
                    samples: list[list[float]] = [[now, base * self.rng.lognormvariate(0, 0.15)]
                                                  for _ in range(self.per_batch)]
                    if (node, model) in self.tokens:
                        samples = [[t, lat, self.rng.randint(50, 500), 30, lat / 5] for t, lat in samples]
                    probe = {"probe": True} if (node, model) in self.probing else {}
                    await self._producer.send(self.topic, json.dumps(
                        {"node_id": node, "model": model, "hardware": "A100",
                         "samples": samples, **probe}).encode(), key=f"{node}|{model}".encode())
                    self.sent += 1
                    if (node, model) in self.failing:
                        await self._producer.send(self.topic, json.dumps(
                            {"node_id": node, "model": model, "hardware": "A100", "ok": False,
                             "samples": samples}).encode(), key=f"{node}|{model}".encode())
                        self.sent += 1
            await asyncio.sleep(self.period_s)


async def read_topic(kafka: str, topic: str, timeout_s: float = 10.0) -> list[Any]:
    """Every record of ``topic`` up to its end offsets now (no consumer group)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        (desc,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    parts = [p["partition"] for p in desc.get("partitions", [])]
    c = AIOKafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return []
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any([await c.position(tp) < end[tp] for tp in tps]):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end in {timeout_s} s")
            batches = await c.getmany(timeout_ms=500)
            for recs in batches.values():
                out.extend(recs)
        return out
    finally:
        await c.stop()


@contextlib.asynccontextmanager
async def running_worker(kafka: str, redis_url: str, name: str, tmp_path: Path,
                         precreate: dict[str, int] | None = None,
                         extra: dict[str, str] | None = None,
                         ) -> AsyncIterator[tuple[WorkerEnv, Any, Worker]]:
    """A worker on its own topics (``precreate``: topic field → partitions made first;
    ``extra``: more TAILGUARD_* variables)."""
    env = WorkerEnv(name, kafka, redis_url, dict(extra or {}))
    if precreate:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(env.topic(f), n, 1) for f, n in precreate.items()])
        finally:
            await admin.close()
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    worker = Worker(env.environ(), tmp_path / "worker.log")
    try:
        yield env, r, worker
        assert worker.proc.poll() is None, worker.tail()
    finally:
        worker.stop()
        await r.aclose()


async def routing(r: Any, prefix: str, model: str) -> set[str]:
    """The routing SET of ``model`` under key prefix ``prefix``."""
    return {m.decode() for m in await r.smembers(f"{prefix}:routing:{model}")}


async def health_events(kafka: str, env: WorkerEnv, *,
                        weights: bool = False) -> list[dict[str, Any]]:
    """The health-change topic's state changes (and operator announcements), in order;
    ``weights``: its routing-weight events (``"type": "weight"``) instead."""
    recs = await read_topic(kafka, env.topic("health_changes"))
    evs = [json.loads(r.value) for r in sorted(recs, key=lambda r: (r.timestamp, r.offset))]
    return [e for e in evs if (e.get("type") == "weight") == weights]


def tailguard_cli(env: WorkerEnv, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``tailguard ARGS…`` with the test's settings (its Redis key prefix)."""
    return subprocess.run([sys.executable, "-m", "tailguard.cli", *args], cwd=ROOT, env=env.environ(),
                          capture_output=True, text=True, timeout=timeout_s, check=False)


async def produce(kafka: str, topic: str, items: list[tuple[bytes, bytes]]) -> None:
    """Send ``(key, value)`` messages to ``topic`` and wait for each to be acknowledged."""
    p = AIOKafkaProducer(bootstrap_servers=kafka)
    await p.start()
    try:
        for key, value in items:
            await p.send_and_wait(topic, value, key=key)
    finally:
        await p.stop()


def kcat_produce_keyed(kafka: str, topic: str, lines: list[str]) -> None:
    """``kcat -P`` one message per line, ``key<TAB>value`` (the key itself is "node|model")."""
    subprocess.run(["kcat", "-P", "-b", kafka, "-t", topic, "-K", "\t"],
                   input="\n".join(lines) + "\n", text=True, check=True, timeout=30)


class VersionWatch:
    """The routing versions a reader (``version(model)``, as RoutingTable's) served, per model,
    each time it changed: sampled every 50 ms while the context is open, and once at its end."""

    def __init__(self, reader: Any, models: Sequence[str]) -> None:
        self.reader = reader
        self.seen: dict[str, list[int]] = {m: [] for m in models}
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        for m, seen in self.seen.items():
            v = self.reader.version(m)
            if v is not None and (not seen or seen[-1] != v):
                seen.append(v)

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> VersionWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.sample()       # the last version too (the loop may not have run since it was read)


async def last_written_ts(r: Any, nodes_key: str) -> float:
    """The newest ``updated`` (Unix s) of a model's node statuses (the HASH ``nodes_key``,
    written every tick)."""
    raw = await r.hgetall(nodes_key)
    return max((json.loads(v).get("updated") or 0.0 for v in raw.values()), default=0.0)


async def writes_resume_after_failover(promoted: Callable[[], Awaitable[bool]],
                                       written_ts: Callable[[str], Awaitable[float]],
                                       models: Sequence[str], tick_s: float, killed_s: float,
                                       on_fail: Callable[[], str]) -> None:
    """Wait (30 s at most) for ``promoted()``, then assert every model's node statuses are
    written again (``written_ts``) within 2 ticks of the promotion."""
    await wait_for(promoted, 30, "the promotion of a replica", on_fail)
    promoted_s = time.time()

    async def written_again() -> bool:
        return all([await written_ts(m) > promoted_s for m in models])
    await wait_for(written_again, 2 * tick_s + 5, "every model written after the promotion",
                   on_fail)
    assert time.time() - promoted_s <= 2 * tick_s + 1.5, (
        f"writes resumed {time.time() - promoted_s:.1f} s after the promotion "
        f"({promoted_s - killed_s:.1f} s after the kill)")
