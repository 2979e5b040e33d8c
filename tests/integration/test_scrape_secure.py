"""`tailguard scrape` over Kafka SASL_SSL: the same settings as every other client, and a one-line refusal.

Two simulated vLLM servers serve ``/metrics`` in the test's event loop;
``tailguard scrape --once`` (a subprocess) publishes their histogram events
through the local stack's SASL_SSL listener (SCRAM-SHA-512, throwaway CA),
and a consumer with the same settings reads them back. A wrong password
stops the bridge at start with one line naming the setting, and no secret.
The secure stack fixture is test_secure's (it fails, never skips, when the
listeners are missing).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from test_secure import SecureStack, secure_stack  # noqa: F401 - the fixture
from worker_harness import ROOT

from tailguard.security import kafka_client_options
from tailguard.settings import load
from tailguard.sim import scenario as sc
from tailguard.sim.fleet import Fleet, Listening
from tailguard.sim.metrics_fleet import MetricsReporter, SelfTraffic, file_sd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCENARIO = """
duration_s = 600
rate_per_s = 40
[[models]]
name = "llama"
p50_ms = 500
[nodes]
count = 2
hardware = "L4"
"""


def scrape(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")} | env
    return subprocess.run([sys.executable, "-m", "tailguard.cli", "scrape", *argv], env=full, cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90, check=False)


async def test_scrape_publishes_over_sasl_ssl_and_a_wrong_password_is_one_line(
        secure_stack: SecureStack, unique_name: Callable[[str], str], tmp_path: Path) -> None:  # noqa: F811
    topic = unique_name("scrape-sec")
    kafka_env = secure_stack.kafka_env(TAILGUARD_TOPIC_LATENCY_EVENTS=topic, TAILGUARD_SCRAPE_METRICS_PORT="0")
    options = kafka_client_options(load(kafka_env))
    admin = AIOKafkaAdminClient(bootstrap_servers=secure_stack.kafka, **options)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()

    scenario = sc.loads(SCENARIO, source="scrape_secure.toml")
    reporter = MetricsReporter(scenario, "vllm")
    targets = tmp_path / "targets.json"
    found: dict[str, tuple[str, str]] = {}

    def on_listen(info: Listening) -> None:
        found[info.node_id] = (f"127.0.0.1:{info.port}", info.hardware)
        file_sd(found, "vllm", str(targets))

    async with Fleet(scenario, reporter, base_port=0, on_listen=on_listen, metrics=reporter) as fleet, \
            SelfTraffic(reporter, lambda n: n in fleet.listening, seed=5, scenario_time=fleet.scenario_time):
        done = await asyncio.to_thread(scrape, ["--file-sd", str(targets), "--once", "--interval-s", "1"],
                                       kafka_env)
        assert done.returncode == 0, done.stderr
        assert "2/2 targets answered" in done.stderr, done.stderr

        wrong = tmp_path / "wrong"
        wrong.write_text(secrets.token_hex(16))
        refused = await asyncio.to_thread(scrape, ["--file-sd", str(targets), "--once"],
                                          {**kafka_env, "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(wrong)})
    lines = [ln for ln in (refused.stdout + refused.stderr).splitlines() if ln.strip()]
    assert refused.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("tailguard scrape: TAILGUARD_KAFKA_SASL_PASSWORD"), lines
    assert wrong.read_text() not in lines[0] and secure_stack.kafka_password() not in lines[0]

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=secure_stack.kafka, auto_offset_reset="earliest",
                                enable_auto_commit=False, **options)
    await consumer.start()
    try:
        got = await consumer.getmany(timeout_ms=10_000)
    finally:
        await consumer.stop()
    records = [r for recs in got.values() for r in recs]
    events = [json.loads(r.value) for r in records]
    assert {r.key for r in records} == {b"gpu-node-01|llama", b"gpu-node-02|llama"}, records
    assert {e["type"] for e in events} == {"histogram"} and {e["metric"] for e in events} == {"e2e"}
    assert all(e["hardware"] == "L4" and sum(e["counts"]) > 0 for e in events), events
