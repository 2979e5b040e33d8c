"""tailguard's per-node P50/P99 from scraped histograms agree with a real Prometheus' `histogram_quantile`.

Four simulated vLLM servers (one 3x slower) serve ``/metrics``. Debian's
``prometheus`` (installed by scripts/test) scrapes them every second from
the same ``file_sd`` file the test writes. At the same time tailguard's bridge
(:class:`tailguard.scrape.bridge.Bridge` with hist-core's converter) scrapes them into
histogram events. Traffic runs in two phases with quiet gaps, in which both
scrapers catch up: phase A, a gap ending at ``t_a``, phase B, a gap ending at
``t_b``. So the interval ``(t_a, t_b]`` holds exactly phase B's requests for both.
Per node and for q in 0.5 and 0.99, tailguard's quantile (the events of that
interval summed, :func:`tailguard.core.window.hist_window.bucket_quantile`) and Prometheus'
``histogram_quantile`` over the same interval (cumulative buckets at ``t_b``
minus those at ``t_a``, via ``offset``) must fall in the same bucket or in
neighbouring ones.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tailguard.scrape.bridge import Bridge
from tailguard.scrape.run import HttpFetcher
from tailguard.scrape.sd import parse_groups
from tailguard.sim import scenario as sc
from tailguard.sim.exposition import VLLM_E2E
from tailguard.sim.fleet import Fleet, Listening
from tailguard.sim.metrics_fleet import MetricsReporter, SelfTraffic, file_sd

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

NODES = [f"gpu-node-0{i}" for i in range(1, 5)]
SCENARIO = """
duration_s = 3600
rate_per_s = 40
[[models]]
name = "llama"
p50_ms = 700
sigma = 0.6
[nodes]
count = 4
hardware = "A100"
[[faults]]
node = "gpu-node-02"
kind = "slowdown"
onset_s = 0
factor = 3
"""
METRIC = 'vllm[:_]e2e_request_latency_seconds_bucket'   # prometheus_client escapes ':' in OpenMetrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Collected:
    """A publisher that keeps the events (no Kafka: this test compares numbers, not transport)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[object]:
        self.events.append(json.loads(value))
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


@contextlib.contextmanager
def prometheus(tmp_path: Path, targets: Path) -> Any:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        pytest.fail("prometheus not found: ./scripts/test installs it (apt-get install prometheus)")
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(json.dumps({"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
                               "scrape_configs": [{"job_name": "sim", "file_sd_configs": [
                                   {"files": [str(targets)], "refresh_interval": "1s"}]}]}))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}", proc, tmp_path / "prometheus.log"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


async def query(http: aiohttp.ClientSession, base: str, promql: str, at: float | None = None) -> list[Any]:
    params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
    async with http.get(f"{base}/api/v1/query", params=params) as r:
        body = await r.json()
    assert body.get("status") == "success", body
    return list(body["data"]["result"])


@contextlib.asynccontextmanager
async def scraping(bridge: Bridge, every_s: float) -> AsyncIterator[list[int]]:
    cycles = [0]

    async def loop() -> None:
        while True:
            await bridge.scrape_once()
            cycles[0] += 1
            await asyncio.sleep(every_s)

    task = asyncio.create_task(loop())
    try:
        yield cycles
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def bucket(v: float) -> int:
    return bisect.bisect_left(VLLM_E2E, v)


async def test_p50_and_p99_agree_with_prometheus_histogram_quantile_within_one_bucket(tmp_path: Path) -> None:
    from tailguard.core.window.hist_window import bucket_quantile

    scenario = sc.loads(SCENARIO, source="agreement.toml")
    reporter = MetricsReporter(scenario, "vllm")
    targets = tmp_path / "targets.json"
    found: dict[str, tuple[str, str]] = {}

    def on_listen(info: Listening) -> None:
        found[info.node_id] = (f"127.0.0.1:{info.port}", info.hardware)
        file_sd(found, "vllm", str(targets))

    published = Collected()
    async with Fleet(scenario, reporter, base_port=0, on_listen=on_listen, metrics=reporter) as fleet, \
            aiohttp.ClientSession() as http:
        traffic = SelfTraffic(reporter, lambda n: n in fleet.listening, seed=11, scenario_time=fleet.scenario_time)
        bridge = Bridge(HttpFetcher(http), published, timeout_s=0.9, concurrency=8, registry=CollectorRegistry())
        bridge.set_targets(parse_groups(json.loads(targets.read_text()), str(targets)))
        with prometheus(tmp_path, targets) as (base, proc, log_path):
            async with scraping(bridge, 1.0) as cycles:
                deadline = time.monotonic() + 60
                while True:
                    assert proc.poll() is None, log_path.read_text()
                    with contextlib.suppress(aiohttp.ClientError):
                        up = await query(http, base, 'up{job="sim"} == 1')
                        if len(up) == len(NODES) and cycles[0] >= 2:
                            break
                    assert time.monotonic() < deadline, f"Prometheus never scraped the 4 servers\n" \
                                                        f"{log_path.read_text()[-2000:]}"
                    await asyncio.sleep(0.5)
                marks = []
                for run_s in (6.0, 20.0):          # phase A, phase B, each followed by a quiet gap
                    async with traffic:
                        await asyncio.sleep(run_s)
                    await asyncio.sleep(3.5)
                    marks.append(time.time())
                t_a, t_b = marks
            for node in NODES:
                window = [e for e in published.events if e["node_id"] == node and e.get("metric") == "e2e"
                          and t_a < float(e["ts"]) <= t_b]
                assert window, f"no events for {node} in the interval"
                bounds = tuple(window[0]["bounds_s"])
                assert bounds == VLLM_E2E
                counts = tuple(sum(int(e["counts"][i]) for e in window) for i in range(len(bounds) + 1))
                for q in (0.5, 0.99):
                    ours = bucket_quantile(bounds, counts, q)
                    sel = f'{{__name__=~"{METRIC}", instance="{node}"}}'
                    offset = f"{int((t_b - t_a) * 1000)}ms"
                    got = await query(http, base, f"histogram_quantile({q}, sum by (le) ({sel}) - "
                                                  f"sum by (le) ({sel} offset {offset}))", at=t_b)
                    assert len(got) == 1, (node, got)
                    theirs = float(got[0]["value"][1])
                    assert ours is not None
                    assert abs(bucket(ours) - bucket(theirs)) <= 1, \
                        f"{node} q={q}: tailguard {ours:.3f} s vs Prometheus {theirs:.3f} s ({sum(counts)} requests)"
