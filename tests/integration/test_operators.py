"""Operators in control, through the real worker, Kafka and Redis: drain, pin, release with
TTL, observe mode switched to enforce without a restart, and ``tailguard explain``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from worker_harness import (
    HEALTHY,
    NODES,
    Feeder,
    health_events,
    routing,
    running_worker,
    tailguard_cli,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_drain_pin_release_and_explain(kafka_bootstrap: str, redis_url: str,
                                             unique_name: Callable[[str], str],
                                             tmp_path: Path) -> None:
    async with (running_worker(kafka_bootstrap, redis_url, unique_name("op"),
                               tmp_path) as (env, r, worker),
                Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES},
                       slow={("slow", "llm")})):
        async def slow_out() -> bool:
            return await routing(r, env.name, "llm") == HEALTHY
        await wait_for(slow_out, 60, "the slow node to leave routing", worker.tail)

        # Drain a healthy node for 6 s: it leaves at the next tick, with the reason.
        done = tailguard_cli(env, "drain", "n0", "--reason", "kernel upgrade", "--ttl", "6")
        assert done.returncode == 0, done.stderr

        async def n0_out() -> bool:
            return await routing(r, env.name, "llm") == HEALTHY - {"n0"}
        await wait_for(n0_out, 10, "the drained node to leave routing", worker.tail)
        status = tailguard_cli(env, "status")
        n0_row = next(line for line in status.stdout.splitlines() if line.startswith("n0 "))
        assert "no (drained)" in n0_row and "kernel upgrade" in n0_row, status.stdout

        async def events_for(node: str, reason: str) -> list[dict[str, Any]]:
            return [e for e in await health_events(kafka_bootstrap, env)
                    if e["node_id"] == node and e["reason"] == reason]
        (drained,) = await wait_for(lambda: events_for("n0", "operator_drain"), 10,
                                    "the drain's health change", worker.tail)
        assert drained["detail"] == "kernel upgrade" and drained["routed"] is False
        assert drained["enforced"] is True and drained["operator"]["until"] is not None
        # The drain is not an ejection: the core still has room for the slow node and
        # does not call n0 anything but healthy.
        assert drained["from"] == drained["to"] == "healthy"

        # TTL over: the release is published and n0 is back.
        (released,) = await wait_for(lambda: events_for("n0", "operator_release"), 20,
                                     "the TTL release", worker.tail)
        assert "until" in released["detail"] and released["routed"] is True
        assert await routing(r, env.name, "llm") == HEALTHY
        assert not await r.hexists(f"{env.name}:overrides", json.dumps(["n0", None],
                                                                      separators=(",", ":")))

        # Pin the quarantined slow node: back in routing whatever the rules say.
        assert tailguard_cli(env, "pin", "slow", "--model", "llm").returncode == 0

        async def slow_in() -> bool:
            return "slow" in await routing(r, env.name, "llm")
        await wait_for(slow_in, 10, "the pinned node to rejoin routing", worker.tail)
        shadow = {m.decode() for m in await r.smembers(f"{env.name}:routing-shadow:llm")}
        assert "slow" in shadow     # the would-be set honours the pin too

        explained = tailguard_cli(env, "explain", "slow")
        assert explained.returncode == 0, explained.stderr
        text = explained.stdout
        assert "model 'llm'" in text and "override: pin" in text, text
        # The ticks that took it out are still shown: its P50 past 2 x the peers'.
        assert "P50 vs peers" in text and "ms > 2" in text, text
        assert "held by: pinned by an operator" in text, text

        assert tailguard_cli(env, "release", "slow").returncode == 0
        await wait_for(slow_out, 10, "the released node to leave routing again", worker.tail)
        (rel,) = await wait_for(lambda: events_for("slow", "operator_release"), 10,
                                "the pin's release", worker.tail)
        assert "released by an operator" in rel["detail"]
        unknown = tailguard_cli(env, "explain", "no-such-node")
        assert unknown.returncode == 1 and "no node 'no-such-node'" in unknown.stderr


async def test_observe_mode_routes_everyone_until_switched_to_enforce(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with (running_worker(kafka_bootstrap, redis_url, unique_name("obs"), tmp_path,
                               extra={"TAILGUARD_MODE": "observe"}) as (env, r, worker),
                Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES},
                       slow={("slow", "llm")})):
        async def shadow_without_slow() -> bool:
            got = {m.decode() for m in await r.smembers(f"{env.name}:routing-shadow:llm")}
            return got == HEALTHY
        await wait_for(shadow_without_slow, 60, "the shadow set to drop the slow node",
                       worker.tail)

        async def all_routed() -> bool:
            return await routing(r, env.name, "llm") == set(NODES)
        # observe: all routed — once judged (the slow node, refused admission, too: observe keeps
        # every judged node; a new node awaiting admission is routed in neither mode)
        await wait_for(all_routed, 30, "observe mode to route every judged node", worker.tail)
        slow = [e for e in await health_events(kafka_bootstrap, env)
                if e["node_id"] == "slow" and e["to"] == "unhealthy"]
        assert slow and all(e["enforced"] is False and e["routed"] is False for e in slow)
        status = tailguard_cli(env, "status")
        assert "mode observe" in status.stdout and "yes (observe)" in status.stdout, status.stdout

        # Switch this model to enforce in Redis: no restart, the next tick takes it out.
        switched = tailguard_cli(env, "mode", "enforce", "--model", "llm")
        assert switched.returncode == 0 and "model llm: enforce" in switched.stdout

        async def slow_out() -> bool:
            return await routing(r, env.name, "llm") == HEALTHY
        await wait_for(slow_out, 10, "enforce mode to take the slow node out", worker.tail)
        assert worker.proc.poll() is None
