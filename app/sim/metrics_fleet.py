"""A simulated fleet seen through ``/metrics``: each node as a vLLM, SGLang, TGI, Triton or Dynamo server.

Owns :class:`MetricsReporter` (the fleet's :class:`~tailguard.sim.fleet.Reporter`
when it serves ``/metrics``: every request a node serves lands in that node's
:class:`~tailguard.sim.exposition.NodeExposition`), :class:`SelfTraffic` (each node
serves its own requests at the scenario's rates, with no HTTP client needed)
and :func:`file_sd` (the Prometheus ``file_sd`` target list of the fleet).

Guarantees:

- one ``prometheus_client`` registry per node and per process life: when a
  scenario ``restart`` fault ends, the node's counters start again from zero
  (a new process), as a real restart does;
- a node that is not serving (before ``join_s``, after ``leave_s``, during a
  ``silence`` or ``restart`` fault) answers ``/metrics`` with 503 and serves no
  requests, so a scraper gets nothing from it;
- :class:`SelfTraffic` draws, per node and model, ``rate_per_s`` × the traffic
  factor requests per wall-clock second, with latencies from the scenario's
  latency model at the current scenario time (faults and warm-ups included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tailguard.sim.exposition import SERVERS, NodeExposition
from tailguard.sim.latency import Draws, node_rng
from tailguard.sim.scenario import Scenario, SimError

#: The target label that names a target's server profile (``tailguard scrape`` reads it).
PROFILE_LABEL = "tailguard_profile"


class MetricsReporter:
    """Records each node's requests into its server's cumulative metrics; serves them."""

    def __init__(self, scenario: Scenario, server: str) -> None:
        if server not in SERVERS:
            raise SimError(f"--metrics must be one of {', '.join(SERVERS)}, got {server!r}")
        if server == "tgi":
            many = [n.node_id for n in scenario.nodes if len(n.models) > 1]
            if many:
                raise SimError(f"a TGI server serves one model; {', '.join(many)} serve several "
                               "(choose another --metrics server or one model per node)")
        self.scenario, self.server = scenario, server
        self._now_s: Callable[[], float] = lambda: 0.0
        self._expo: dict[str, NodeExposition] = {}
        self._life: dict[str, str] = {}

    def bind(self, scenario_time: Callable[[], float]) -> None:
        """The fleet's scenario clock (set by :class:`~tailguard.sim.fleet.Fleet`)."""
        self._now_s = scenario_time

    def serving(self, node_id: str, t_s: float | None = None) -> bool:
        """Whether the node's server process is up at scenario time ``t_s`` (default now)."""
        t = self._now_s() if t_s is None else t_s
        node = self.scenario.node(node_id)
        if t < node.join_s:
            return False
        at = np.array([t])
        return any(bool(self.scenario.reporting(node_id, m, at)[0]) for m in node.models)

    def exposition(self, node_id: str) -> NodeExposition:
        """The node's current process's metrics (a fresh one after each restart)."""
        node = self.scenario.node(node_id)
        life = self.scenario.instance_of(node_id, node.models[0], self._now_s())
        if self._life.get(node_id) != life:
            self._life[node_id] = life
            self._expo[node_id] = NodeExposition(self.server)
        return self._expo[node_id]

    # -- Reporter (requests served over HTTP) --------------------------------------------------

    def record(self, node_id: str, model: str, latency_us: float, *, ok: bool = True,
               ts: float | None = None, probe: bool = False, hardware: str | None = None,
               input_tokens: int | None = None, output_tokens: int | None = None,
               ttft_us: float | None = None) -> None:
        tokens = np.array([output_tokens], dtype=np.int64) if output_tokens is not None else None
        ttft = np.array([ttft_us / 1e6]) if ttft_us is not None else None
        self.exposition(node_id).observe(model, np.array([latency_us / 1e6]), np.array([ok]), ttft, tokens)

    def heartbeat(self, node_id: str, model: str, hardware: str | None = None) -> None:
        """Servers send no heartbeats: being scraped is their sign of life."""

    # -- requests a node serves by itself ------------------------------------------------------

    def observe(self, node_id: str, model: str, d: Draws) -> None:
        ttft = d.ttft_us / 1e6 if d.ttft_us is not None else None
        self.exposition(node_id).observe(model, d.latency_us / 1e6, d.ok, ttft, d.output_tokens)

    # -- /metrics ------------------------------------------------------------------------------

    def page(self, node_id: str, accept: str | None) -> tuple[int, bytes, str]:
        """``(status, body, content type)`` of the node's ``/metrics``."""
        if not self.serving(node_id):
            return 503, b"server not running\n", "text/plain; charset=utf-8"
        body, content_type = self.exposition(node_id).render(accept)
        return 200, body, content_type


class SelfTraffic:
    """Each node serves its own requests at the scenario's rates (an async context manager)."""

    def __init__(self, reporter: MetricsReporter, listening: Callable[[str], bool], *, seed: int,
                 scenario_time: Callable[[], float], tick_s: float = 0.2,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s!r}")
        self._rep, self._listening = reporter, listening
        self._now_s, self._mono, self.tick_s = scenario_time, monotonic, tick_s
        sc = reporter.scenario
        self._streams = [(n.node_id, m.name, sc.rate_of(n, m), sc.latency(n.node_id, m.name),
                          node_rng(seed, 2_000_000 + i, j)) for i, j, n, m in sc.streams()]
        self._task: asyncio.Task[None] | None = None
        self.requests = 0

    def step(self, t0_s: float, t1_s: float, wall_s: float) -> None:
        """Serve the requests that arrive in scenario time ``[t0_s, t1_s)`` (``wall_s`` wall seconds)."""
        sc = self._rep.scenario
        for node_id, model, rate, latency, rng in self._streams:
            if not self._listening(node_id) or not self._rep.serving(node_id, t1_s):
                continue
            n = int(rng.poisson(rate * wall_s))
            if n == 0:
                continue
            t = np.sort(t0_s + (t1_s - t0_s) * rng.random(n))
            keep = rng.random(n) < np.minimum(1.0, sc.rate_factor(node_id, model, t))
            t = t[keep]
            if t.shape[0]:
                self._rep.observe(node_id, model, latency.sample(rng, t))
                self.requests += int(t.shape[0])

    async def _run(self) -> None:
        last_wall, last_t = self._mono(), self._now_s()
        while True:
            await asyncio.sleep(self.tick_s)
            wall, t = self._mono(), self._now_s()
            self.step(last_t, t, wall - last_wall)
            last_wall, last_t = wall, t

    async def __aenter__(self) -> SelfTraffic:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def file_sd(targets: dict[str, tuple[str, str]], server: str, path: str | None = None) -> list[dict[str, Any]]:
    """The fleet as a Prometheus ``file_sd`` list (``targets``: node id → (host:port, hardware)).

    Each node is one target group whose ``instance`` label is its node id. With
    ``path``, the file is replaced whole (written beside it, then renamed).
    """
    groups = [{"targets": [addr], "labels": {"instance": node_id, "hardware": hw, PROFILE_LABEL: server}}
              for node_id, (addr, hw) in sorted(targets.items())]
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(groups, fh, indent=1)
        os.replace(tmp, path)
    return groups
