"""Watching a demo run: the health-change feed, the Redis statuses, the load generator's output.

:func:`run_story` runs the whole story once against the real stack
(:func:`tailguard.demo.stack.running_stack`) and returns the analysed
:class:`~tailguard.demo.story.Story`. Every ``refresh_s`` :func:`observe` reads
the load generator's new interval lines, the model's node statuses from
Redis (``<prefix>:nodes:<model>``) and the health changes
(:class:`HealthFeed`, the run's ``node-health-changes`` topic from the
beginning, in the background), hands a :class:`~tailguard.demo.story.View` to the
screen, and stops when the story is complete or at the plan's deadline. The
same function drives ``tests/integration/test_e2e_story.py`` with 1-s ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tailguard.demo.plan import MODEL, DemoError, Plan
from tailguard.demo.stack import Progress, Stack, running_stack
from tailguard.demo.story import (
    HealthChange,
    Observations,
    Show,
    Snapshot,
    Story,
    View,
    analyze,
    current_phase,
    node_view,
    parse_interval,
    story_done,
)
from tailguard.routing.explain import explain_text
from tailguard.routing.status import ModelStatus, read_status
from tailguard.security import kafka_client_options, redis_client_options


async def topic_partitions(bootstrap: str, topic: str, timeout_s: float = 15.0,
                           options: Mapping[str, Any] | None = None) -> list[int]:
    """The partitions of ``topic``, asked of the broker (a plain consumer's metadata can lag behind)."""
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
                    view = snap.nodes.get(plan.slow_node)
                    if (obs.explain is None and view is not None and view.state != "warming"
                            and plan.slow_node not in snap.routing):
                        # What an operator would ask at that moment: why is it out? (Not while it
                        # is new, awaiting admission: it was never in.)
                        obs.explain = await explain_text(r, st.key_prefix, plan.slow_node, MODEL)
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
        obs.page_url = f"http://127.0.0.1:{stack.settings.web_port}/tailguard/"
        progress(f"status page of the worker: {obs.page_url} (live while the demo runs)")
        progress(f"fleet time 0 = {time.strftime('%H:%M:%S', time.localtime(stack.fleet_t0))}; "
                 f"{plan.slow_node} degrades at t={plan.onset_s:g}s"
                 + ("" if plan.end_s is None else f" and recovers at t={plan.end_s:g}s"))
        end_s = await observe(stack, obs, show)
    return analyze(plan, obs, end_s)
