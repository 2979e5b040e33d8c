"""Operator overrides and modes in the real Redis (tailguard.routing.operators), and the writer's
extras (shadow set, history, events) written in the same script as the routing set."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import EVENTS_CAP, Extras
from tailguard.routing.keys import Keys
from tailguard.routing.operators import (
    Override,
    clear_overrides,
    delete_if_unchanged,
    read_operator_state,
    set_mode,
    set_override,
)
from tailguard.routing.writer import RoutingWriter

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
def keys(unique_name: Callable[[str], str]) -> Keys:
    return Keys(unique_name("ops"))


async def test_overrides_round_trip_and_expired_ones_are_deleted_only_if_unchanged(
        client: aioredis.Redis, keys: Keys) -> None:
    weird = "n<1>\x07:%"
    await set_override(client, keys, Override(weird, None, "drain", "disk", 1.0, 10.0, "ana"))
    await set_override(client, keys, Override(weird, "m:1", "pin", "", 2.0))
    await set_override(client, keys, Override("n2", "m", "drain", "", 3.0))
    await client.hset(keys.overrides, "not json", "{}")
    await client.hset(keys.mode, "m", "sideways")
    state = await read_operator_state(client, keys)
    assert [(o.node_id, o.model, o.action) for o in state.overrides] == [   # sorted
        ("n2", "m", "drain"), (weird, None, "drain"), (weird, "m:1", "pin")]
    assert len(state.bad) == 2 and any("sideways" in b for b in state.bad)
    assert state.for_model("m:1")[weird].action == "pin"          # model-specific wins
    assert state.for_model("other")[weird].action == "drain"
    # An operator sets the drain again (new reason) after the worker read the old one:
    old = state.overrides[1]
    await set_override(client, keys, Override(weird, None, "drain", "disk, again", 5.0, 50.0))
    assert not await delete_if_unchanged(client, keys, old)
    fresh = (await read_operator_state(client, keys)).overrides[1]
    assert fresh.reason == "disk, again" and await delete_if_unchanged(client, keys, fresh)
    assert await clear_overrides(client, keys, weird, None) == 1      # the pin was left
    assert await clear_overrides(client, keys, "n2", "m") == 1
    assert await clear_overrides(client, keys, "n2", "m") == 0
    await client.delete(keys.overrides, keys.mode)


async def test_modes_every_model_and_per_model(client: aioredis.Redis, keys: Keys) -> None:
    await set_mode(client, keys, None, "observe")
    await set_mode(client, keys, "m", "enforce")
    state = await read_operator_state(client, keys)
    assert state.mode_of("m", "enforce") == "enforce" and state.mode_of("x", "enforce") == "observe"
    await set_mode(client, keys, None, None)
    assert (await read_operator_state(client, keys)).mode_of("x", "enforce") == "enforce"
    with pytest.raises(ValueError, match="observe or enforce"):
        await set_mode(client, keys, None, "shadow")
    await client.delete(keys.mode)


async def test_writer_writes_extras_with_the_verdict(client: aioredis.Redis, keys: Keys) -> None:
    st = NodeStatus(node_id="a", model="m", state=HealthState.HEALTHY, routed=True, since_ts=0.0,
                    reason="normal")
    tick = ModelTick(model="m", ts=1.0, transitions=(), routing=frozenset({"a", "b"}),
                     quarantine={}, statuses=(st,))
    w = RoutingWriter(client, keys.prefix)
    events = tuple(json.dumps({"n": i}) for i in range(EVENTS_CAP + 5))
    assert await w.apply(tick, Extras(shadow=frozenset({"a"}), annotations={"a": {"mode": "observe"}},
                                      events=events))
    assert await w.write_history("m", {"a": "[1]"})     # after the routing write, as the worker
    assert await client.smembers(keys.shadow("m")) == {b"a"}
    assert await client.hgetall(keys.history("m")) == {b"a": b"[1]"}
    newest = await client.lrange(keys.events("m"), 0, -1)
    assert len(newest) == EVENTS_CAP and json.loads(newest[0]) == {"n": EVENTS_CAP + 4}
    assert json.loads(await client.hget(keys.nodes("m"), "a"))["mode"] == "observe"
    # Without extras the shadow set and the history are left as they are.
    assert await w.apply(tick)
    assert await client.smembers(keys.shadow("m")) == {b"a"}
    assert await client.hgetall(keys.history("m")) == {b"a": b"[1]"}
    await client.delete(*(k(keys, "m") for k in (Keys.routing, Keys.version, Keys.quarantine,
                                                  Keys.nodes, Keys.shadow, Keys.history,
                                                  Keys.events)), keys.models)
