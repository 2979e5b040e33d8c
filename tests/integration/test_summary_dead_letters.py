"""Corrupt summary batches on the real broker: dead-lettered, and the stream goes on.

A worker routes a model; garbage arrives on ``node-window-stats`` in the model's partition
(keyed by the model, as stage 1 keys its batches): a batch cut short, one with a wrong
version, one whose names are noise, plain bytes. Each ends on the dead-letter topic with its
original bytes and reason; stage 2 keeps reading the good batches around them: a node that
turns slow afterwards leaves routing, and the worker logs the reason once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from worker_harness import NODES, Feeder, produce, read_topic, routing, running_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

GOOD_BATCH_HEAD = b"\xf5TS\x01\x00\x00"


async def test_corrupt_summary_batches_are_dead_lettered_and_routing_goes_on(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    async with running_worker(kafka_bootstrap, redis_url, unique_name("dlq"),
                              tmp_path) as (env, r, worker):
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES}) as feeder:
            async def all_routed() -> bool:
                return await routing(r, env.name, "llm") == set(NODES)
            await wait_for(all_routed, 60, "every node in routing", worker.tail)
            stats = env.topic("window_stats")
            good = [rec.value for rec in await read_topic(kafka_bootstrap, stats)
                    if rec.value.startswith(GOOD_BATCH_HEAD)]
            assert good, "stage 1 sent no summary batch"
            model_batch = good[-1]
            garbage = [model_batch[:-8],                              # cut short
                       model_batch[:3] + b"\x07" + model_batch[4:],   # a version from the future
                       model_batch[:20] + b"\xff" * 24 + model_batch[44:],   # names are noise
                       b"\xf5TS garbage"]
            await produce(kafka_bootstrap, stats, [(b"llm", raw) for raw in garbage])

            async def dead_letters() -> list[object] | None:
                recs = await read_topic(kafka_bootstrap, env.topic("dead_letter"))
                return recs if len(recs) >= len(garbage) else None
            recs = await wait_for(dead_letters, 30, "the garbage on the dead-letter topic",
                                  worker.tail)
            assert sorted(rec.value for rec in recs) == sorted(garbage)
            for rec in recs:
                headers = dict(rec.headers)
                assert headers["tailguard.reason"] == b"bad_batch", headers
                assert headers["tailguard.topic"] == stats.encode()
                assert rec.key == b"llm"
            feeder.slow.add(("slow", "llm"))                 # stage 2 still judges: it leaves

            async def slow_out() -> bool:
                return await routing(r, env.name, "llm") == set(NODES) - {"slow"}
            await wait_for(slow_out, 60, "the slow node to leave routing after the garbage",
                           worker.tail)
            feeder.check()
        log = worker.log()
        assert log.count("(bad_batch)") == 1, log[-3000:]     # logged once for the 4
