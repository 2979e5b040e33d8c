"""The running stack of one demo run: unique names, the children's environment, the children.

:func:`running_stack` starts, on 127.0.0.1 against the configured Kafka and
Redis, ``tailguard worker`` (waiting until it joined both consumer groups),
``tailguard simulate fleet`` (the plan's scenario), ``tailguard proxy`` and
``tailguard simulate load`` through the proxy, each a :class:`Child` in a
session of its own with its output in a log file. Guarantees: every run has
its own app id, topics and key prefix (:class:`RunNames`, ``tgdemo-<random>``),
so runs never collide with each other or with other users of the stack; on
every exit path (end, error, cancellation) the children are stopped by pid
and the run's topics and Redis keys are deleted (best effort, and it says
what is left behind). A child that dies, or a wait that times out, raises
:class:`~tailguard.demo.plan.DemoError` with the end of the child's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from tailguard import settings as settings_mod
from tailguard.core.contract.config import DetectorSettings
from tailguard.demo.plan import MODEL, ROOT, RUN_PREFIX, DemoError, Plan
from tailguard.security import kafka_client_options, redis_client_options
from tailguard.settings import redact_url
from tailguard.sim.scenario import loads as load_scenario
from tailguard.streaming.errors import StreamingError
from tailguard.streaming.topics import ensure_topics

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
    return [sys.executable, "-m", "tailguard.cli", *args]


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
    try:
        listed = await admin.list_consumer_groups()
    except KafkaError as e:
        if e.retriable:     # e.g. GroupLoadInProgress just after the broker started: not yet
            return False
        raise
    if group not in {g[0] for g in listed}:
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
        progress("stopping the load generator, proxy, " + ("scrape bridge, " if plan.source == "metrics" else "")
                 + "fleet and worker")
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
    targets = d / "targets.json"
    metrics = plan.source == "metrics"
    progress(f"starting {plan.nodes} simulated nodes (tailguard simulate fleet {scenario.name}"
             + (" --metrics vllm: each serves /metrics, none reports to Kafka)" if metrics else ")"))
    source_args = ["--metrics", "vllm", "--traffic", "http", "--file-sd", str(targets)] if metrics else \
        ["--heartbeat-interval-s", "2"]
    fleet = Child("fleet", tailguard_cmd("simulate", "fleet", str(scenario), "--base-port", "0",
                                         "--backends-file", str(backends), *source_args,
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
    if metrics:
        progress(f"starting the scrape bridge (tailguard scrape --file-sd {targets.name}, every "
                 f"{plan.tick_interval_s:g} s)")
        stack.children.append(Child("scrape", tailguard_cmd(
            "scrape", "--file-sd", str(targets), "--interval-s", str(plan.tick_interval_s),
            "--metrics-port", "0"), env, d / "scrape.log"))

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
