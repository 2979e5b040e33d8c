"""A flood of model names through the real worker: kcat, real Kafka and Redis.

Six real nodes of one model report (the harness's Feeder). Then ``FLOOD_MODELS`` distinct
model names send one event each (kcat from a file, keyed ``node|model``), and one real node
turns 3x slow at the same moment. Held: the slow node leaves routing within the usual time;
at most ``max_models`` models are ever in ``<prefix>:models``; the rest of the flood is
counted (``tailguard_samples_dropped_total{reason="model_limit"}``); once the flood's models
are forgotten, ``<prefix>:models`` is the real model alone, no key of a flood model is left,
and the worker's RSS is within 10 % of its pre-flood level.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from test_flood import metric, settled_rss_mb
from worker_harness import Feeder, Worker, WorkerEnv, free_port, routing

# serial: RSS before/after within 10 %, and detection timed, under a flood: not beside other tests.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]

MODEL = "llama"
REAL = [f"real-{i}" for i in range(6)]
SLOW = "real-5"
FLOOD_MODELS = int(os.environ.get("FLOOD_TEST_MODELS", 100_000))
MAX_MODELS = 20
TICK_S = 2.0


def model_flood_file(path: Path, n: int) -> Path:
    now = time.time()
    with path.open("w") as f:
        for i in range(n):
            model = f"flood-model-{i:06d}"
            ev = json.dumps({"node_id": "n", "model": model, "ts": now, "latency_us": 900.0})
            f.write(f"n|{model}\t{ev}\n")
    return path


async def test_a_flood_of_model_names_is_bounded_forgotten_and_blinds_nobody(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    metrics_port = free_port()
    env = WorkerEnv(unique_name("mflood"), kafka_bootstrap, redis_url, extra={
        "TAILGUARD_TICK_INTERVAL_S": str(TICK_S), "TAILGUARD_WARMUP_S": "12",
        "TAILGUARD_SILENT_AFTER_S": "6", "TAILGUARD_RESTART_GAP_S": "2",
        "TAILGUARD_FORGET_AFTER_S": "20", "TAILGUARD_WINDOW_SIZE": "200",
        "TAILGUARD_METRICS_PORT": str(metrics_port), "TAILGUARD_MAX_MODELS": str(MAX_MODELS)})
    topic = env.topic("latency_events")
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    worker = Worker(env.environ(), tmp_path / "worker.log")
    models_key = f"{env.name}:models"
    most_models = 0

    async def models() -> set[str]:
        nonlocal most_models
        got = {m.decode() for m in await r.smembers(models_key)}
        most_models = max(most_models, len(got))
        return got

    async def until(pred: Callable[[], object], timeout_s: float, what: str) -> float:
        deadline = time.monotonic() + timeout_s
        while not await pred():   # type: ignore[misc]
            feeder.check()
            await models()
            assert time.monotonic() < deadline, f"{what}\n{worker.tail()}"
            await asyncio.sleep(0.25)
        return time.time()

    try:
        async with Feeder(kafka_bootstrap, topic, {MODEL: REAL}) as feeder:
            async def all_routed() -> bool:
                return await routing(r, env.name, MODEL) == set(REAL)
            await until(all_routed, 60, "the real nodes were never routed")
            # Steady state before the flood, measured as after it (settled_rss_mb).
            rss_before = await settled_rss_mb(worker.proc.pid, metrics_port, models)

            path = await asyncio.to_thread(model_flood_file, tmp_path / "flood.txt", FLOOD_MODELS)
            t_flood = time.time()
            feeder.slow.add((SLOW, MODEL))
            with path.open("rb") as f:
                await asyncio.to_thread(subprocess.run, [
                    "kcat", "-P", "-b", kafka_bootstrap, "-t", topic, "-K", "\t", "-z", "lz4"],
                    stdin=f, check=True, timeout=120)

            async def slow_out() -> bool:
                return await routing(r, env.name, MODEL) == set(REAL) - {SLOW}
            t_out = await until(slow_out, 60, "the slow node never left routing")

            async def only_real() -> bool:
                return await models() == {MODEL} and metric(
                    metrics_port, "tailguard_series_tracked") <= len(REAL)
            await until(only_real, 120, "the flood's models were never forgotten")
            # Memory is given back over the ticks after the forget.
            rss_after = await settled_rss_mb(worker.proc.pid, metrics_port, models)
            dropped = metric(metrics_port, "tailguard_samples_dropped_total", reason="model_limit")
            left = [k async for k in r.scan_iter(match=f"{env.name}:*flood-model-*")]
        assert worker.proc.poll() is None, worker.tail()
    finally:
        worker.stop()
        await r.aclose()

    report = (f"flood of {FLOOD_MODELS} model names; slow node out {t_out - t_flood:.1f} s "
              f"after; at most {most_models} models in Redis; {dropped:.0f} events dropped "
              f"(model_limit); RSS {rss_before:.0f} -> {rss_after:.0f} MB")
    print(report)
    assert t_out - t_flood < 16, report                     # as with no flood: a few ticks
    assert most_models <= MAX_MODELS, report
    assert dropped >= FLOOD_MODELS - 10 * MAX_MODELS, report
    assert not left, left[:5]
    assert rss_after <= 1.10 * rss_before, report
