"""RoutingTable's weights against the real Redis: one version with its set, the weighted pick.

The test plays tailguard's writer with plain redis-py (:func:`tailguard.lb.testing.write_routing`:
routing set, held-out set, ``P:weights:<m>`` and version in one ``MULTI``/``EXEC``), so the
reader is checked against the key contract, not against our own writer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from tailguard.lb.testing import eventually, scratch_redis, write_routing
from tailguard.routing.client import connect
from tailguard.routing.keys import Keys, weights_key
from tailguard.routing.reader import ModelRouting, RoutingTable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "llama-3:70b chat"   # ':' and a space on purpose


@pytest.fixture
async def rig(redis_url: str, unique_name: Callable[[str], str]) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    prefix = unique_name("weights")
    async with scratch_redis(redis_url, prefix) as r:
        yield r, prefix


async def test_weights_come_with_the_set_of_their_version(rig: tuple[aioredis.Redis, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    r, prefix = rig
    v1 = await write_routing(r, prefix, MODEL, ["a", "b", "c"], weights={"b": 0.625})
    table = RoutingTable(r, prefix, poll_interval_s=60.0)
    assert await table.get(MODEL) == {"a", "b", "c"}
    assert await table.weights(MODEL) == {"b": 0.625}
    assert table.cached_weights(MODEL) == {"b": 0.625}
    assert (table.weight(MODEL, "a"), table.weight(MODEL, "b")) == (1.0, 0.625)
    assert table.weight("never-written", "a") == 1.0
    assert table.version(MODEL) == v1

    # A field that is not a weight: that node weighs 1.0, with one warning naming it.
    await write_routing(r, prefix, MODEL, ["a", "b", "c"], weights={"b": 0.5})
    await r.hset(weights_key(prefix, MODEL), "c", "heavy")
    await r.incr(Keys(prefix).version(MODEL))
    with caplog.at_level(logging.WARNING, logger="tailguard.routing.reader"):
        assert await table.refresh()
    assert table.cached_weights(MODEL) == {"b": 0.5}
    assert table.weight(MODEL, "c") == 1.0
    assert "'c'" in caplog.text and "(0, 1]" in caplog.text


async def test_a_reader_never_mixes_a_set_and_weights_of_two_versions(redis_url: str,
                                                                      rig: tuple[aioredis.Redis, str]) -> None:
    r, prefix = rig
    # Even versions: set S1 with weights W1; odd: S2 with W2. A mixed read would pair them wrongly.
    s1, w1 = [f"even-{i}" for i in range(50)], {f"even-{i}": 0.5 for i in range(0, 50, 2)}
    s2, w2 = [f"odd-{i}" for i in range(50)], {f"odd-{i}": 0.25 for i in range(1, 50, 2)}
    v0 = await write_routing(r, prefix, MODEL, s1, weights=w1)
    reader_client = connect(redis_url)
    seen: list[ModelRouting] = []
    done = asyncio.Event()
    try:
        table = RoutingTable(reader_client, prefix, poll_interval_s=0.05)
        await table.get(MODEL)

        async def read_loop() -> None:
            while not done.is_set():
                await table.refresh()
                snap = table.snapshot(MODEL)
                assert snap is not None
                seen.append(snap)

        readers = [asyncio.create_task(read_loop()) for _ in range(3)]
        for i in range(40):
            await write_routing(r, prefix, MODEL, s2 if i % 2 == 0 else s1, weights=w2 if i % 2 == 0 else w1)
            await asyncio.sleep(0)
        done.set()
        await asyncio.gather(*readers)
    finally:
        await reader_client.aclose()
    assert len({s.version for s in seen}) > 2, "the readers did not overlap the writer"
    for snap in seen:
        assert snap.version is not None
        even = (snap.version - v0) % 2 == 0
        assert snap.nodes == frozenset(s1 if even else s2), f"v{snap.version} with the wrong set"
        assert dict(snap.weights) == (w1 if even else w2), f"v{snap.version} with the wrong weights"


async def test_pick_follows_the_weights_and_a_weight_change_is_announced(rig: tuple[aioredis.Redis, str]) -> None:
    r, prefix = rig
    changes: list[dict[str, float]] = []
    await write_routing(r, prefix, MODEL, ["a", "b", "c", "d"])
    async with RoutingTable(r, prefix, poll_interval_s=0.05,
                            on_change=lambda e: changes.append(dict(e.weights))) as table:
        assert table.pick(MODEL) is None                          # nothing cached yet: no data
        await table.get(MODEL)
        assert [table.pick(MODEL) for _ in range(8)] == ["a", "b", "c", "d"] * 2
        await write_routing(r, prefix, MODEL, ["a", "b", "c", "d"], weights={"c": 0.625})
        await eventually(lambda: table.cached_weights(MODEL) == {"c": 0.625}, what="weights reloaded")
        got = Counter(table.pick(MODEL) for _ in range(3625 * 2))
        assert got == {"a": 2000, "b": 2000, "c": 1250, "d": 2000}
        # Only the weights change (same set): the change is still announced.
        await write_routing(r, prefix, MODEL, ["a", "b", "c", "d"])
        await eventually(lambda: table.cached_weights(MODEL) == {}, what="weights back to full")
    assert changes == [{}, {"c": 0.625}, {}]
