"""The live simulated fleet against the real Kafka: requests become contract events on a topic.

A two-node fleet runs as real HTTP servers on loopback (ephemeral ports) and
reports through the emitter SDK to a unique topic; the load generator drives
traffic at one node; events are read back with a consumer and decoded by
the core's contract decoder. Fails (never skips) when Kafka is unreachable.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tailguard.core.contract.events import Heartbeat, SampleBatch, decode
from tailguard.emitter.emitter import LatencyEmitter
from tailguard.sim import cli
from tailguard.sim import scenario as sc
from tailguard.sim.fleet import PROBE_HEADER, Fleet
from tailguard.sim.load import LoadSpec, run

pytestmark = pytest.mark.integration

SCEN = """
duration_s = 600
emit_tokens = true
emit_ttft = true
[[models]]
name = "chat"
kind = "llm"
trace = "conv"
tpot_ms = 0.5              # keep real sleeps short: a few ms per request
ttft_ms = 1
ttft_per_input_token_ms = 0.001
[nodes]
count = 2
hardware = "L4"
"""


async def _consume(bootstrap: str, topic: str, group: str, want: Callable[[list[SampleBatch | Heartbeat]], bool],
                   timeout_s: float = 60.0) -> list[SampleBatch | Heartbeat]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    events: list[SampleBatch | Heartbeat] = []
    try:
        async def loop() -> None:
            while not want(events):
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    events.extend(decode(m.value) for m in msgs if m.value is not None)
        await asyncio.wait_for(loop(), timeout=timeout_s)
    finally:
        await consumer.stop()
    return events


async def test_fleet_reports_requests_probes_and_heartbeats_to_kafka(
        kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("sim-topic"), unique_name("sim-group")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        s = sc.loads(SCEN, source="it.toml")
        async with LatencyEmitter(kafka_bootstrap, topic=topic, linger_s=0.05, heartbeat_interval_s=1.0) as em:
            async with Fleet(s, em, base_port=0) as fleet:
                url = fleet.listening["gpu-node-01"].url
                async with aiohttp.ClientSession() as http:
                    for i in range(30):
                        headers = {PROBE_HEADER: "1"} if i % 10 == 0 else {}
                        async with http.post(url + "/v1/completions", json={"model": "chat", "max_tokens": 5},
                                             headers=headers) as r:
                            assert r.status == 200
                summary = await run(LoadSpec(fleet.listening["gpu-node-02"].url, 100.0, 1.0, "chat",
                                             interval_s=0.5), sizes=sc.request_sizes("conv"))
            await em.flush()

        def enough(evs: list[SampleBatch | Heartbeat]) -> bool:
            n1 = sum(len(e.ts) for e in evs if isinstance(e, SampleBatch) and e.node_id == "gpu-node-01")
            n2 = sum(len(e.ts) for e in evs if isinstance(e, SampleBatch) and e.node_id == "gpu-node-02")
            return n1 >= 30 and n2 >= summary["completed"]

        events = await _consume(kafka_bootstrap, topic, group, enough)
    finally:
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()

    samples = [e for e in events if isinstance(e, SampleBatch)]
    node1 = [e for e in samples if e.node_id == "gpu-node-01"]
    assert sum(int(e.probe.sum()) for e in node1) == 3
    assert sum(len(e.ts) for e in node1) == 30
    assert all(e.model == "chat" and e.hardware == "L4" for e in samples)
    assert all(e.output_tokens is not None and (e.output_tokens[~e.probe] == 5).all() for e in node1)
    assert all(e.ttft_us is not None and (e.ttft_us <= e.latency_us).all() for e in samples)
    beats = {(e.node_id, e.model) for e in events if isinstance(e, Heartbeat)}
    assert beats == {("gpu-node-01", "chat"), ("gpu-node-02", "chat")}
    # the load generator saw every request it sent answered, and counted them per node
    assert summary["errors"] == 0 and summary["completed"] == summary["sent"] > 50
    assert set(summary["by_node"]) == {"gpu-node-02"}
    assert sum(len(e.ts) for e in samples if e.node_id == "gpu-node-02") == summary["completed"]


async def test_fleet_cli_serves_and_writes_backends(kafka_bootstrap: str, unique_name: Callable[[str], str],
                                                    tmp_path: Path) -> None:
    """`tailguard simulate fleet` as a process: nodes answer on their ports, backends file lists them."""
    scen = tmp_path / "s.toml"
    scen.write_text(SCEN)
    backends = tmp_path / "backends.txt"
    port = 0
    # two free consecutive ports: bind one, check the next
    for _ in range(20):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
        with socket.socket() as b:
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        port = p
        break
    assert port, "no two free consecutive ports on 127.0.0.1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard.cli", "simulate", "fleet", str(scen), "--base-port", str(port),
        "--duration-s", "20",
        "--bootstrap", kafka_bootstrap, "--topic", unique_name("sim-cli"), "--backends-file", str(backends),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        raw = [await asyncio.wait_for(proc.stdout.readline(), 30) for _ in range(2)]
        if not all(raw):
            assert proc.stderr is not None
            pytest.fail("fleet exited: " + (await proc.stderr.read()).decode()[-2000:])
        lines = [json.loads(x) for x in raw]
        assert [ln["node_id"] for ln in lines] == ["gpu-node-01", "gpu-node-02"]
        assert backends.read_text().splitlines() == [f"gpu-node-01=http://127.0.0.1:{port}",
                                                     f"gpu-node-02=http://127.0.0.1:{port + 1}"]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port + 1}/healthz") as r:
            assert (await r.json())["node_id"] == "gpu-node-02"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    assert cli.main(["fleet", str(tmp_path / "missing.toml")]) == 2
