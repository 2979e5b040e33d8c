"""The seed's recovery loop, closed, against the real Kafka and Redis.

A node turns slow, is quarantined, its diagnostics agent (fake GPU tools
replaying an XID 79) answers not_recoverable, the worker retires it and the
replace hook runs exactly once — also after the worker restarts. The Redis
ledger's claim semantics are checked on their own too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from worker_harness import (
    NODES,
    ROOT,
    Feeder,
    Worker,
    WorkerEnv,
    health_events,
    read_topic,
    routing,
    ticks_written,
    wait_for,
)

sys.path.insert(0, str(ROOT / "tests" / "agent"))
from gpu_fakes import fake_env

from tailguard.streaming.replace import LEDGER_TTL_S, RedisLedger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_slow_node_quarantined_diagnosed_not_recoverable_retired_and_replaced_once(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    calls = tmp_path / "replaced.txt"
    env = WorkerEnv(unique_name("w"), kafka_bootstrap, redis_url, extra={
        "TAILGUARD_REPLACE_COMMAND": f'echo "$TAILGUARD_NODE_ID $TAILGUARD_MODEL $TAILGUARD_REASON '
                                     f'$TAILGUARD_RETIREMENT_ID" >> {calls}; echo replaced',
        "TAILGUARD_REPLACE_ATTEMPTS": "2"})
    await env.create_topics()
    r = aioredis.Redis.from_url(redis_url)
    worker = Worker(env.environ(), tmp_path / "worker.log")
    agent_env = fake_env("xid79")
    agent_env.update({k: v for k, v in env.environ().items() if k in (
        "TAILGUARD_KAFKA_BOOTSTRAP", "TAILGUARD_TOPIC_DIAGNOSTICS_REQUESTS", "TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS")})
    (tmp_path / "agent.toml").write_text(f'state_dir = "{tmp_path}"\n')
    agent_log = open(tmp_path / "agent.log", "ab")  # noqa: SIM115 - closed below
    agent = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "diagnose", "--node", "slow",
                              "--config", str(tmp_path / "agent.toml"), "--group", env.name + "-agent"],
                             cwd=ROOT, env=agent_env, stdout=agent_log, stderr=subprocess.STDOUT)

    def logs() -> str:
        return worker.tail() + "\n--- agent\n" + (tmp_path / "agent.log").read_text(errors="replace")[-3000:]

    async def replaced() -> list[dict[str, Any]]:
        return [json.loads(m.value) for m in await read_topic(kafka_bootstrap, env.topic("replacements"))]

    try:
        async with Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES},
                          slow={("slow", "llm")}) as feeder:
            async def retired() -> list[dict[str, Any]]:
                feeder.check()
                return [e for e in await health_events(kafka_bootstrap, env)
                        if e["node_id"] == "slow" and e["to"] == "retired"]
            (ret,) = await wait_for(retired, 100, "the slow node to be retired", logs)
            assert (ret["from"], ret["reason"]) in {("quarantined", "diagnostics_unrecoverable"),
                                                    ("unhealthy", "diagnostics_unrecoverable")}, ret
            path = [e["to"] for e in await health_events(kafka_bootstrap, env) if e["node_id"] == "slow"]
            assert "unhealthy" in path and path[-1] == "retired", path
            # The agent's answer, in the result contract, with its evidence.
            (res,) = [json.loads(m.value) for m in await read_topic(kafka_bootstrap, env.topic("diagnostics_results"))]
            assert (res["node_id"], res["model"], res["recoverable"], res["verdict"]) == (
                "slow", "llm", False, "not_recoverable")
            assert "xid_fatal" in res["reasons"]

            (out,) = await wait_for(replaced, 30, "the replace outcome", logs)
            assert (out["node_id"], out["model"], out["outcome"], out["attempts"], out["runs"]) == (
                "slow", "llm", "succeeded", 1, 1), out
            assert out["action"] == "command" and out["detail"] == "exit 0: replaced"
            assert calls.read_text().split() == ["slow", "llm", "diagnostics_unrecoverable", out["retirement_id"]]
            assert await routing(r, env.name, "llm") == {"n0", "n1", "n2", "n3"}

            # The worker restarts: the node is still retired (changelog), the hook does not run again.
            worker.stop()
            worker = Worker(env.environ(), tmp_path / "worker2.log")

            async def evaluating_again() -> bool:
                return "stage 2 owns" in worker.log()
            await wait_for(evaluating_again, 60, "the restarted worker to evaluate", logs)
            # Six ticks, each offering the retired node to the hook (which must not run again).
            await ticks_written(r, env.name, "llm", "slow", 6, 60, logs)
            assert worker.proc.poll() is None, worker.tail()
            status = json.loads((await r.hget(f"{env.name}:nodes:llm", "slow")) or b"{}")
            assert status.get("state") == "retired", status
        assert len(calls.read_text().splitlines()) == 1, calls.read_text()
        assert len(await replaced()) == 1
        rec = json.loads(await r.get(f"{env.name}:replace:{out['retirement_id']}"))
        assert rec["state"] == "succeeded" and await r.ttl(f"{env.name}:replace:{out['retirement_id']}") > 0
    finally:
        agent.terminate()
        agent.wait(15)
        agent_log.close()
        worker.stop()
        await r.aclose()


async def test_redis_ledger_claims_once_and_takes_over_an_expired_lease(
        redis_url: str, unique_name: Callable[[str], str]) -> None:
    r = aioredis.Redis.from_url(redis_url)
    prefix = unique_name("ledger")
    ledger = RedisLedger(r, prefix)
    now = time.time()
    try:
        rec = {"state": "running", "lease_until": now + 100}
        assert await ledger.claim("r1", rec, now) == 1
        assert await ledger.claim("r1", rec, now + 50) == -1        # leased by a live worker
        assert await ledger.claim("r1", rec, now + 101) == 2        # the holder died: taken over
        await ledger.finish("r1", {"state": "succeeded"})
        assert await ledger.claim("r1", rec, now + 1e6) == 0         # done is done
        assert LEDGER_TTL_S - 10 < await r.ttl(ledger.key("r1")) <= LEDGER_TTL_S
    finally:
        await r.delete(ledger.key("r1"))
        await r.aclose()
