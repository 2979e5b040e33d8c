"""Turns on the worker's event loop (:mod:`tailguard.streaming.turns`): a stage-1 tick goes
before a stage-2 tick's next model; the stage-2 tick steps one model at a time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_stage2_ticker import NODES, rig

from tailguard.streaming.turns import Turns

SPINS = 50      # turns of the loop that let every ready task run many times over


async def spin() -> None:
    for _ in range(SPINS):
        await asyncio.sleep(0)


async def test_a_stage2_step_goes_on_at_once_without_a_stage1_tick() -> None:
    turns = Turns(hold_s=60.0)
    step = asyncio.ensure_future(turns.stage2_step())
    await spin()
    assert step.done()


async def test_a_stage2_step_waits_until_the_running_stage1_tick_ends() -> None:
    turns = Turns(hold_s=60.0)
    async with turns.stage1_tick():
        step = asyncio.ensure_future(turns.stage2_step())
        await spin()
        assert not step.done()
    await asyncio.wait_for(step, 5.0)


async def test_a_failing_stage1_tick_still_ends_its_turn() -> None:
    turns = Turns(hold_s=60.0)
    with pytest.raises(RuntimeError):
        async with turns.stage1_tick():
            raise RuntimeError("broker gone")
    await asyncio.wait_for(turns.stage2_step(), 5.0)


async def test_a_stuck_stage1_tick_holds_stage2_for_hold_s_at_most() -> None:
    turns = Turns(hold_s=0.01)
    async with turns.stage1_tick():
        await asyncio.wait_for(turns.stage2_step(), 5.0)    # returns while the tick is still open


def test_hold_s_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="hold_s"):
        Turns(hold_s=-1.0)


async def test_a_stage2_tick_judges_no_further_model_while_a_stage1_tick_runs() -> None:
    r = rig()
    turns = r.ticker.turns = Turns(hold_s=60.0)
    models = ("m", "m2", "m3")
    for m in models:
        r.feed(m)
    pending = r.stage2.pending_summaries()
    assert pending == len(models) * len(NODES)
    async with turns.stage1_tick():
        tick = asyncio.ensure_future(r.ticker.tick())
        await spin()
        assert not tick.done()
        # At most the model being judged when the stage-1 tick began; nothing written yet.
        assert r.stage2.pending_summaries() >= pending - len(NODES)
        assert r.routing.applied == []
    outs = await asyncio.wait_for(tick, 5.0)
    assert [o.tick.model for o in outs] == sorted(models)
    assert sorted(t.model for t in r.routing.applied) == sorted(models)
    assert r.stage2.pending_summaries() == 0


async def test_a_rebalance_between_two_models_cuts_the_stage2_tick_short() -> None:
    r = rig()
    models = ("m", "m2", "m3")
    calls = 0
    ownership = r.ticker.ownership

    class Flipping:
        async def assignment(self) -> Any:
            nonlocal calls
            calls += 1
            return await ownership.assignment() if calls <= 2 else None   # the tick's, one step's

    r.ticker.ownership = Flipping()
    for m in models:
        r.feed(m)
    outs = await r.ticker.tick()
    assert [o.tick.model for o in outs] == ["m", "m2"]
    assert [t.model for t in r.routing.applied] == ["m", "m2"]     # what was judged is written
    assert r.stage2.pending_summaries() == len(NODES)              # m3's wait for the next tick
    r.ticker.ownership = ownership
    later = {o.tick.model: o for o in await r.ticker.tick()}
    assert len(later["m3"].summaries) == len(NODES)


async def test_every_phase_of_a_stage2_tick_lets_stage1_in_after_each_model() -> None:
    r = rig()
    steps = 0

    class Counting(Turns):
        async def stage2_step(self) -> None:
            nonlocal steps
            steps += 1
            await super().stage2_step()

    r.ticker.turns = Counting()
    models = ("m", "m2", "m3")
    for m in models:
        r.feed(m)
    await r.ticker.tick()
    # judged, through the edge, written to Redis, its messages built: a step after each
    assert steps == 4 * len(models)
    assert {key for _, key, _ in r.publisher.sent} == {m.encode() for m in models}
