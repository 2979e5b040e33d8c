"""No code in the servers, end to end: 8 simulated vLLM servers → `tailguard scrape` → Kafka → worker → Redis.

The fleet runs in the test's event loop: 8 nodes serving ``/metrics`` as vLLM
does (:mod:`tailguard.sim.metrics_fleet`), each serving its own requests at 30/s.
``tailguard scrape`` (a subprocess) polls them every second from a
``file_sd`` file the fleet writes; ``tailguard worker`` (a subprocess, 1 s ticks)
judges the histogram events. Nothing in the fleet talks to Kafka. Checked:

- gpu-node-05, 3x slower on every request, leaves the Redis routing set, and no
  other node does;
- gpu-node-03 restarts (its /metrics answers 503 for 3 s, then its counters
  start again from zero, slow at first and decaying over 15 s): it warms up
  again (``restarted``) and is never taken out;
- gpu-node-07 stops answering for good: it leaves routing as ``gone`` (``silent``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from worker_harness import TailguardProcess, Worker, WorkerEnv, health_events, routing, wait_for

from tailguard.sim import scenario as sc
from tailguard.sim.fleet import Fleet, Listening
from tailguard.sim.metrics_fleet import MetricsReporter, SelfTraffic, file_sd

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

SLOW, RESTARTED, SILENT = "gpu-node-05", "gpu-node-03", "gpu-node-07"
RESTART_AT_S, SILENCE_AT_S = 50.0, 75.0

SCENARIO = f"""
duration_s = 3600
rate_per_s = 30
[[models]]
name = "llama"
p50_ms = 600
sigma = 0.25
[nodes]
count = 8
hardware = "A100"
[[faults]]
node = "{SLOW}"
kind = "slowdown"
onset_s = 0
factor = 3
[[faults]]
node = "{RESTARTED}"
kind = "restart"
onset_s = {RESTART_AT_S}
end_s = {RESTART_AT_S + 3}
factor = 3
warmup_s = 15
[[faults]]
node = "{SILENT}"
kind = "silence"
onset_s = {SILENCE_AT_S}
"""


class Scraper(TailguardProcess):
    """`tailguard scrape` with the test's settings, its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__(["scrape"], env, log_path)


async def test_scraped_vllm_fleet_slow_node_leaves_restart_warms_up_silent_node_goes(
        kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    import redis.asyncio as aioredis

    scenario = sc.loads(SCENARIO, source="scrape_e2e.toml")
    targets_file = tmp_path / "targets.json"
    env = WorkerEnv(unique_name("scrape"), kafka_bootstrap, redis_url, extra={
        "TAILGUARD_WARMUP_S": "20", "TAILGUARD_SILENT_AFTER_S": "6", "TAILGUARD_RESTART_GAP_S": "2",
        "TAILGUARD_SCRAPE_FILE_SD": str(targets_file), "TAILGUARD_SCRAPE_INTERVAL_S": "1",
        "TAILGUARD_SCRAPE_TIMEOUT_S": "0.5", "TAILGUARD_SCRAPE_METRICS_PORT": "0"})
    await env.create_topics()
    reporter = MetricsReporter(scenario, "vllm")
    found: dict[str, tuple[str, str]] = {}

    def on_listen(info: Listening) -> None:
        found[info.node_id] = (f"127.0.0.1:{info.port}", info.hardware)
        file_sd(found, "vllm", str(targets_file))

    r = aioredis.Redis.from_url(redis_url)
    worker = scraper = None
    async with Fleet(scenario, reporter, base_port=0, on_listen=on_listen, metrics=reporter) as fleet:
        traffic = SelfTraffic(reporter, lambda n: n in fleet.listening, seed=3, scenario_time=fleet.scenario_time)
        async with traffic:
            try:
                worker = Worker(env.environ(), tmp_path / "worker.log")
                scraper = Scraper(env.environ(), tmp_path / "scrape.log")

                def logs() -> str:
                    assert worker is not None and scraper is not None
                    return f"--- worker\n{worker.tail()}\n--- scrape\n{scraper.tail()}"

                healthy = set(found) - {SLOW}

                async def slow_out() -> bool:
                    return await routing(r, env.name, "llama") == healthy
                await wait_for(slow_out, 150, f"{SLOW} out of routing, the 7 others in", logs)

                # The restart: wait until its warm-up (15 s of slow decay after the 3 s down) is over.
                async def past_restart() -> bool:
                    return fleet.scenario_time() > RESTART_AT_S + 3 + 20
                await wait_for(past_restart, 120, "the restart to be over", logs, every_s=1.0)

                async def restarted_routed() -> bool:
                    return RESTARTED in await routing(r, env.name, "llama")

                async def its_events() -> str:
                    evs = await health_events(kafka_bootstrap, env)
                    return "\n".join(f"{e['node_id']} {e['from']} -> {e['to']} {e['reason']} routed={e['routed']}"
                                     for e in evs if e["node_id"] == RESTARTED)
                try:
                    await wait_for(restarted_routed, 30, f"{RESTARTED} in routing after its restart", logs)
                except AssertionError as e:
                    raise AssertionError(f"{e}\n--- its health changes\n{await its_events()}") from None

                async def silent_gone() -> bool:
                    return SILENT not in await routing(r, env.name, "llama")
                await wait_for(silent_gone, max(0.0, SILENCE_AT_S - fleet.scenario_time()) + 40,
                               f"{SILENT} out of routing after it stopped answering", logs)
                events = await health_events(kafka_bootstrap, env)
                assert worker.proc.poll() is None and scraper.proc.poll() is None, logs()
            finally:
                if scraper is not None:
                    scraper.stop()
                if worker is not None:
                    worker.stop()
                await r.aclose()

    # Taken out of routing after being in it (a first sighting is "warming", not routed yet).
    out = [e for e in events if e["routed"] is False and e["reason"] != "first_seen"]
    assert {e["node_id"] for e in out} == {SLOW, SILENT}, out

    def of(node: str) -> list[dict[str, Any]]:
        return [e for e in out if e["node_id"] == node]

    assert of(SLOW)[0]["to"] == "unhealthy", of(SLOW)
    assert [(e["reason"], e["to"]) for e in of(SILENT)] == [("silent", "gone")], of(SILENT)
    # The restart was seen as one (counters reset: a new instance) and the node stayed in.
    restarted = [e for e in events if e["node_id"] == RESTARTED and e["reason"] == "restarted"]
    assert restarted and all(e["routed"] for e in restarted), restarted
