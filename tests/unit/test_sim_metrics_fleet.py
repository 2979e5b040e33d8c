"""The fleet as servers to scrape: self-driven traffic, restarts reset counters, silent nodes answer 503.

Scenario time is a fake clock the test moves; no sockets except in the last
test, which serves one node over real HTTP on an ephemeral loopback port.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tailguard.sim import scenario as sc
from tailguard.sim.fleet import Fleet
from tailguard.sim.metrics_fleet import PROFILE_LABEL, MetricsReporter, SelfTraffic, file_sd
from tailguard.sim.scenario import SimError

SCEN = """
duration_s = 600
rate_per_s = 50
[[models]]
name = "chat"
p50_ms = 200
sigma = 0.2
[nodes]
count = 3
hardware = "A100"
[[faults]]
node = "gpu-node-02"
kind = "slowdown"
onset_s = 0
factor = 3
[[faults]]
node = "gpu-node-03"
kind = "restart"
onset_s = 100
end_s = 110
factor = 1
"""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _count(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} not in the exposition")


def _p50_bucket(text: str) -> float:
    """The first bucket bound holding half the requests (the vLLM e2e histogram)."""
    rows = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:e2e_request_latency_seconds_bucket":
                rows.append((float(s.labels["le"]), s.value))
    rows.sort()
    total = rows[-1][1]
    return next(le for le, c in rows if c >= total / 2)


def _setup() -> tuple[MetricsReporter, SelfTraffic, Clock]:
    s = sc.loads(SCEN, source="t.toml")
    clock = Clock()
    rep = MetricsReporter(s, "vllm")
    rep.bind(clock)
    traffic = SelfTraffic(rep, lambda n: True, seed=7, scenario_time=clock)
    return rep, traffic, clock


def test_self_traffic_serves_the_scenario_rate_and_the_slow_node_is_slower() -> None:
    rep, traffic, clock = _setup()
    clock.t = 10.0
    traffic.step(0.0, 10.0, 10.0)
    pages = {n: rep.page(n, None) for n in ("gpu-node-01", "gpu-node-02")}
    assert all(p[0] == 200 for p in pages.values())
    texts = {n: p[1].decode() for n, p in pages.items()}
    count = _count(texts["gpu-node-01"], "vllm:e2e_request_latency_seconds_count")
    assert 350 <= count <= 650                       # 50/s for 10 s, Poisson
    assert _p50_bucket(texts["gpu-node-01"]) <= 0.3    # P50 200 ms
    assert _p50_bucket(texts["gpu-node-02"]) >= 0.5    # P50 600 ms: 3x slower


def test_a_restarting_node_answers_503_and_comes_back_with_counters_from_zero() -> None:
    rep, traffic, clock = _setup()
    clock.t = 90.0
    traffic.step(0.0, 90.0, 2.0)
    before = _count(rep.page("gpu-node-03", None)[1].decode(), "vllm:e2e_request_latency_seconds_count")
    assert before > 0
    clock.t = 105.0
    status, body, _ = rep.page("gpu-node-03", None)
    assert status == 503 and b"not running" in body
    traffic.step(90.0, 105.0, 2.0)      # a down server serves nothing
    clock.t = 111.0
    traffic.step(110.0, 111.0, 0.5)
    after = _count(rep.page("gpu-node-03", None)[1].decode(), "vllm:e2e_request_latency_seconds_count")
    assert after < before                # a new process: its counters started again
    assert rep.page("gpu-node-01", None)[0] == 200


def test_tgi_refuses_nodes_with_several_models() -> None:
    s = sc.loads(SCEN.replace('[nodes]', '[[models]]\nname = "emb"\n[nodes]\nmodels = ["chat", "emb"]'),
                 source="t.toml")
    with pytest.raises(SimError, match="TGI server serves one model"):
        MetricsReporter(s, "tgi")


def test_file_sd_lists_each_node_with_its_labels(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    groups = file_sd({"b": ("127.0.0.1:2", "H100"), "a": ("127.0.0.1:1", "A100")}, "sglang", str(path))
    assert json.loads(path.read_text()) == groups
    assert groups[0] == {"targets": ["127.0.0.1:1"],
                         "labels": {"instance": "a", "hardware": "A100", PROFILE_LABEL: "sglang"}}


async def test_fleet_serves_metrics_over_http() -> None:
    s = sc.loads(SCEN, source="t.toml")
    rep = MetricsReporter(s, "dynamo")
    async with Fleet(s, rep, base_port=0, metrics=rep) as fleet:
        rep.observe("gpu-node-01", "chat",
                    s.latency("gpu-node-01", "chat").sample(np.random.default_rng(1), np.zeros(20)))
        async with aiohttp.ClientSession() as http, \
                http.get(fleet.listening["gpu-node-01"].url + "/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    assert _count(text, "dynamo_frontend_request_duration_seconds_count") == 20


def test_metrics_without_a_server_means_vllm() -> None:
    from tailguard.sim import cli

    args = cli.parser().parse_args(["fleet", "s.toml", "--metrics"])
    assert args.metrics == "vllm" and args.traffic == "self"
    assert cli.parser().parse_args(["fleet", "s.toml", "--metrics", "tgi"]).metrics == "tgi"
    assert cli.parser().parse_args(["fleet", "s.toml"]).metrics is None
