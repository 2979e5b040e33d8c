"""`tailguard worker` end to end: a node 1.6x slower than its peers is weighted down, not
ejected — the weight in ``P:weights:<m>`` with the routing set, and a ``weight`` event with
its evidence on the health-change topic."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from worker_harness import NODES, Feeder, health_events, routing, running_worker, wait_for

from tailguard.routing.keys import weights_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


async def test_a_node_1_6x_slower_is_weighted_down_and_stays_routed(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with running_worker(kafka_bootstrap, redis_url, unique_name("w"),
                              tmp_path) as (env, r, worker):
        key = weights_key(env.name, "llm")
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES},
                          slow={("slow", "llm")}, slow_factor=1.6):
            async def weighted() -> dict[bytes, bytes]:
                got: dict[bytes, bytes] = await r.hgetall(key)
                return got if set(got) == {b"slow"} and float(got[b"slow"]) < 0.6 else {}
            await wait_for(weighted, 60, "the slow node's weight below 0.6", worker.tail)
            assert await routing(r, env.name, "llm") == set(NODES)       # weighted, not out

            async def weight_events() -> list[dict[str, object]]:
                return await health_events(kafka_bootstrap, env, weights=True)
            events = await wait_for(weight_events, 20, "a weight event", worker.tail)
        ev = events[0]
        assert (ev["node_id"], ev["model"], ev["previous_weight"]) == ("slow", "llm", 1.0)
        assert ev["enforced"] is True and float(ev["weight"]) < 1.0   # type: ignore[arg-type]
        evidence = ev["evidence"]
        assert isinstance(evidence, dict) and 1.4 < evidence["slower"] < 1.8
        assert {e["node_id"] for e in events} == {"slow"}
        # No transition took anybody out of routing.
        assert not [e for e in await health_events(kafka_bootstrap, env)
                    if e["routed"] is False and e["to"] != "warming"]
        assert worker.proc.poll() is None, worker.tail()
