"""Hostile node ids and the allowlist through the real worker: kcat events, real Kafka and Redis.

Events whose ids break the id rule (control characters, a terminal escape, ``|``,
whitespace, a 10 KB id, unicode outside the set) arrive on the dead-letter topic with
their reason, and are counted, while the good events of the same run are counted and
their nodes judged and routed. With a Redis-set allowlist, a node that is not on it is
dead-lettered (``not_allowlisted``) until it is registered, and then judged like the rest.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from worker_harness import free_port, kcat_produce_keyed, read_topic, routing, running_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GOOD = ["gpu-node-01", "10.0.0.5:8000", "vllm-7d9f8b6c5-x2k4p", "ip-10-0-0-9.ec2.internal"]
HOSTILE_NODES = ["ctl\x01\x07", "esc\x1b[31mred\x1b[0m", "a|b", "gpu node", "tab\there",
                 "n" * 10_240, "nœud-☃", ""]


def good_lines(nodes: list[str]) -> list[str]:
    now = time.time()
    lines = []
    for i, node in enumerate(nodes):
        samples = [[now, 1000.0 * (1 + 0.1 * ((j * 7 + i) % 5))] for j in range(30)]
        ev = {"node_id": node, "model": MODEL, "hardware": "A100", "samples": samples}
        lines.append(f"{node}|{MODEL}\t{json.dumps(ev)}")
    return lines


def hostile_lines() -> tuple[list[str], list[str]]:
    """kcat lines (JSON escapes the control characters; unicode is sent as UTF-8) and the
    reason each must be dead-lettered with."""
    now = time.time()
    lines, reasons = [], []
    for i, node in enumerate(HOSTILE_NODES):
        form = i % 3
        if form == 0:
            ev: dict[str, Any] = {"node_id": node, "model": MODEL, "latency_us": 1000.0, "ts": now}
        elif form == 1:
            ev = {"node_id": node, "model": MODEL, "samples": [[now, 1000.0]] * 5}
        else:
            ev = {"type": "heartbeat", "node_id": node, "model": MODEL, "ts": now}
        lines.append(f"hostile\t{json.dumps(ev, ensure_ascii=False)}")
        reasons.append("empty_field" if not node else "bad_node_id")
    for model in ("m\x1b]0;pwned\x07", "llama 3", "m" * 200):
        ev = {"node_id": "gpu-node-01", "model": model, "latency_us": 1000.0, "ts": now}
        lines.append(f"hostile\t{json.dumps(ev, ensure_ascii=False)}")
        reasons.append("bad_model")
    return lines, reasons


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) \
                and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def dead_letters(recs: list[Any]) -> list[tuple[str, str, bytes]]:
    """(reason, error, value) of each dead letter, in offset order per partition."""
    out = []
    for rec in recs:
        h = {k: v.decode() for k, v in rec.headers}
        out.append((h["tailguard.reason"], h["tailguard.error"], rec.value))
    return out


async def test_hostile_ids_are_dead_lettered_while_good_nodes_are_counted_and_judged(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    port = free_port()
    async with running_worker(kafka_bootstrap, redis_url, unique_name("ids"), tmp_path,
                              extra={"TAILGUARD_METRICS_PORT": str(port)}) as (env, r, worker):
        topic = env.topic("latency_events")
        lines, reasons = hostile_lines()
        await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, lines)
        deadline = time.monotonic() + 90
        while await routing(r, env.name, MODEL) != set(GOOD):
            assert time.monotonic() < deadline, f"the good nodes never routed\n{worker.tail()}"
            await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, good_lines(GOOD))
            await asyncio.sleep(0.5)
        for _ in range(3):      # a few more ticks with the good nodes judged
            await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic, good_lines(GOOD))
            await asyncio.sleep(1.0)

        dead = dead_letters(await read_topic(kafka_bootstrap, env.topic("dead_letter")))
        sent = {line.split("\t", 1)[1].encode(): reason for line, reason in zip(lines, reasons, strict=True)}
        got = {value: reason for reason, _, value in dead}
        assert got == sent, sorted(got.values())
        assert all("id rule" in err or reason == "empty_field" for reason, err, _ in dead)
        assert all(err.isprintable() for _, err, _ in dead)

        nodes = {k.decode(): json.loads(v) for k, v in
                 (await r.hgetall(f"{env.name}:nodes:{MODEL}")).items()}
        assert set(nodes) == set(GOOD)
        assert all(n["state"] == "healthy" and n["samples"] > 0 for n in nodes.values()), nodes
        assert {m.decode() for m in await r.smembers(f"{env.name}:models")} == {MODEL}

        text = await asyncio.to_thread(scrape, port)
        want = {reason: reasons.count(reason) for reason in set(reasons)}
        for reason, n in want.items():
            assert metric(text, "tailguard_bad_events_total", reason=reason) == n, (reason, text)
        assert metric(text, "tailguard_samples_in_total") >= 30 * len(GOOD)
        log = worker.log()     # (faust's own start-up spinner writes \x08\x1b[?25h: not an id)
        for raw in ("\x1b[31m", "\x01\x07", "\x1b]0;pwned"):
            assert raw not in log, f"{raw!r} reached the worker's log"
        assert "\\x1b[31m" in log        # the dead letter was logged, escaped


async def test_a_redis_set_allowlist_keeps_unregistered_nodes_out_until_registered(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    name = unique_name("allow")
    key = f"{name}:allowlist"
    import redis.asyncio as aioredis

    r0 = aioredis.Redis.from_url(redis_url)
    await r0.sadd(key, *GOOD[:3])
    try:
        async with running_worker(kafka_bootstrap, redis_url, name, tmp_path, extra={
                "TAILGUARD_ALLOWLIST_REDIS_KEY": key,
                "TAILGUARD_ALLOWLIST_REFRESH_S": "1"}) as (env, r, worker):
            topic = env.topic("latency_events")

            async def feed_until(want: set[str], what: str) -> None:
                deadline = time.monotonic() + 90
                while await routing(r, env.name, MODEL) != want:
                    assert time.monotonic() < deadline, f"{what}\n{worker.tail()}"
                    await asyncio.to_thread(kcat_produce_keyed, kafka_bootstrap, topic,
                                            good_lines(GOOD))
                    await asyncio.sleep(0.5)

            await feed_until(set(GOOD[:3]), "the three registered nodes never routed alone")
            nodes = await r.hkeys(f"{env.name}:nodes:{MODEL}")
            assert {n.decode() for n in nodes} == set(GOOD[:3])
            dead = dead_letters(await read_topic(kafka_bootstrap, env.topic("dead_letter")))
            assert dead and {reason for reason, _, _ in dead} == {"not_allowlisted"}
            assert {json.loads(v)["node_id"] for _, _, v in dead} == {GOOD[3]}

            await r.sadd(key, GOOD[3])            # registered: in within a refresh or two
            await feed_until(set(GOOD), "the newly registered node never routed")
            assert "node-id allowlist: 4 ids (+1 -0)" in worker.log(), worker.tail()
    finally:
        await r0.delete(key)
        await r0.aclose()
