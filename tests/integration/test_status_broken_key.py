"""``tailguard status`` and the status page's JSON with one model's key of the wrong type,
on the real Redis: every other model is shown, the broken one is marked naming its key and
the type found, and "cannot reach Redis" is said only when Redis cannot be reached."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing import status
from tailguard.routing.client import connect
from tailguard.routing.keys import Keys
from tailguard.routing.writer import RoutingWriter
from tailguard.streaming.page import page_data

pytestmark = pytest.mark.integration

GOOD, BROKEN = "good-model", "broken model"


def _tick(model: str, routing: set[str]) -> ModelTick:
    statuses = tuple(NodeStatus(node_id=n, model=model, state=HealthState.HEALTHY, routed=True,
                                since_ts=100.0, reason="normal", ratio=2.0, samples=500,
                                latency_p50_us=150_000.0, latency_p99_us=300_000.0)
                     for n in sorted(routing))
    return ModelTick(model=model, ts=100.0, transitions=(), routing=frozenset(routing),
                     quarantine={}, statuses=statuses)


def test_a_wrong_type_key_marks_its_model_and_every_other_model_is_shown(
    redis_url: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = unique_name("status-broken")
    keys = Keys(prefix)

    async def setup() -> None:
        c = connect(redis_url)
        try:
            w = RoutingWriter(c, prefix)
            assert await w.apply(_tick(GOOD, {"g1", "g2"}))
            assert await w.apply(_tick(BROKEN, {"b1"}))
            await c.delete(keys.routing(BROKEN))
            await c.set(keys.routing(BROKEN), "not a set")      # the wrong type
        finally:
            await c.aclose()

    async def page() -> dict[str, Any]:
        c = connect(redis_url)
        try:
            return await page_data(c, prefix, time.time(), "enforce")
        finally:
            await c.aclose()

    async def cleanup() -> None:
        c = connect(redis_url)
        try:
            found = [k async for k in c.scan_iter(match=f"{prefix}:*")]
            if found:
                await c.delete(*found)
        finally:
            await c.aclose()

    asyncio.run(setup())
    try:
        monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_url)
        monkeypatch.setenv("TAILGUARD_KEY_PREFIX", prefix)

        # The table: both models, the broken one marked with its key and the type found.
        code = status.main([])
        out, err = capsys.readouterr()
        assert code == status.EXIT_UNREADABLE, (out, err)
        assert "cannot reach Redis" not in out + err
        assert f"model {GOOD}" in out and "g1" in out and "g2" in out
        assert f"model {BROKEN}" in out
        assert keys.routing(BROKEN) in out and "string" in out and "set" in out
        assert keys.routing(BROKEN) in err                      # named on stderr too
        assert "b1" in out                                      # its readable keys still shown

        # The JSON: the same, with the problem as data.
        assert status.main(["--json"]) == status.EXIT_UNREADABLE
        doc = json.loads(capsys.readouterr().out)
        by_model = {m["model"]: m for m in doc["models"]}
        assert set(by_model) == {GOOD, BROKEN}
        assert by_model[GOOD]["errors"] == [] and by_model[GOOD]["routing"] == ["g1", "g2"]
        (problem,) = by_model[BROKEN]["errors"]
        assert problem["key"] == keys.routing(BROKEN)
        assert problem["found"] == "string" and problem["expected"] == "set"

        # The page's JSON: every model, the broken one carrying the same mark.
        data = asyncio.run(page())
        pages = {m["model"]: m for m in data["models"]}
        assert set(pages) == {GOOD, BROKEN}
        assert pages[GOOD]["routing"] == ["g1", "g2"] and pages[GOOD]["errors"] == []
        assert [e["key"] for e in pages[BROKEN]["errors"]] == [keys.routing(BROKEN)]

        # The set of models itself of the wrong type: a message naming that key, not
        # "cannot reach Redis".
        async def break_models() -> None:
            c = connect(redis_url)
            try:
                await c.delete(keys.models)
                await c.set(keys.models, "x")
            finally:
                await c.aclose()
        asyncio.run(break_models())
        assert status.main([]) == 1
        out, err = capsys.readouterr()
        assert "cannot reach Redis" not in out + err
        assert keys.models in err and "string" in err
    finally:
        asyncio.run(cleanup())
