"""A fleet that slows down together, on the real stack: a worker judges two nodes of one
model; both turn 3x slower at once; a ``fleet_slow`` event with the numbers goes to
fleet-health-events, and the status page's JSON shows the open episode."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from worker_harness import Feeder, free_port, read_topic, routing, running_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

NODES = ["a", "b"]


async def test_two_nodes_slowing_together_publish_a_fleet_event_and_show_on_the_page(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    port = free_port()
    async with (running_worker(kafka_bootstrap, redis_url, unique_name("fleetslow"), tmp_path,
                               extra={"TAILGUARD_WEB_PORT": str(port)}) as (env, r, worker),
                Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES}) as feeder):
        async def all_routed() -> bool:
            return await routing(r, env.name, "llm") == set(NODES)
        await wait_for(all_routed, 60, "both nodes in routing", worker.tail)

        # The nodes' own baselines need a few healthy ticks: count the worker's writes.
        seen: set[float] = set()

        async def ticks_written() -> bool:
            raw = await r.hget(f"{env.name}:nodes:llm", "a")
            if raw is not None:
                seen.add(json.loads(raw)["updated"])
            return len(seen) >= 8
        await wait_for(ticks_written, 60, "8 ticks written with both nodes healthy", worker.tail)

        feeder.slow = {(n, "llm") for n in NODES}       # both 3x slower, together

        async def fleet_slow() -> list[dict[str, Any]]:
            recs = await read_topic(kafka_bootstrap, env.topic("fleet_events"))
            return [e for e in (json.loads(x.value) for x in recs) if e["kind"] == "fleet_slow"]
        (event,) = await wait_for(fleet_slow, 60, "a fleet_slow event", worker.tail)
        # Both nodes, or the one left in routing when the other, a tick ahead, was taken
        # out (a quarantined node has no judged window until its probe round).
        assert event["model"] == "llm" and event["judged_nodes"] in (1, 2)
        assert event["abnormal_nodes"] == event["judged_nodes"]
        # Past relative_p50_factor (2) x the speed before, the numbers in the text too.
        assert event["fleet_p50"] > 2 * event["baseline_p50"], event
        assert f"fleet P50 {event['fleet_p50']:.1f} against {event['baseline_p50']:.1f}" \
            in event["detail"], event["detail"]

        def page() -> dict[str, Any]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/tailguard/status.json",
                                        timeout=10) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data
        (model,) = page()["models"]
        assert model["fleet_slow"] is not None, model
        assert model["fleet_slow"]["event_id"] == event["event_id"]
        assert await routing(r, env.name, "llm")          # never the last routed node
