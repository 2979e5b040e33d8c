"""A model stage 2 forgot (``ModelTick.forgotten``) leaves Redis in one script run: out of
``P:models``, every key of it deleted, the other models untouched (real Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import Extras
from tailguard.routing.client import connect
from tailguard.routing.keys import Keys
from tailguard.routing.writer import RoutingWriter

pytestmark = pytest.mark.integration


def _tick(model: str, nodes: set[str], *, forgotten: bool = False) -> ModelTick:
    if forgotten:
        return ModelTick(model=model, ts=200.0, transitions=(), routing=frozenset(),
                         quarantine={}, statuses=(), forgotten=True)
    statuses = tuple(NodeStatus(node_id=n, model=model, state=HealthState.HEALTHY, routed=True,
                                since_ts=100.0, reason="normal", ratio=2.0, samples=500)
                     for n in sorted(nodes))
    return ModelTick(model=model, ts=100.0, transitions=(), routing=frozenset(nodes),
                     quarantine={"q": 500.0}, statuses=statuses)


@pytest.fixture
async def client(redis_url: str, unique_name: Callable[[str], str]
                 ) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    c = connect(redis_url)
    prefix = unique_name("forget")
    yield c, prefix
    found = [k async for k in c.scan_iter(match=f"{prefix}:*")]
    if found:
        await c.delete(*found)
    await c.aclose()


async def test_a_forgotten_model_leaves_the_models_set_and_its_keys_are_deleted(
        client: tuple[aioredis.Redis, str]) -> None:
    r, prefix = client
    k = Keys(prefix)
    w = RoutingWriter(r, prefix)
    extras = Extras(shadow=frozenset({"a"}), events=('{"x":1}',))
    assert await w.apply(_tick("flood model", {"a"}), extras)
    assert await w.write_history("flood model", {"a": "[]"})
    assert await w.apply(_tick("llm", {"b"}), extras)
    flood_keys = [k.routing("flood model"), k.version("flood model"), k.quarantine("flood model"),
                  k.nodes("flood model"), k.shadow("flood model"), k.history("flood model"),
                  k.events("flood model"), k.held_out("flood model")]
    assert await r.exists(*flood_keys) == len(flood_keys) - 1     # no held-out node

    assert await w.apply(_tick("flood model", set(), forgotten=True))
    assert await r.smembers(k.models) == {b"llm"}
    assert await r.exists(*flood_keys) == 0
    assert await r.smembers(k.routing("llm")) == {b"b"}          # the other model untouched
    # Forgetting again (a retry) is harmless, and the model may come back as new.
    assert await w.apply(_tick("flood model", set(), forgotten=True))
    assert await w.apply(_tick("flood model", {"c"}))
    assert await r.smembers(k.routing("flood model")) == {b"c"}
