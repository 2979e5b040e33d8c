"""The demo: a slow node drags the cluster's P99 up, tailguard takes it out, then lets it back in.

``python -m app.demo`` (or ``./scripts/demo``) runs the real system on
127.0.0.1 against the Kafka and Redis that ``scripts/up`` started, as child
processes of its own:

1. ``tailguard worker`` (the faust service) with short ticks;
2. ``tailguard simulate fleet``: 8 simulated inference nodes (HTTP servers)
   that report every request to Kafka through the emitter SDK; one of them
   (``gpu-node-05``) serves every request 3x slower from ``onset_s`` until
   ``onset_s + degraded_s`` (the scenario file is written from the
   :class:`Plan`);
3. ``tailguard proxy``: the reference load balancer, round-robin over the
   routing set it reads from Redis, with a small probe share for quarantined
   nodes;
4. ``tailguard simulate load``: open-loop Poisson traffic through the proxy,
   measuring the client-side latency (the cluster P99).

While it runs it shows each node's state, P50, P99 and ratio (read from
Redis, ``<prefix>:nodes:<model>``) and the health changes (read from the
``node-health-changes`` topic). At the end it prints the cluster P99 while all
nodes are healthy, while the slow node is still routed, after it was removed,
and after it was re-admitted, and writes a PNG plot (``out/demo.png``).

Guarantees: every run uses its own app id, topics and Redis key prefix
(``tgdemo-<random>``), so runs never collide with each other or with other
users of the stack; the children run in their own sessions and are stopped by
pid on every exit path (end, error, Ctrl-C, SIGTERM), and the run's topics and
Redis keys are deleted. Phase P99s are the median of the load generator's
per-interval client-side P99s over the intervals wholly inside the phase.
The same orchestration (:func:`run_story`) drives the end-to-end test
(``tests/integration/test_e2e_story.py``) with 1-s ticks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp

# The demo is an edge, like app/streaming and app/routing (TID251 bans these only in app/core).
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from redis.exceptions import RedisError

from app import settings as settings_mod
from app.core.config import DetectorSettings
from app.routing.status import ModelStatus, read_status
from app.security import kafka_client_options, redis_client_options
from app.settings import redact_url
from app.sim.scenario import loads as load_scenario
from app.streaming.errors import StreamingError
from app.streaming.topics import ensure_topics

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama-3-70b"
RUN_PREFIX = "tgdemo"


class DemoError(Exception):
    """The demo could not run its story: a child died, the stack is unreachable, a wait timed out."""


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Plan:
    """The story's timeline (seconds of fleet time, 0 = the simulated fleet started) and settings."""

    tick_interval_s: float = 5.0
    confirm_windows: int = 3
    warmup_s: float = 10.0
    window_size: int = 200
    min_samples: int = 100
    probe_min_samples: int = 20
    backoff_initial_s: float = 20.0
    nodes: int = 8
    slow_node: str = "gpu-node-05"
    slowdown: float = 3.0
    p50_ms: float = 180.0
    sigma: float = 0.3
    rate_per_s: float = 160.0          # client requests/s through the proxy, all nodes together
    probe_share: float = 0.02
    onset_s: float = 60.0              # the slow node degrades
    degraded_s: float | None = 30.0    # ... for this long (None: for good)
    interval_s: float = 2.5            # the load generator's reporting interval
    refresh_s: float = 2.5             # how often the table is refreshed
    settle_s: float = 15.0             # keep measuring this long after re-admission
    deadline_s: float = 200.0          # give up at this fleet time

    def __post_init__(self) -> None:
        self.detector()  # validates
        if not 1 <= int(self.slow_node.rsplit("-", 1)[-1]) <= self.nodes:
            raise ValueError(f"slow_node={self.slow_node!r} is not one of gpu-node-01..{self.nodes:02d}")
        if self.degraded_s is not None and self.degraded_s <= 0:
            raise ValueError(f"degraded_s={self.degraded_s!r} must be > 0 or None")
        if self.onset_s <= self.warmup_s + 2 * self.interval_s:
            raise ValueError(f"onset_s={self.onset_s} leaves no healthy phase after warm-up ({self.warmup_s} s)")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(f"gpu-node-{i:02d}" for i in range(1, self.nodes + 1))

    @property
    def end_s(self) -> float | None:
        return None if self.degraded_s is None else self.onset_s + self.degraded_s

    def detector(self) -> DetectorSettings:
        return DetectorSettings().replace(
            tick_interval_s=self.tick_interval_s, confirm_windows=self.confirm_windows, warmup_s=self.warmup_s,
            window_size=self.window_size, min_samples=self.min_samples,
            probe_min_samples=self.probe_min_samples, backoff_initial_s=self.backoff_initial_s,
            max_sample_age_s=10 * self.tick_interval_s,
            backoff_max_s=max(self.backoff_initial_s, DetectorSettings().backoff_max_s))

    def scenario_toml(self) -> str:
        """The fleet's scenario file (see ``app/sim/scenario.py`` for the format)."""
        end = "" if self.end_s is None else f"end_s = {self.end_s:g}\n"
        recover = "" if self.end_s is None else f", recovers at {self.end_s:g} s"
        return (
            f'description = "tailguard demo: {self.slow_node} serves every request {self.slowdown:g}x slower '
            f'from {self.onset_s:g} s{recover}."\n'
            f"duration_s = {self.deadline_s + 60:g}\n"
            f"rate_per_s = {self.rate_per_s / self.nodes:g}\n\n"
            f'[[models]]\nname = "{MODEL}"\np50_ms = {self.p50_ms:g}\nsigma = {self.sigma:g}\n\n'
            f'[nodes]\ncount = {self.nodes}\nhardware = "A100"\n\n'
            f'[[faults]]\nnode = "{self.slow_node}"\nkind = "slowdown"\nonset_s = {self.onset_s:g}\n{end}'
            f"factor = {self.slowdown:g}\n")


DEMO_PLAN = Plan()
#: The end-to-end test's plan: the same story with 1-s ticks, as short as the windows allow.
TEST_PLAN = Plan(tick_interval_s=1.0, confirm_windows=3, warmup_s=3.0, window_size=100, min_samples=50,
                 backoff_initial_s=8.0, rate_per_s=200.0, onset_s=20.0, degraded_s=10.0, interval_s=1.0,
                 refresh_s=1.0, settle_s=5.0, deadline_s=110.0)

_WHY = {
    "tick_interval_s": "evaluate every {v:g} s instead of 30 s, so the story fits in a few minutes",
    "confirm_windows": "a node must look slow in {v} consecutive windows ({c:g} s here) before it is removed",
    "warmup_s": "simulated nodes need no CUDA/weights warm-up, so new nodes are judged after {v:g} s",
    "window_size": "{v} samples span ~{w:.0f} s of this traffic ({r:g} req/s per node); 1000 would span "
                   "{k:.0f} s, longer than the slowdown lasts",
    "min_samples": "a P99 needs at least this many samples",
    "max_sample_age_s": "samples older than 10 ticks are not judged, as 300 s is 10 ticks of 30 s",
    "probe_min_samples": "probe requests needed before a removed node is judged again",
    "backoff_initial_s": "a removed node gets no traffic for {v:g} s, then a {p:.0%} probe share "
                         "(shorter, so that re-admission fits in the run)",
    "backoff_max_s": "(cap of the growing back-off)",
}


def settings_lines(plan: Plan) -> list[str]:
    """What the screen says about the detector settings used, and why they differ from the defaults."""
    d, default = plan.detector(), DetectorSettings()
    per_node = plan.rate_per_s / plan.nodes
    span_s = plan.window_size / per_node
    lines = []
    for name in ("tick_interval_s", "confirm_windows", "warmup_s", "window_size", "min_samples",
                 "max_sample_age_s", "probe_min_samples", "backoff_initial_s"):
        v, dv = getattr(d, name), getattr(default, name)
        why = _WHY[name].format(v=v, c=plan.confirm_windows * plan.tick_interval_s, w=span_s, r=per_node,
                                k=1000 / per_node, p=plan.probe_share)
        mark = "  " if v == dv else "* "
        lines.append(f"  {mark}{name:<18} = {v:<6g} (default {dv:g}): {why}")
    return lines


# --------------------------------------------------------------------------- names and environment


@dataclass(frozen=True, slots=True)
class RunNames:
    """Unique names of one run: app id (= consumer group), key prefix and topic names."""

    base: str

    @classmethod
    def new(cls) -> RunNames:
        return cls(f"{RUN_PREFIX}-{uuid.uuid4().hex[:10]}")

    def topic(self, field_name: str) -> str:
        return f"{self.base}-{field_name.replace('_', '-')}"


def child_env(plan: Plan, names: RunNames, kafka_bootstrap: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    """The TAILGUARD_* environment of every child: this run's names, the plan's detector settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(settings_mod.PREFIX)}
    env.update({
        "TAILGUARD_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TAILGUARD_REDIS_URL": redis_url,
        "TAILGUARD_APP_ID": names.base,
        "TAILGUARD_KEY_PREFIX": names.base,
        "TAILGUARD_TOPIC_PARTITIONS": "2",
        "TAILGUARD_METRICS_PORT": "0",
        "TAILGUARD_WEB_PORT": str(free_port()),
        "TAILGUARD_DATA_DIR": str(data_dir),
        "TAILGUARD_LOG_LEVEL": "info",
        "PYTHONUNBUFFERED": "1",
    })
    for f in dataclasses.fields(settings_mod.Topics):
        env[f"TAILGUARD_TOPIC_{f.name.upper()}"] = names.topic(f.name)
    d, default = plan.detector(), DetectorSettings()
    for f in dataclasses.fields(DetectorSettings):
        if getattr(d, f.name) != getattr(default, f.name):
            env[settings_mod.PREFIX + f.name.upper()] = str(getattr(d, f.name))
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- child processes


class Child:
    """One child process in a session of its own, output to a log file; stopped by pid."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(f"    {line}" for line in text)

    def check(self) -> None:
        if not self.alive():
            raise DemoError(f"{self.name} exited with code {self.proc.returncode}; "
                            f"its log ({self.log_path}) ends:\n{self.tail()}")

    async def stop(self, timeout_s: float = 15.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self.alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if self.alive():
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._log.close()


def tailguard_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


async def wait_until(pred: Callable[[], Any], timeout_s: float, what: str, children: Sequence[Child] = (),
                     every_s: float = 0.25) -> Any:
    """Await ``pred()`` (sync or async) until truthy; fail naming ``what`` (and a dead child's log)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for c in children:
            c.check()
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            logs = "".join(f"\n  {c.name} log ({c.log_path}) ends:\n{c.tail(12)}" for c in children)
            raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}{logs}")
        await asyncio.sleep(every_s)


async def _group_stable(admin: AIOKafkaAdminClient, group: str) -> bool:
    if group not in {g[0] for g in await admin.list_consumer_groups()}:
        return False
    for response in await admin.describe_consumer_groups([group]):
        for g in response.to_object()["groups"]:
            if g["group"] == group and g["error_code"] == 0 and g["state"] == "Stable" and g["members"]:
                return True
    return False


# --------------------------------------------------------------------------- the running stack

Progress = Callable[[str], None]


@dataclass
class Stack:
    """The running children of one story and where to reach them."""

    plan: Plan
    names: RunNames
    settings: settings_mod.Settings
    run_dir: Path
    children: list[Child] = field(default_factory=list)
    fleet_t0: float = 0.0             # wall-clock time of fleet time 0
    proxy_url: str = ""
    load_path: Path = Path()
    topics_created: bool = False

    def check(self) -> None:
        for c in self.children:
            if c.name != "load generator":    # the load generator may finish on its own
                c.check()

    def fleet_time(self, wall_ts: float) -> float:
        return wall_ts - self.fleet_t0


@contextlib.asynccontextmanager
async def running_stack(plan: Plan, *, kafka_bootstrap: str, redis_url: str, run_dir: Path,
                        progress: Progress) -> AsyncIterator[Stack]:
    """Start worker, fleet, proxy and load generator; stop them and delete the run's topics and keys."""
    names = RunNames.new()
    env = child_env(plan, names, kafka_bootstrap, redis_url, run_dir / "worker-data")
    settings = settings_mod.load(environ=env)
    stack = Stack(plan, names, settings, run_dir)
    try:
        await _start(stack, env, progress)
        yield stack
    finally:
        progress("stopping the load generator, proxy, fleet and worker")
        for c in reversed(stack.children):
            await c.stop()
        await _delete_run_data(stack, progress)


async def _start(stack: Stack, env: dict[str, str], progress: Progress) -> None:
    plan, names, st, d = stack.plan, stack.names, stack.settings, stack.run_dir
    progress(f"run {names.base}: topics {names.base}-*, Redis keys {names.base}:*, logs in {d}")
    r = aioredis.Redis.from_url(st.redis_url, socket_connect_timeout=3, **redis_client_options(st))
    try:
        await r.ping()
    except RedisError as e:
        raise DemoError(f"Redis is unreachable at TAILGUARD_REDIS_URL={redact_url(st.redis_url)} ({e}); "
                        "start the local stack with scripts/up") from None
    finally:
        await r.aclose()
    progress(f"creating Kafka topics at {st.kafka_bootstrap}")
    try:
        await ensure_topics(st, timeout_s=10)
        stack.topics_created = True
    except StreamingError as e:
        raise DemoError(f"{e} (start the local stack with scripts/up)") from None

    progress("starting the worker (tailguard worker) and waiting until it has joined its consumer groups")
    worker = Child("worker", tailguard_cmd("worker"), env, d / "worker.log")
    stack.children.append(worker)
    admin = AIOKafkaAdminClient(bootstrap_servers=st.kafka_bootstrap, **kafka_client_options(st))
    await admin.start()
    try:
        for group in (f"{st.app_id}-stage1", st.app_id):
            await wait_until(functools.partial(_group_stable, admin, group), 120,
                             f"the worker to join group {group}", [worker], every_s=0.5)
    finally:
        await admin.close()

    scenario = d / "scenario.toml"
    scenario.write_text(plan.scenario_toml(), encoding="utf-8")
    load_scenario(scenario.read_text(encoding="utf-8"), source=str(scenario))  # fail here, not in the child
    backends = d / "backends.txt"
    progress(f"starting {plan.nodes} simulated nodes (tailguard simulate fleet {scenario.name})")
    fleet = Child("fleet", tailguard_cmd("simulate", "fleet", str(scenario), "--base-port", "0",
                                         "--backends-file", str(backends), "--heartbeat-interval-s", "2",
                                         "--duration-s", str(plan.deadline_s + 60)), env, d / "fleet.log")
    stack.children.append(fleet)

    def listening() -> list[str]:
        lines = backends.read_text().split() if backends.exists() else []
        return lines if len(lines) == plan.nodes else []
    first_url = (await wait_until(listening, 60, f"{plan.nodes} nodes to listen", [fleet]))[0].split("=", 1)[1]
    async with aiohttp.ClientSession() as http:
        t_req = time.time()
        async with http.get(first_url + "/healthz") as resp:
            scenario_time_s = float((await resp.json())["scenario_time_s"])
        stack.fleet_t0 = (t_req + time.time()) / 2 - scenario_time_s

    port = free_port()
    stack.proxy_url = f"http://127.0.0.1:{port}"
    progress(f"starting the reference load balancer (tailguard proxy) on {stack.proxy_url}, "
             f"probe share {plan.probe_share:.0%}")
    proxy = Child("proxy", tailguard_cmd("proxy", "--listen", f"127.0.0.1:{port}", "--backends", str(backends),
                                         "--probe-share", str(plan.probe_share)), env, d / "proxy.log")
    stack.children.append(proxy)

    async def proxy_up() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(stack.proxy_url + "/_tailguard/health") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False
    await wait_until(proxy_up, 30, "the proxy to answer", [proxy])

    stack.load_path = d / "load.jsonl"
    progress(f"starting the load generator: {plan.rate_per_s:g} req/s (Poisson) through the proxy")
    stack.children.append(Child("load generator", tailguard_cmd(
        "simulate", "load", "--target", stack.proxy_url, "--rate", str(plan.rate_per_s),
        "--duration", str(plan.deadline_s + 30), "--model", MODEL, "--interval-s", str(plan.interval_s),
        "--out", str(stack.load_path), "--seed", "7"), env, d / "load.log"))


async def _delete_run_data(stack: Stack, progress: Progress) -> None:
    """Delete this run's topics (incl. faust's changelogs) and Redis keys; never fails the demo."""
    st = stack.settings
    if not stack.topics_created:     # nothing was started, nothing to delete
        return
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=st.kafka_bootstrap, **kafka_client_options(st))
        await asyncio.wait_for(admin.start(), 10)
        try:
            mine = [t for t in await admin.list_topics() if t.startswith(stack.names.base + "-")]
            if mine:
                await asyncio.wait_for(admin.delete_topics(mine), 20)
        finally:
            await admin.close()
        r = aioredis.Redis.from_url(st.redis_url, **redis_client_options(st))
        try:
            keys = [k async for k in r.scan_iter(match=f"{st.key_prefix}:*")]
            if keys:
                await r.delete(*keys)
        finally:
            await r.aclose()
        progress(f"deleted {len(mine)} topics and {len(keys)} Redis keys of run {stack.names.base}")
    except Exception as e:  # cleanup is best effort: say what is left behind
        progress(f"could not delete everything of run {stack.names.base} ({type(e).__name__}: {e}); "
                 f"its topics and keys start with {stack.names.base}")
    shutil.rmtree(stack.run_dir / "worker-data", ignore_errors=True)


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True, slots=True)
class Interval:
    """One load-generator interval, in fleet time."""

    t0_s: float
    t1_s: float
    completed: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    by_node: dict[str, int]


@dataclass(frozen=True, slots=True)
class NodeView:
    state: str
    routed: bool
    p50_ms: float | None
    p99_ms: float | None
    ratio: float | None
    samples: int
    probe_after_s: float | None     # fleet time


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The model's status in Redis at one moment (fleet time)."""

    t_s: float
    nodes: dict[str, NodeView]
    routing: frozenset[str]


@dataclass(frozen=True, slots=True)
class HealthChange:
    """One health-change event (topic ``node-health-changes``), its time in fleet time."""

    t_s: float
    node_id: str
    from_state: str
    to_state: str
    routed: bool
    reason: str
    p50_ms: float | None
    p99_ms: float | None
    ratio: float | None
    peers_p50_ms: float | None
    detail: str | None

    @classmethod
    def from_event(cls, ev: dict[str, Any], t0: float) -> HealthChange:
        def ms(key: str) -> float | None:
            v = ev.get(key)
            return float(v) / 1e3 if isinstance(v, int | float) else None
        ratio = ev.get("ratio")
        return cls(float(ev["ts"]) - t0, str(ev["node_id"]), str(ev["from"]), str(ev["to"]), bool(ev["routed"]),
                   str(ev.get("reason") or ""), ms("p50_us"), ms("p99_us"),
                   float(ratio) if isinstance(ratio, int | float) else None,
                   ms("peers_p50") if ev.get("signal") in (None, "latency") else None, ev.get("detail"))

    def describe(self) -> str:
        nums = []
        if self.p50_ms is not None:
            nums.append(f"P50 {self.p50_ms:.0f} ms")
        if self.peers_p50_ms is not None:
            nums.append(f"peers' P50 {self.peers_p50_ms:.0f} ms")
        if self.p99_ms is not None:
            nums.append(f"P99 {self.p99_ms:.0f} ms")
        if self.ratio is not None:
            nums.append(f"P99/P50 {self.ratio:.2f}")
        tail = f" [{', '.join(nums)}]" if nums else ""
        return (f"t={self.t_s:6.1f}s  {self.node_id}: {self.from_state} -> {self.to_state}"
                f" ({self.reason}{'' if self.routed else ', out of routing'}){tail}")


@dataclass
class Observations:
    """Everything seen during the run, in fleet time."""

    intervals: list[Interval] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    changes: list[HealthChange] = field(default_factory=list)
    load_start_s: float | None = None


def parse_interval(line: dict[str, Any], t0: float, interval_s: float) -> Interval:
    t1 = float(line["ts"]) - t0
    return Interval(t1 - interval_s, t1, int(line["completed"]), int(line["errors"]),
                    line.get("p50_ms"), line.get("p99_ms"), dict(line.get("by_node") or {}))


def node_view(obj: dict[str, Any], t0: float) -> NodeView:
    def ms(key: str) -> float | None:
        v = obj.get(key)
        return float(v) / 1e3 if isinstance(v, int | float) and not isinstance(v, bool) else None
    ratio, pa = obj.get("ratio"), obj.get("probe_after")
    return NodeView(str(obj.get("state", "?")), bool(obj.get("routed")), ms("p50_us"), ms("p99_us"),
                    float(ratio) if isinstance(ratio, int | float) else None, int(obj.get("samples") or 0),
                    float(pa) - t0 if isinstance(pa, int | float) else None)


async def topic_partitions(bootstrap: str, topic: str, timeout_s: float = 15.0,
                           options: Mapping[str, Any] | None = None) -> list[int]:
    """The partitions of ``topic``, asked of the broker (a plain consumer's metadata can lag behind).

    ``options``: aiokafka security options (:func:`app.security.kafka_client_options`).
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(options or {}))
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            for t in await admin.describe_topics([topic]):
                if t["topic"] == topic and t["error_code"] == 0 and t["partitions"]:
                    return sorted(int(p["partition"]) for p in t["partitions"])
            if time.monotonic() > deadline:
                raise DemoError(f"topic {topic} has no partitions after {timeout_s:.0f} s")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


class HealthFeed:
    """Reads the run's health-change topic from the beginning, in the background."""

    def __init__(self, bootstrap: str, topic: str, t0: float,
                 options: Mapping[str, Any] | None = None) -> None:
        self._options = dict(options or {})
        self._c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **self._options)
        self._bootstrap, self._topic, self._t0 = bootstrap, topic, t0
        self.changes: list[HealthChange] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HealthFeed:
        parts = await topic_partitions(self._bootstrap, self._topic, options=self._options)
        tps = [TopicPartition(self._topic, p) for p in parts]
        await self._c.start()
        self._c.assign(tps)
        await self._c.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self._c.getmany(timeout_ms=500)
            for recs in batches.values():
                for rec in recs:
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        self.changes.append(HealthChange.from_event(json.loads(rec.value), self._t0))

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._c.stop()


# --------------------------------------------------------------------------- the story


@dataclass(frozen=True, slots=True)
class Phase:
    """Client-side latency over one phase: medians of the per-interval P50/P99 wholly inside it."""

    label: str
    t0_s: float
    t1_s: float
    intervals: int
    requests: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Story:
    """What happened, in fleet time; ``None`` for what did not happen."""

    plan: Plan
    healthy: Phase
    degraded: Phase
    removed: Phase
    readmitted: Phase
    suspect_s: float | None
    removed_s: float | None
    removal: HealthChange | None
    probe_after_s: float | None
    readmitted_s: float | None
    readmission: HealthChange | None
    reejected_s: float | None          # removed again after re-admission (it had recovered)
    probe_failures: tuple[HealthChange, ...]
    others_removed: tuple[str, ...]
    errors: int
    obs: Observations
    end_s: float

    @property
    def weak_link_factor(self) -> float | None:
        return _ratio(self.degraded.p99_ms, self.healthy.p99_ms)

    @property
    def cured_factor(self) -> float | None:
        return _ratio(self.removed.p99_ms, self.healthy.p99_ms)

    @property
    def complete(self) -> bool:
        """The node was removed, the P99 came back within 20 %, and (if it recovered) it was re-admitted."""
        cured = self.cured_factor
        return (self.removed_s is not None and cured is not None and abs(cured - 1) <= 0.2
                and not self.others_removed and self.reejected_s is None
                and (self.plan.end_s is None or self.readmitted_s is not None))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def phase(label: str, intervals: Sequence[Interval], t0_s: float, t1_s: float) -> Phase:
    inside = [iv for iv in intervals if iv.t0_s >= t0_s - 1e-6 and iv.t1_s <= t1_s + 1e-6 and iv.completed]
    p99 = [iv.p99_ms for iv in inside if iv.p99_ms is not None]
    p50 = [iv.p50_ms for iv in inside if iv.p50_ms is not None]
    return Phase(label, t0_s, t1_s, len(inside), sum(iv.completed for iv in inside),
                 statistics.median(p50) if p50 else None, statistics.median(p99) if p99 else None)


def analyze(plan: Plan, obs: Observations, end_s: float) -> Story:
    """Cut the run into phases at the slow node's health changes (pure: no I/O)."""
    slow = [c for c in obs.changes if c.node_id == plan.slow_node]
    after_onset = [c for c in slow if c.t_s >= plan.onset_s]
    suspect = next((c.t_s for c in after_onset if c.to_state == "suspect"), None)
    removal = next((c for c in after_onset if not c.routed and c.from_state in ("healthy", "suspect", "unhealthy")),
                   None)
    removed_s = removal.t_s if removal is not None else None
    readmission = None
    if removal is not None:
        readmission = next((c for c in slow if c.t_s > removal.t_s and c.routed and c.to_state == "healthy"), None)
    readmitted_s = readmission.t_s if readmission is not None else None
    reejected_s = None
    if readmission is not None:
        reejected_s = next((c.t_s for c in slow if c.t_s > readmission.t_s and not c.routed), None)
    probe_after = None
    if removed_s is not None:
        seen = [v.probe_after_s for s in obs.snapshots if s.t_s >= removed_s
                for n, v in s.nodes.items() if n == plan.slow_node and v.probe_after_s is not None]
        probe_after = min(seen) if seen else removed_s + plan.backoff_initial_s
    lag = 1.0      # the proxy learns a routing change within its poll interval (1 s; pub/sub is faster)
    skip = max(2 * plan.interval_s, 3.0)   # the first seconds of load include connection set-up
    healthy = phase("all nodes healthy", obs.intervals, (obs.load_start_s or 0.0) + skip, plan.onset_s)
    deg_end = removed_s + lag if removed_s is not None else end_s
    degraded = phase(f"{plan.slow_node} {plan.slowdown:g}x slower, still routed", obs.intervals,
                     plan.onset_s, deg_end)
    removed = phase(f"{plan.slow_node} removed", [], end_s, end_s)
    if removed_s is not None and probe_after is not None:
        # Probes reach the node from probe_after on: they are client requests too, so they count
        # only once the node has recovered.
        recovered_first = plan.end_s is not None and plan.end_s <= probe_after
        out_end = (readmitted_s if readmitted_s is not None else end_s) if recovered_first else probe_after
        removed = phase(f"{plan.slow_node} removed", obs.intervals, removed_s + lag, out_end)
    back = phase(f"{plan.slow_node} re-admitted", [], end_s, end_s)
    if readmitted_s is not None:
        back = phase(f"{plan.slow_node} re-admitted", obs.intervals, readmitted_s + lag,
                     reejected_s if reejected_s is not None else end_s)
    failed = tuple(c for c in slow if removed_s is not None and c.t_s > removed_s and c.reason == "probe_failed"
                   and (readmitted_s is None or c.t_s < readmitted_s))
    others = tuple(sorted({c.node_id for c in obs.changes if c.node_id != plan.slow_node and not c.routed}))
    return Story(plan, healthy, degraded, removed, back, suspect, removed_s, removal, probe_after,
                 readmitted_s, readmission, reejected_s, failed, others, sum(iv.errors for iv in obs.intervals), obs,
                 end_s)


def save_run(story: Story, path: Path) -> None:
    """The run's plan and raw observations as JSON (``--replot`` re-reads it)."""
    obs = story.obs
    data = {"plan": dataclasses.asdict(story.plan), "end_s": story.end_s, "load_start_s": obs.load_start_s,
            "intervals": [dataclasses.asdict(iv) for iv in obs.intervals],
            "snapshots": [{"t_s": sn.t_s, "routing": sorted(sn.routing),
                           "nodes": {n: dataclasses.asdict(v) for n, v in sn.nodes.items()}} for sn in obs.snapshots],
            "changes": [dataclasses.asdict(c) for c in obs.changes]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")


def load_run(path: Path) -> Story:
    """Inverse of :func:`save_run`: the story re-analysed from the saved observations."""
    d = json.loads(path.read_text(encoding="utf-8"))
    obs = Observations(
        intervals=[Interval(**iv) for iv in d["intervals"]],
        snapshots=[Snapshot(sn["t_s"], {n: NodeView(**v) for n, v in sn["nodes"].items()},
                            frozenset(sn["routing"])) for sn in d["snapshots"]],
        changes=[HealthChange(**c) for c in d["changes"]], load_start_s=d["load_start_s"])
    return analyze(Plan(**d["plan"]), obs, float(d["end_s"]))


def story_done(plan: Plan, obs: Observations, now_s: float) -> bool:
    """Enough seen: removed, and re-admitted (when the node recovers) ``settle_s`` ago."""
    s = analyze(plan, obs, now_s)
    if s.removed_s is None:
        return False
    if plan.end_s is None:
        return now_s >= s.removed_s + plan.backoff_initial_s
    return s.readmitted_s is not None and now_s >= s.readmitted_s + plan.settle_s


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True, slots=True)
class View:
    """What the screen shows at one refresh."""

    t_s: float
    phase: str
    snapshot: Snapshot | None
    last: Interval | None
    changes: tuple[HealthChange, ...]


Show = Callable[[View], None]


def current_phase(plan: Plan, obs: Observations, t_s: float) -> str:
    if t_s < plan.onset_s:
        return f"healthy phase: {plan.slow_node} degrades at t={plan.onset_s:g}s"
    s = analyze(plan, obs, t_s)
    if s.removed_s is None:
        if plan.end_s is not None and t_s >= plan.end_s:
            return f"{plan.slow_node} recovered before it was removed"
        return f"{plan.slow_node} is {plan.slowdown:g}x slower and still routed: waiting for tailguard"
    if s.readmitted_s is not None:
        return f"{plan.slow_node} re-admitted at t={s.readmitted_s:.0f}s: measuring"
    rec = ("" if plan.end_s is None or t_s < plan.end_s
           else f"; it recovered at t={plan.end_s:g}s, probes follow")
    return f"{plan.slow_node} removed at t={s.removed_s:.0f}s (quarantined){rec}"


async def observe(stack: Stack, obs: Observations, show: Show) -> float:
    """Refresh every ``refresh_s`` until the story is complete or the deadline; returns the end (fleet time)."""
    plan, st = stack.plan, stack.settings
    r = aioredis.Redis.from_url(st.redis_url, **redis_client_options(st))
    read = 0
    try:
        async with HealthFeed(st.kafka_bootstrap, st.topics.health_changes, stack.fleet_t0,
                              kafka_client_options(st)) as feed:
            while True:
                stack.check()
                now_s = stack.fleet_time(time.time())
                if stack.load_path.exists():
                    with stack.load_path.open(encoding="utf-8") as f:
                        lines = f.read().splitlines()
                    for raw in lines[read:]:
                        if raw.endswith("}"):
                            line = json.loads(raw)
                            obs.intervals.append(parse_interval(line, stack.fleet_t0, plan.interval_s))
                            if obs.load_start_s is None:
                                obs.load_start_s = obs.intervals[-1].t0_s
                            read += 1
                statuses = await read_status(r, st.key_prefix, [MODEL])
                snap = snapshot_of(statuses, now_s, stack.fleet_t0)
                if snap is not None:
                    obs.snapshots.append(snap)
                obs.changes = list(feed.changes)
                show(View(now_s, current_phase(plan, obs, now_s), snap,
                          obs.intervals[-1] if obs.intervals else None, tuple(obs.changes)))
                if story_done(plan, obs, now_s) or now_s >= plan.deadline_s:
                    return now_s
                await asyncio.sleep(plan.refresh_s)
    finally:
        await r.aclose()


def snapshot_of(statuses: Sequence[ModelStatus], t_s: float, t0: float) -> Snapshot | None:
    for ms in statuses:
        if ms.model == MODEL and ms.nodes:
            return Snapshot(t_s, {n: node_view(v, t0) for n, v in ms.nodes.items()}, ms.routing)
    return None


async def run_story(plan: Plan, *, kafka_bootstrap: str, redis_url: str, run_dir: Path,
                    progress: Progress = lambda _m: None, show: Show = lambda _v: None) -> Story:
    """Run the whole story once against the real stack; returns what happened (see :func:`analyze`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    obs = Observations()
    async with running_stack(plan, kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, run_dir=run_dir,
                             progress=progress) as stack:
        progress(f"fleet time 0 = {time.strftime('%H:%M:%S', time.localtime(stack.fleet_t0))}; "
                 f"{plan.slow_node} degrades at t={plan.onset_s:g}s"
                 + ("" if plan.end_s is None else f" and recovers at t={plan.end_s:g}s"))
        end_s = await observe(stack, obs, show)
    return analyze(plan, obs, end_s)


# --------------------------------------------------------------------------- screen


def _f(x: float | None, fmt: str = ".0f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def render_table(plan: Plan, view: View) -> list[str]:
    """The node table and the latest client-side numbers."""
    out = [f"t = {view.t_s:5.1f} s   {view.phase}"]
    if view.last is not None:
        out.append(f"cluster (client-side, last {plan.interval_s:g} s): P50 {_f(view.last.p50_ms)} ms, "
                   f"P99 {_f(view.last.p99_ms)} ms, {view.last.completed} requests, {view.last.errors} errors")
    out.append(f"{'node':<13}{'state':<13}{'routed':<8}{'P50 ms':>8}{'P99 ms':>8}{'P99/P50':>9}{'samples':>9}"
               f"{'req/interval':>14}")
    snap = view.snapshot
    for n in plan.node_ids:
        v = snap.nodes.get(n) if snap is not None else None
        served = view.last.by_node.get(n, 0) if view.last is not None else 0
        if v is None:
            out.append(f"{n:<13}{'(not yet)':<13}{'-':<8}{'-':>8}{'-':>8}{'-':>9}{'-':>9}{served:>14}")
            continue
        routed = "yes" if snap is not None and n in snap.routing else "NO"
        mark = " <" if n == plan.slow_node else ""
        out.append(f"{n:<13}{v.state:<13}{routed:<8}{_f(v.p50_ms):>8}{_f(v.p99_ms):>8}{_f(v.ratio, '.2f'):>9}"
                   f"{v.samples:>9}{served:>14}{mark}")
    return out


def compact_line(plan: Plan, view: View) -> str:
    """One line per refresh when stdout is not a terminal: nodes grouped by state, the slow node in full."""
    snap = view.snapshot
    parts = [f"t={view.t_s:5.1f}s", f"cluster P99 {_f(view.last.p99_ms if view.last else None)} ms"]
    if snap is None:
        return " | ".join([*parts, "no node statuses in Redis yet"])
    parts.append(f"routed {len(snap.routing)}/{plan.nodes}")
    groups: dict[str, list[NodeView]] = {}
    for n, v in sorted(snap.nodes.items()):
        if n != plan.slow_node:
            groups.setdefault(v.state + ("" if n in snap.routing else " (out)"), []).append(v)
    for state, views in groups.items():
        p50s = [v.p50_ms for v in views if v.p50_ms is not None]
        rng = f" (P50 {min(p50s):.0f}-{max(p50s):.0f} ms)" if p50s else ""
        parts.append(f"{len(views)} {state}{rng}")
    slow = snap.nodes.get(plan.slow_node)
    if slow is not None:
        parts.append(f"{plan.slow_node}: {slow.state}{'' if plan.slow_node in snap.routing else ' (out)'} "
                     f"P50 {_f(slow.p50_ms)} P99 {_f(slow.p99_ms)} ms ratio {_f(slow.ratio, '.2f')}")
    return " | ".join(parts)


class Screen:
    """Live output: a redrawn table on a terminal, compact lines otherwise."""

    def __init__(self, plan: Plan, out: TextIO) -> None:
        self.plan, self.out = plan, out
        self.tty = out.isatty()
        self.log: list[str] = []
        self._shown_changes = 0

    def progress(self, msg: str) -> None:
        line = f"[demo {time.strftime('%H:%M:%S')}] {msg}"
        self.log.append(line)
        print(line, file=self.out, flush=True)

    def show(self, view: View) -> None:
        new = view.changes[self._shown_changes:]
        self._shown_changes = len(view.changes)
        if not self.tty:
            print(compact_line(self.plan, view), file=self.out)
            for c in new:
                print(f"  health change: {c.describe()}", file=self.out)
            self.out.flush()
            return
        pl = self.plan
        lines = [f"tailguard demo — one slow node among {pl.nodes} (Ctrl-C stops and cleans up)",
                 f"short-tick settings: tick {pl.tick_interval_s:g} s (default 30), confirm_windows "
                 f"{pl.confirm_windows}, warm-up {pl.warmup_s:g} s, window {pl.window_size} samples, "
                 f"back-off {pl.backoff_initial_s:g} s (why: see the lines printed before this table)", ""]
        lines += render_table(self.plan, view)
        lines += ["", "health changes (topic node-health-changes):"]
        lines += [f"  {c.describe()}" for c in view.changes[-8:]] or ["  (none yet)"]
        lines += ["", *self.log[-3:]]
        self.out.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        self.out.flush()


# --------------------------------------------------------------------------- report and plot


def _phase_line(p: Phase, healthy: Phase | None = None) -> str:
    if p.p99_ms is None:
        return f"  {p.label + ':':<44} (not measured)"
    rel = ""
    if healthy is not None and healthy.p99_ms:
        rel = f"  = {p.p99_ms / healthy.p99_ms:.2f}x healthy"
    return (f"  {p.label + ':':<44} P99 {p.p99_ms:6.0f} ms  (P50 {_f(p.p50_ms)} ms; t={p.t0_s:.0f}-{p.t1_s:.0f}s, "
            f"{p.requests} requests){rel}")


def render_report(s: Story) -> str:
    plan = s.plan
    lines = ["", "=" * 78, "tailguard demo — the weak-link effect and its cure, in numbers", "=" * 78,
             f"{plan.nodes} nodes serving {MODEL} (P50 {plan.p50_ms:g} ms), round-robin by the reference proxy, "
             f"{plan.rate_per_s:g} req/s;",
             f"{plan.slow_node} serves every request {plan.slowdown:g}x slower from t={plan.onset_s:g}s"
             + ("" if plan.end_s is None else f" to t={plan.end_s:g}s") + f"; tick {plan.tick_interval_s:g} s.",
             "", "cluster latency, client-side (median of the load generator's "
             f"{plan.interval_s:g}-s interval P99s in each phase):",
             _phase_line(s.healthy), _phase_line(s.degraded, s.healthy), _phase_line(s.removed, s.healthy)]
    if plan.end_s is not None:
        lines.append(_phase_line(s.readmitted, s.healthy))
    lines.append("")
    if s.removal is not None and s.removed_s is not None:
        r = s.removal
        lines.append(f"removed: {plan.slow_node} left the routing set at t={s.removed_s:.1f}s, "
                     f"{s.removed_s - plan.onset_s:.1f} s after it slowed down"
                     + (f" (suspect from t={s.suspect_s:.1f}s)" if s.suspect_s is not None else "") + ".")
        lines.append(f"  why: {r.reason}" + (f" — {r.detail}" if r.detail else ""))
        lines.append(f"  health change: {r.describe()}")
    else:
        lines.append(f"removed: {plan.slow_node} was NOT removed before the run ended.")
    if plan.end_s is not None:
        if s.readmission is not None and s.readmitted_s is not None:
            lines.append(f"re-admitted: at t={s.readmitted_s:.1f}s ({s.readmitted_s - plan.end_s:.1f} s after it "
                         f"recovered; probes from t={_f(s.probe_after_s, '.1f')}s), reason {s.readmission.reason}.")
        for c in s.probe_failures:
            why = (c.detail or c.reason).split(";")[0]
            lines.append(f"  probe round failed at t={c.t_s:.1f}s ({why}: P50 {_f(c.p50_ms)} ms, "
                         f"P99 {_f(c.p99_ms)} ms, P99/P50 {_f(c.ratio, '.2f')}); the back-off doubled")
        if not (s.readmission is not None and s.readmitted_s is not None):
            lines.append(f"re-admitted: NO — {plan.slow_node} was not back in the routing set when the run ended.")
    wl, cure = s.weak_link_factor, s.cured_factor
    if wl is not None and cure is not None:
        lines.append("")
        lines.append(f"weak link: one slow node of {plan.nodes} (1/{plan.nodes} of the traffic) took the cluster P99 "
                     f"to {wl:.2f}x; after removal it is {cure:.2f}x the all-healthy P99.")
    if s.reejected_s is not None:
        lines.append(f"WARNING: {plan.slow_node} was removed again at t={s.reejected_s:.1f}s, after it had recovered")
    if s.others_removed:
        lines.append(f"WARNING: other nodes left the routing set too: {', '.join(s.others_removed)}")
    if s.errors:
        lines.append(f"client errors: {s.errors}")
    lines.append(f"result: {'ok' if s.complete else 'INCOMPLETE (see above)'}")
    return "\n".join(lines)


_STATE_COLORS = {"suspect": "#e6a700", "unhealthy": "#d62728", "quarantined": "#9467bd", "healthy": "#2ca02c",
                 "retired": "#000000"}


def plot(s: Story, path: Path) -> None:
    """Cluster P99 over time with the slow node's state changes marked (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan, obs = s.plan, s.obs
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, height_ratios=(3, 2))
    ivs = [iv for iv in obs.intervals if iv.p99_ms is not None]
    xs = [(iv.t0_s + iv.t1_s) / 2 for iv in ivs]
    ax.plot(xs, [iv.p99_ms for iv in ivs], "-o", ms=3, color="#1f77b4",
            label=f"cluster P99, client-side ({plan.interval_s:g}-s intervals)")
    ax.plot(xs, [iv.p50_ms for iv in ivs], "-", lw=1, color="#7fb3e0", label="cluster P50, client-side")
    for p in (s.healthy, s.degraded, s.removed, s.readmitted):
        if p.p99_ms is None:
            continue
        color = "#d62728" if p is s.degraded else "#333333"
        ax.hlines(p.p99_ms, p.t0_s, p.t1_s, colors=color, linestyles="--", lw=1.5)
        ax.annotate(f"{p.p99_ms:.0f} ms", ((p.t0_s + p.t1_s) / 2, p.p99_ms), textcoords="offset points",
                    xytext=(0, 7), ha="center", color=color, fontsize=9, fontweight="bold",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.plot([], [], "--", color="#333333", lw=1.5, label="phase P99 (median of intervals)")
    last_s = max([iv.t1_s for iv in ivs] + [plan.onset_s + 1])
    deg_end = plan.end_s if plan.end_s is not None else last_s
    out_end = s.readmitted_s if s.readmitted_s is not None else last_s
    for a in (ax, ax2):
        a.axvspan(plan.onset_s, deg_end, color="#d62728", alpha=0.08, lw=0)
        if s.removed_s is not None:
            a.axvspan(s.removed_s, out_end, ymin=0, ymax=0.06, color="#9467bd", alpha=0.5, lw=0)
    ax.text(plan.onset_s, 0.995, f" {plan.slow_node} {plan.slowdown:g}x slower", transform=ax.get_xaxis_transform(),
            va="top", fontsize=9, color="#d62728")
    if s.removed_s is not None:
        ax.text(s.removed_s, 0.07, f" {plan.slow_node} out of routing", transform=ax.get_xaxis_transform(),
                va="bottom", fontsize=8, color="#9467bd")
    marks = [c for c in obs.changes if c.node_id == plan.slow_node and c.t_s >= plan.onset_s]
    for i, c in enumerate(marks):
        color = _STATE_COLORS.get(c.to_state, "gray")
        for a in (ax, ax2):
            a.axvline(c.t_s, color=color, lw=1.2, ls=":")
        label = c.to_state if c.routed or c.to_state != "unhealthy" else "unhealthy: removed"
        if c.reason == "probe_failed":
            label = "probe round failed"
        elif c.reason == "probe_passed":
            label = "healthy: re-admitted"
        ax2.text(c.t_s, 0.97 - 0.16 * (i % 3), f" {label}", transform=ax2.get_xaxis_transform(), va="top",
                 fontsize=8, color=color)
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0, top=max([iv.p99_ms or 0.0 for iv in ivs] + [100.0]) * 1.12)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"tailguard demo: {plan.nodes} nodes behind a round-robin proxy, one {plan.slowdown:g}x slower "
                 f"(tick {plan.tick_interval_s:g} s)")
    slow_snaps = [sn for sn in obs.snapshots
                  if plan.slow_node in sn.nodes and sn.nodes[plan.slow_node].p50_ms is not None]
    slow_pts = [(sn.t_s, sn.nodes[plan.slow_node].p50_ms) for sn in slow_snaps]
    band = []
    for sn in obs.snapshots:
        vals = [v.p50_ms for n, v in sn.nodes.items() if n != plan.slow_node and v.p50_ms is not None]
        if vals:
            band.append((sn.t_s, min(vals), statistics.median(vals), max(vals)))
    if band:
        ax2.fill_between([b[0] for b in band], [b[1] for b in band], [b[3] for b in band], step="post",
                         color="#999999", alpha=0.35, lw=0, label="other nodes (min-max)")
        ax2.plot([b[0] for b in band], [b[2] for b in band], color="#777777", lw=1, drawstyle="steps-post",
                 label="other nodes (median)")
    if slow_pts:
        # Only while routed: out of routing, its numbers describe a quarantine window, not served traffic.
        routed_y = [y if plan.slow_node in sn.routing else math.nan
                    for (_, y), sn in zip(slow_pts, slow_snaps, strict=True)]
        ax2.plot([p[0] for p in slow_pts], routed_y, color="#d62728", lw=2, drawstyle="steps-post",
                 label=f"{plan.slow_node} (while routed)")
    ax2.set_ylabel("node P50 in tailguard (ms)")
    ax2.set_xlabel("time since the simulated fleet started (s)")
    tops = [y for _, y in slow_pts if y is not None] + [b[3] for b in band] + [100.0]
    ax2.set_ylim(bottom=0, top=max(tops) * 1.2)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--plot", default=str(ROOT / "out" / "demo.png"), help="PNG to write (default out/demo.png)")
    p.add_argument("--fast", action="store_true", help="the end-to-end test's plan: 1-s ticks, about a minute")
    p.add_argument("--keep-logs", action="store_true", help="keep the children's logs even when all went well")
    p.add_argument("--data", default=str(ROOT / "out" / "demo.json"),
                   help="where to save the run's observations, JSON (default out/demo.json)")
    p.add_argument("--replot", metavar="JSON", default=None,
                   help="run nothing: print the report and redraw the plot of a saved run")
    return p


async def _main(args: argparse.Namespace, plan: Plan, screen: Screen) -> int:
    cfg = settings_mod.load()
    run_dir = Path(tempfile.mkdtemp(prefix="tailguard-demo-"))
    screen.progress(f"Kafka {cfg.kafka_bootstrap}, Redis {redact_url(cfg.redis_url)}")
    screen.progress("detector settings of this demo (* = differs from the production default):")
    for line in settings_lines(plan):
        print(line, file=screen.out)
    screen.progress(f"the story: {plan.nodes} healthy nodes; {plan.slow_node} becomes {plan.slowdown:g}x slower at "
                    f"t={plan.onset_s:g}s" + ("" if plan.end_s is None else f" and recovers at t={plan.end_s:g}s")
                    + f"; ends by itself (at the latest t={plan.deadline_s:g}s)")
    try:
        story = await run_story(plan, kafka_bootstrap=cfg.kafka_bootstrap, redis_url=cfg.redis_url,
                                run_dir=run_dir, progress=screen.progress, show=screen.show)
    except asyncio.CancelledError:
        if not args.keep_logs:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    except DemoError:
        print(f"logs: {run_dir}", file=screen.out)
        raise
    print(render_report(story), file=screen.out)
    save_run(story, Path(args.data))
    path = Path(args.plot)
    plot(story, path)
    print(f"plot: {path}\ndata: {args.data}", file=screen.out)
    if story.complete and not args.keep_logs:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"logs: {run_dir}", file=screen.out)
    return 0 if story.complete else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.replot:
        story = load_run(Path(args.replot))
        print(render_report(story))
        plot(story, Path(args.plot))
        print(f"plot: {args.plot}")
        return 0 if story.complete else 1
    plan = TEST_PLAN if args.fast else DEMO_PLAN
    screen = Screen(plan, sys.stdout)
    loop = asyncio.new_event_loop()
    task = loop.create_task(_main(args, plan, screen))
    stopped_by: list[str] = []

    def stop(name: str) -> None:
        stopped_by.append(name)
        task.cancel()      # the cleanup runs in the task's finally blocks
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig.name)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        print(f"\n{stopped_by[0] if stopped_by else 'cancelled'}: children stopped, run data deleted",
              file=sys.stderr)
        return 130 if stopped_by[:1] == ["SIGINT"] else 143
    except DemoError as e:
        print(f"\ndemo failed: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
