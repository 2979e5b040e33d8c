"""The weights hash ``P:weights:<m>`` against a real redis-server: written by the routing
script with the routing set, so that one version always means one (routing set, weights)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping

import pytest
import redis.asyncio as aioredis

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import Extras
from tailguard.routing.client import connect
from tailguard.routing.explain import read_explain
from tailguard.routing.keys import Keys, weights_key
from tailguard.routing.status import read_status
from tailguard.routing.writer import RoutingWriter

pytestmark = pytest.mark.integration

MODEL = "llama-3:8b weights"   # ':' and a space on purpose


def tick(routing: set[str], weights: Mapping[str, float] | None = None) -> ModelTick:
    statuses = tuple(NodeStatus(node_id=n, model=MODEL, state=HealthState.HEALTHY, routed=True,
                                since_ts=1.0, reason="normal", samples=500,
                                weight=(weights or {}).get(n, 1.0))
                     for n in sorted(routing))
    return ModelTick(model=MODEL, ts=1.0, transitions=(), routing=frozenset(routing),
                     quarantine={}, statuses=statuses, weights=dict(weights or {}))


async def hash_of(client: aioredis.Redis, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (await client.hgetall(key)).items()}


async def test_weights_are_written_with_the_routing_set_and_bump_the_version(
        client: aioredis.Redis, prefix: str) -> None:
    k = Keys(prefix)
    assert weights_key(prefix, MODEL) == f"{prefix}:weights:llama-3%3A8b%20weights"
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(k.channel)
    try:
        w = RoutingWriter(client, prefix)
        assert await w.apply(tick({"a", "b", "c"}, {"b": 0.45}))
        v1 = w.last_results[MODEL].version
        assert await hash_of(client, weights_key(prefix, MODEL)) == {"b": "0.45"}
        nodes = await client.hgetall(k.nodes(MODEL))
        assert json.loads(nodes[b"b"])["weight"] == 0.45
        # tailguard status and explain read what load balancers read.
        (ms,) = await read_status(client, prefix)
        assert ms.weights == {"b": 0.45} and ms.version == v1
        (ex,) = await read_explain(client, prefix, "b")
        assert ex.written_weight == 0.45 and ex.status["weight"] == 0.45
        # The same weights again: nothing changes, no new version.
        assert await w.apply(tick({"a", "b", "c"}, {"b": 0.45}))
        assert w.last_results[MODEL].version == v1 and not w.last_results[MODEL].changed
        # A new weight alone: a new version, the routing set untouched.
        assert await w.apply(tick({"a", "b", "c"}, {"b": 0.6, "c": 0.9}))
        r = w.last_results[MODEL]
        assert (r.version, r.routing_changed, r.weights_changed) == (v1 + 1, False, True)
        assert await hash_of(client, k.weights(MODEL)) == {"b": "0.6", "c": "0.9"}
        # Everyone back at full weight (or TAILGUARD_WEIGHTS=observe|off): the hash is gone.
        assert await w.apply(tick({"a", "b", "c"}, {"b": 0.6}), Extras(weights={}))
        assert await client.exists(k.weights(MODEL)) == 0
        assert w.last_results[MODEL].version == v1 + 2
        # A weight of a node out of routing is never written.
        assert await w.apply(tick({"a", "b"}, {"c": 0.5}))
        assert await client.exists(k.weights(MODEL)) == 0
        # A model stage 2 forgot loses its weights with its other keys.
        assert await w.apply(tick({"a", "b"}, {"b": 0.5}))
        assert await client.exists(k.weights(MODEL)) == 1
        gone = dataclasses.replace(tick(set()), forgotten=True)
        assert await w.apply(gone)
        assert await client.exists(k.weights(MODEL)) == 0
        messages: list[int] = []
        deadline = time.monotonic() + 20
        while len(messages) < 5 and time.monotonic() < deadline:
            msg = await pubsub.get_message(timeout=1.0)
            if msg is not None:
                messages.append(json.loads(msg["data"])["version"])
        assert messages[:5] == [v1, v1 + 1, v1 + 2, v1 + 3, v1 + 4]
    finally:
        await pubsub.aclose()


async def test_a_reader_of_one_version_sees_one_routing_set_and_its_weights(
        redis_url: str, client: aioredis.Redis, prefix: str) -> None:
    k = Keys(prefix)
    a = (frozenset(f"n{i}" for i in range(200)), {"n3": 0.45, "n7": 0.8})
    b = (frozenset(f"n{i}" for i in range(1, 201)), {"n200": 0.3})
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick(set(a[0]), a[1]))
    seen: set[tuple[int, frozenset[str], frozenset[tuple[str, str]]]] = set()
    done = asyncio.Event()
    reader = connect(redis_url)

    async def read_loop() -> None:
        while not done.is_set():
            async with reader.pipeline(transaction=True) as pipe:
                pipe.get(k.version(MODEL)).smembers(k.routing(MODEL)).hgetall(k.weights(MODEL))
                version, members, weights = await pipe.execute()
            seen.add((int(version), frozenset(m.decode() for m in members),
                      frozenset((f.decode(), v.decode()) for f, v in weights.items())))

    try:
        readers = [asyncio.create_task(read_loop()) for _ in range(2)]
        for i in range(40):
            routing, weights = b if i % 2 == 0 else a
            assert await w.apply(tick(set(routing), weights))
            await asyncio.sleep(0)
        done.set()
        await asyncio.gather(*readers)
    finally:
        await reader.aclose()
    pairs = {(r, ws) for _, r, ws in seen}
    want = {(a[0], frozenset((n, f"{x:g}") for n, x in a[1].items())),
            (b[0], frozenset((n, f"{x:g}") for n, x in b[1].items()))}
    assert pairs <= want, "a reader saw a routing set with another one's weights"
    by_version: dict[int, set[object]] = {}
    for version, r, ws in seen:
        by_version.setdefault(version, set()).add((r, ws))
    assert all(len(v) == 1 for v in by_version.values()), "one version, two states"
    assert len(pairs) == 2, "the readers did not overlap the writer's flips"
