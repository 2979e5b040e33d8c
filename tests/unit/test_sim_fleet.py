"""Simulated nodes: HTTP behaviour, reporting, probes and the fault timeline (fake clock, no sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tailguard.sim import scenario as sc
from tailguard.sim import spec
from tailguard.sim.fleet import NODE_HEADER, PROBE_HEADER, Fleet, SimNode
from tailguard.sim.latency import RequestSizes
from tailguard.sim.load import Recorder

SCEN = """
duration_s = 600
[[models]]
name = "m"
p50_ms = 100
sigma = 0.1
[[models]]
name = "chat"
kind = "llm"
jitter_sigma = 0.0
[nodes]
count = 2
[nodes.override.gpu-node-02]
models = ["m"]
[[faults]]
node = "gpu-node-01"
model = "m"
kind = "slowdown"
onset_s = 300
factor = 3
[[faults]]
node = "gpu-node-02"
kind = "errors"
share = 1.0
onset_s = 100
"""


@dataclass
class FakeReporter:
    records: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[tuple[str, str, str | None]] = field(default_factory=list)

    def record(self, node_id: str, model: str, latency_us: float, **kw: Any) -> None:
        self.records.append({"node_id": node_id, "model": model, "latency_us": latency_us, **kw})

    def heartbeat(self, node_id: str, model: str, hardware: str | None = None) -> None:
        self.heartbeats.append((node_id, model, hardware))


class FakeClock:
    """Monotonic time; ``sleep`` advances it instead of waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.fixture
def scenario(monkeypatch: pytest.MonkeyPatch) -> sc.Scenario:
    monkeypatch.setattr(spec, "request_sizes", lambda t: RequestSizes(t, np.array([[400, 11]], dtype=np.int64)))
    return sc.loads(SCEN.replace('duration_s = 600', 'duration_s = 600\nemit_tokens = true\nemit_ttft = true'),
                    source="t.toml")


def make_node(s: sc.Scenario, index: int, rep: FakeReporter, clock: FakeClock,
              t_s: list[float]) -> SimNode:
    return SimNode(s, index, rep, scenario_time=lambda: t_s[0], seed=1, sleep=clock.sleep, monotonic=clock)


@pytest.fixture
async def client(scenario: sc.Scenario) -> AsyncIterator[tuple[TestClient[Any, Any], FakeReporter, FakeClock,
                                                                 list[float]]]:
    rep, clock, t_s = FakeReporter(), FakeClock(), [0.0]
    node = make_node(scenario, 0, rep, clock, t_s)
    async with TestClient(TestServer(node.app())) as c:
        yield c, rep, clock, t_s


async def test_completion_sleeps_the_drawn_latency_and_reports_it(client: Any) -> None:
    c, rep, clock, _ = client
    r = await c.post("/v1/completions", json={"model": "m", "max_tokens": 8})
    body = await r.json()
    assert r.status == 200 and r.headers[NODE_HEADER] == "gpu-node-01" and body["node_id"] == "gpu-node-01"
    (rec,) = rep.records
    assert rec["latency_us"] == pytest.approx(clock.slept[0] * 1e6)
    assert rec["ok"] is True and rec["probe"] is False and rec["hardware"] == "A100"
    assert rec["input_tokens"] is None and rec["ttft_us"] is None      # lognormal model: no sizes


async def test_probe_header_is_reported_as_probe(client: Any) -> None:
    c, rep, _, _ = client
    await c.post("/v1/completions", json={"model": "m"}, headers={PROBE_HEADER: "1"})
    await c.post("/v1/completions", json={"model": "m"})
    assert [r["probe"] for r in rep.records] == [True, False]


async def test_llm_requests_use_and_report_their_sizes(client: Any) -> None:
    c, rep, clock, _ = client
    r = await c.post("/v1/completions", json={"model": "chat", "max_tokens": 21, "input_tokens": 1000})
    usage = (await r.json())["usage"]
    assert usage == {"prompt_tokens": 1000, "completion_tokens": 21, "total_tokens": 1021}
    (rec,) = rep.records
    assert (rec["input_tokens"], rec["output_tokens"]) == (1000, 21)
    assert rec["ttft_us"] == pytest.approx(50_000 + 250 * 1000)
    assert clock.slept[0] == pytest.approx((50_000 + 250 * 1000 + 30_000 * 20) / 1e6)
    await c.post("/v1/completions", json={"model": "chat", "prompt": "x" * 400})   # ~100 tokens, size drawn
    assert rep.records[1]["input_tokens"] == 100 and rep.records[1]["output_tokens"] == 11


async def test_faults_follow_the_scenario_clock(client: Any) -> None:
    c, _, clock, t_s = client
    for t in (100.0, 400.0):
        t_s[0] = t
        for _ in range(200):
            await c.post("/v1/completions", json={"model": "m"})
    before, after = np.median(clock.slept[:200]), np.median(clock.slept[200:])
    assert after / before == pytest.approx(3.0, rel=0.1)


@pytest.mark.parametrize(("body", "status", "text"), [
    ({"model": "nope"}, 404, "served: m, chat"),
    ({"model": "m", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "m", "max_tokens": True}, 400, "max_tokens"),
    ([1, 2], 400, "JSON object"),
])
async def test_bad_requests_are_rejected_and_not_reported(client: Any, body: Any, status: int, text: str) -> None:
    c, rep, _, _ = client
    r = await c.post("/v1/completions", json=body)
    assert r.status == status and text in (await r.json())["error"]["message"]
    assert rep.records == []


async def test_errors_fault_answers_500_and_reports_ok_false(scenario: sc.Scenario) -> None:
    rep, clock, t_s = FakeReporter(), FakeClock(), [200.0]
    node = make_node(scenario, 1, rep, clock, t_s)
    async with TestClient(TestServer(node.app())) as c:
        r = await c.post("/v1/completions", json={"model": "m"})
        assert r.status == 500
        r = await c.post("/v1/completions", json={"model": "chat"})
        assert r.status == 404
        h = await (await c.get("/healthz")).json()
    assert [x["ok"] for x in rep.records] == [False]
    assert h == {"node_id": "gpu-node-02", "models": ["m"], "hardware": "A100", "requests": 1,
                 "scenario_time_s": 200.0}


async def test_fleet_listens_per_node_announces_and_scales_time(scenario: sc.Scenario) -> None:
    rep, clock = FakeReporter(), FakeClock()
    seen: list[str] = []
    async with Fleet(scenario, rep, base_port=0, time_scale=10.0, monotonic=clock,
                     on_listen=lambda info: seen.append(info.node_id)) as fleet:
        assert seen == ["gpu-node-01", "gpu-node-02"]
        assert len({i.port for i in fleet.listening.values()}) == 2
        assert rep.heartbeats == [("gpu-node-01", "m", "A100"), ("gpu-node-01", "chat", "A100"),
                                  ("gpu-node-02", "m", "A100")]
        clock.now += 30.0
        assert fleet.scenario_time() == pytest.approx(300.0)


def test_fleet_rejects_bad_arguments(scenario: sc.Scenario) -> None:
    with pytest.raises(ValueError, match="time_scale"):
        Fleet(scenario, FakeReporter(), base_port=0, time_scale=0.0)
    with pytest.raises(ValueError, match="base_port"):
        Fleet(scenario, FakeReporter(), base_port=65535)


def test_load_recorder_reports_interval_and_summary_quantiles() -> None:
    rec = Recorder(interval_s=5.0)
    for i in range(100):
        rec.on_sent()
        rec.on_done((i + 1) / 1000, True, "a" if i % 2 else "b")
    rec.on_sent()
    rec.on_done(9.0, False, None)
    line = rec.interval(5.0, 1764680005.0)
    assert (line["sent"], line["completed"], line["errors"]) == (101, 100, 1)
    assert line["p50_ms"] == pytest.approx(50.5) and line["p99_ms"] == pytest.approx(99.01)
    assert line["by_node"] == {"a": 50, "b": 50}
    assert rec.interval(10.0, 1764680010.0)["completed"] == 0
    s = rec.summary(10.0)
    assert s["summary"] is True and s["completed"] == 100 and s["errors"] == 1
    assert s["by_node"]["a"]["completed"] == 50


async def test_slots_queue_requests_beyond_them_and_report_the_wait(scenario: sc.Scenario) -> None:
    rep, clock = FakeReporter(), FakeClock()
    gates: list[asyncio.Event] = []

    async def gated_sleep(s: float) -> None:     # a request is in service until its gate opens
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        clock.now += s

    node = SimNode(scenario, 0, rep, scenario_time=lambda: 0.0, seed=1, sleep=gated_sleep, monotonic=clock, slots=1)
    async with TestClient(TestServer(node.app())) as c:
        first = asyncio.create_task(c.post("/v1/completions", json={"model": "m"}))
        second = asyncio.create_task(c.post("/v1/completions", json={"model": "m"}))
        while len(gates) < 1:
            await asyncio.sleep(0.001)
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert len(gates) == 1                    # the second waits for the only slot
        gates[0].set()
        while len(gates) < 2:
            await asyncio.sleep(0.001)
        gates[1].set()
        assert (await first).status == 200 and (await second).status == 200
    lat = [r["latency_us"] for r in rep.records]
    assert lat[1] > lat[0]                       # the second's latency includes its wait
    with pytest.raises(ValueError, match="slots"):
        SimNode(scenario, 0, rep, scenario_time=lambda: 0.0, seed=1, slots=0)
