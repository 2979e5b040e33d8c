"""The status page's JSON carries a histogram model's unresolved flag, on the real Redis: what
metric its buckets cannot resolve and the first bound (tailguard.core.judge.hist_resolution),
written on each node's status by the routing write, gone once a tick finds it resolved."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import Extras
from tailguard.routing.client import connect
from tailguard.routing.keys import Keys
from tailguard.routing.writer import RoutingWriter
from tailguard.streaming.page import page_data

pytestmark = pytest.mark.integration

MODEL, OTHER = "dynamo-model", "event-model"


def _tick(model: str, ts: float, unresolved: tuple[tuple[str, float], ...] = ()) -> ModelTick:
    statuses = tuple(NodeStatus(node_id=n, model=model, state=HealthState.HEALTHY, routed=True,
                                since_ts=100.0, reason="normal", ratio=2.0, samples=500,
                                latency_p50_us=100_000.0, latency_p99_us=200_000.0)
                     for n in ("a", "b", "c"))
    return ModelTick(model=model, ts=ts, transitions=(), routing=frozenset({"a", "b", "c"}),
                     quarantine={}, statuses=statuses, unresolved=unresolved)


def test_the_page_says_which_metric_the_buckets_cannot_resolve_until_they_can(
        redis_url: str, unique_name: Callable[[str], str]) -> None:
    prefix = unique_name("status-unresolved")
    keys = Keys(prefix)

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        c = connect(redis_url)
        try:
            w = RoutingWriter(c, prefix)
            # The stage-2 edge's annotations are kept beside the flag.
            notes = Extras(annotations={"a": {"mode": "enforce"}})
            assert await w.apply(_tick(MODEL, 100.0, (("e2e", 2.0), ("ttft", 0.001))), notes)
            assert await w.apply(_tick(OTHER, 100.0))
            first = await page_data(c, prefix, 100.0, "enforce")
            raw = json.loads(await c.hget(keys.nodes(MODEL), "a"))
            assert raw["mode"] == "enforce" and raw["unresolved"] == {"e2e": 2.0, "ttft": 0.001}
            await w.apply(dataclasses.replace(_tick(MODEL, 130.0), routing=frozenset({"a", "b"})))
            return first, await page_data(c, prefix, 130.0, "enforce")
        finally:
            found = [k async for k in c.scan_iter(match=f"{prefix}:*")]
            if found:
                await c.delete(*found)
            await c.aclose()

    first, later = asyncio.run(run())
    by_model = {m["model"]: m for m in first["models"]}
    assert by_model[MODEL]["unresolved"] == [{"metric": "e2e", "first_bound_s": 2.0},
                                             {"metric": "ttft", "first_bound_s": 0.001}]
    assert by_model[OTHER]["unresolved"] == []
    # A tick that found the buckets resolve the model: the flag is gone from the page.
    assert {m["model"]: m for m in later["models"]}[MODEL]["unresolved"] == []
