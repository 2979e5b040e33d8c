"""A fleet that shrinks, through the real worker: kcat-produced events, real Kafka and Redis.

Six nodes report; four stop for good (a scale-down). The routing set in Redis drops them
as gone (reason ``silent``, no ejection, no diagnostics), and when one of the two
survivors then slows 3x it is still taken out, with the ejection cap computed over the two
live nodes (two nodes are too few for peers: the absolute tail rule and each node's own
P50 history judge them).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from worker_harness import Worker, WorkerEnv, health_events, kcat_produce_keyed, read_topic, routing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

NODES = [f"n{i}" for i in range(6)]


def batch(nodes: list[str], slow: set[str]) -> list[str]:
    now = time.time()
    lines = []
    for node in nodes:
        base = 3000 if node in slow else 1000
        for i in range(20):
            ev = {"node_id": node, "model": "emb", "ts": now,
                  "latency_us": base * (1 + 0.1 * ((i * 7) % 5))}
            lines.append(f"{node}|emb\t{json.dumps(ev)}")
    return lines


async def test_scaled_away_nodes_leave_routing_and_a_slow_survivor_is_still_removed(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    env = WorkerEnv(unique_name("live"), kafka_bootstrap, redis_url, extra={
        "TAILGUARD_SILENT_AFTER_S": "6", "TAILGUARD_RESTART_GAP_S": "2",
        "TAILGUARD_WINDOW_SIZE": "200"})
    topic = env.topic("latency_events")
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    worker = Worker(env.environ(), tmp_path / "worker.log")

    async def feed_until(nodes: list[str], slow: set[str], want: set[str], timeout_s: float,
                         what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while await routing(r, env.name, "emb") != want:
            assert time.monotonic() < deadline, f"{what}\n{worker.tail()}"
            await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, batch(nodes, slow))
            await asyncio.sleep(0.5)

    try:
        await feed_until(NODES, set(), set(NODES), 40, "all six nodes never routed")
        for _ in range(10):            # a few healthy ticks: every node has a history
            await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, batch(NODES, set()))
            await asyncio.sleep(0.5)
        t_stop = time.time()
        await feed_until(["n0", "n1"], set(), {"n0", "n1"}, 40,
                         "the four silent nodes never left routing")
        gone_after_s = time.time() - t_stop
        for _ in range(6):             # the survivors alone for a while: their own baselines
            await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, batch(["n0", "n1"], set()))
            await asyncio.sleep(0.5)
        await feed_until(["n0", "n1"], {"n0"}, {"n1"}, 60, "the slow survivor never left routing")

        events = await health_events(kafka_bootstrap, env)
        silent = [e for e in events if e["reason"] == "silent"]
        assert {e["node_id"] for e in silent} == {"n2", "n3", "n4", "n5"}
        assert all(e["to"] == "gone" and e["routed"] is False for e in silent)
        assert gone_after_s < 6 + 10, gone_after_s       # silent_after_s + a few ticks
        out = [e for e in events if e["to"] == "unhealthy" and e["routed"] is False]
        assert [e["node_id"] for e in out] == ["n0"], out
        # While its window mixes old and new samples the tail rule may fire first; later the
        # P50 rule against its own history does (two nodes are too few for peers).
        assert out[0]["reason"] in ("relative_p50", "p99_p50_ratio"), out[0]
        # Diagnostics only for the real ejection, never for a node that went quiet.
        reqs = await read_topic(kafka_bootstrap, env.topic("diagnostics_requests"))
        assert [json.loads(rec.value)["node_id"] for rec in reqs] == ["n0"]
        assert worker.proc.poll() is None, worker.tail()
    finally:
        worker.stop()
        await r.aclose()
