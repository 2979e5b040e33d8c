"""`tailguard worker` end to end against the real Kafka and Redis.

A slow node leaves the routing set and its health changes appear on the
topic; events produced by an independent client (kcat) are consumed, and
malformed ones end on the dead-letter topic while the good ones are used.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from worker_harness import (
    NODES,
    Feeder,
    Worker,
    WorkerEnv,
    health_events,
    kcat_produce_keyed,
    produce,
    read_topic,
    routing,
    running_worker,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]



async def test_slow_node_leaves_routing_and_health_change_is_published(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with running_worker(kafka_bootstrap, redis_url, unique_name("w"),
                              tmp_path) as (env, r, worker):
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES},
                          slow={("slow", "llm")}):
            async def slow_out() -> bool:
                got = await routing(r, env.name, "llm")
                return got == {"n0", "n1", "n2", "n3"}
            await wait_for(slow_out, 60, "the slow node to leave the routing set", worker.tail)

            async def quarantined() -> list[dict[str, object]]:
                return [e for e in await health_events(kafka_bootstrap, env)
                        if e["node_id"] == "slow" and e["to"] == "quarantined"]
            await wait_for(quarantined, 20, "the quarantine event", worker.tail)
        events = await health_events(kafka_bootstrap, env)
        slow = [e for e in events if e["node_id"] == "slow"]
        path = [(e["from"], e["to"]) for e in slow]
        # Slow from its first window: refused admission (never routed), then quarantined.
        assert ("warming", "unhealthy") in path and ("unhealthy", "quarantined") in path, path
        assert "admission refused" in str(next(e for e in slow if e["to"] == "unhealthy")["detail"])
        unhealthy = next(e for e in slow if e["to"] == "unhealthy")
        assert unhealthy["routed"] is False and unhealthy["model"] == "llm"
        # 3× slower at every quantile: a relative rule (P50 or, in newer cores, P99) fires.
        assert str(unhealthy["reason"]).startswith("relative_p"), unhealthy
        assert unhealthy["p50_us"] > 2 * unhealthy["peers_p50"]
        assert unhealthy["samples"] >= 50 and len(unhealthy["event_id"]) == 32
        # Nobody else ever left routing (a first_seen while awaiting admission is not routed yet).
        assert not [e for e in events if e["node_id"] != "slow" and e["routed"] is False
                    and e["to"] != "warming"]
        assert {e["node_id"] for e in events if e["reason"] == "admitted"} == {"n0", "n1", "n2", "n3"}
        # A diagnostics request was published for the node that became unhealthy, keyed by node.
        reqs = await read_topic(kafka_bootstrap, env.topic("diagnostics_requests"))
        assert [(rec.key, json.loads(rec.value)["node_id"]) for rec in reqs] == [(b"slow", "slow")]
        request_id = json.loads(reqs[0].value)["request_id"]
        # Diagnostics say "not recoverable" → retired; a malformed result is dead-lettered; one
        # that answers another request (forged, or of an earlier episode) is dropped.
        await produce(kafka_bootstrap, env.topic("diagnostics_results"), [
            (b"slow", b'{"node_id": "slow", "model": "llm", "recoverable": "maybe"}'),
            (b"slow", b'{"node_id": "slow", "model": "llm", "recoverable": false, '
                      b'"request_id": "0123456789abcdef0123456789abcdef"}'),
            (b"slow", json.dumps({"node_id": "slow", "model": "llm", "recoverable": False,
                                  "request_id": request_id}).encode())])

        async def retired() -> list[dict[str, object]]:
            return [e for e in await health_events(kafka_bootstrap, env)
                    if e["node_id"] == "slow" and e["to"] == "retired"]
        (ret,) = await wait_for(retired, 30, "the node to be retired", worker.tail)
        assert (ret["from"], ret["reason"]) == ("quarantined", "diagnostics_unrecoverable")
        (dl,) = await read_topic(kafka_bootstrap, env.topic("dead_letter"))
        assert dict(dl.headers)["tailguard.reason"] == b"bad_diagnostics"
        assert await routing(r, env.name, "llm") == {"n0", "n1", "n2", "n3"}
        assert "its request_id is not the current episode's request" in worker.log()
        assert "\x1b" not in worker.log()    # no terminal escapes in a log that is no terminal
        assert worker.proc.poll() is None, worker.tail()


async def test_failing_node_leaves_routing_by_its_error_rate(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    # Half its requests fail while the other half look normal: its latency rules see nothing;
    # stage 1's request/failure counters reach stage 2 through node-window-stats.
    async with running_worker(kafka_bootstrap, redis_url, unique_name("err"),
                              tmp_path) as (env, r, worker):
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES},
                          failing={("slow", "llm")}):
            async def failing_out() -> bool:
                return await routing(r, env.name, "llm") == {"n0", "n1", "n2", "n3"}
            await wait_for(failing_out, 60, "the failing node to leave the routing set",
                           worker.tail)
        events = await health_events(kafka_bootstrap, env)
        (unhealthy,) = [e for e in events if e["to"] == "unhealthy"]
        assert (unhealthy["node_id"], unhealthy["reason"]) == ("slow", "error_rate"), unhealthy
        (suspect, *_) = [e for e in events if e["node_id"] == "slow" and e["to"] == "suspect"]
        assert suspect["reason"] == "error_rate", suspect
        assert "requests since the last tick failed" in str(suspect["detail"]), suspect
        assert worker.proc.poll() is None, worker.tail()


async def test_kcat_events_are_used_and_malformed_ones_dead_lettered(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    env = WorkerEnv(unique_name("kcat"), kafka_bootstrap, redis_url)
    topic = env.topic("latency_events")
    bad = ['{"node_id": "n0", "model": "emb", "latency_us": -3, "ts": %TS%}',
           "this is not json",
           '{"node_id": "n0", "model": "emb", "samples": "nope"}',
           '{"type": "weird", "node_id": "n0", "model": "emb"}']
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    worker = Worker(env.environ(), tmp_path / "worker.log")
    try:
        sent_bad = 0
        async def routed_without_slow() -> bool:
            return await routing(r, env.name, "emb") == {"n0", "n1", "n2", "n3"}
        deadline = time.monotonic() + 60
        while not await routed_without_slow():
            assert time.monotonic() < deadline, "slow node never left routing\n" + worker.tail()
            now = time.time()
            lines = []
            for node in NODES:
                base = 3000 if node == "slow" else 1000
                for i in range(20):
                    ev = {"node_id": node, "model": "emb", "ts": now,
                          "latency_us": base * (1 + 0.1 * ((i * 7) % 5)), "ok": True}
                    lines.append(f"{node}|emb\t{json.dumps(ev)}")
            for b in bad:
                lines.append(f"n0|emb\t{b.replace('%TS%', str(now))}")
                sent_bad += 1
            await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, lines)
            await asyncio.sleep(0.5)

        async def all_dead() -> list[object]:
            recs = await read_topic(kafka_bootstrap, env.topic("dead_letter"))
            return recs if len(recs) >= sent_bad else []
        dead = await wait_for(all_dead, 20, f"{sent_bad} dead letters", worker.tail)
        reasons = {dict(rec.headers)["tailguard.reason"].decode() for rec in dead}
        assert reasons == {"bad_latency", "bad_json", "bad_batch", "unknown_form"}
        first = dead[0]
        h = dict(first.headers)
        assert h["tailguard.topic"].decode() == topic
        assert int(h["tailguard.offset"]) >= 0 and int(h["tailguard.partition"]) in range(4)
        assert first.key == b"n0|emb"
        assert first.value.decode() in {b.split("%TS%")[0] for b in bad} or \
            any(first.value.decode().startswith(b.split("%TS%")[0]) for b in bad)
        assert "bad input at" in worker.log()
        assert worker.proc.poll() is None, worker.tail()
    finally:
        worker.stop()
        await r.aclose()
