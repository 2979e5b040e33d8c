"""A live simulated fleet: each scenario node is a real HTTP server on loopback.

Owns :class:`Fleet` (every node of a scenario in one process, one aiohttp server per node on
port ``base_port + index``) and :class:`SimNode`, which serves:

- ``POST /v1/completions`` with a JSON body ``{"model": …, "max_tokens": …}``: sleeps the
  latency the node's model draws at the current scenario time and answers an OpenAI-style
  completion (with ``slots``, at most that many at a time, the rest queued in arrival order
  with the wait in their latency); ``404`` for a model the node does not serve, ``400`` for a
  bad body, ``500`` for a request an ``errors`` fault fails;
- ``GET /healthz`` → ``{"node_id": …, "models": […], "scenario_time_s": …}``.

Guarantees: every request is reported through a :class:`Reporter` (the emitter SDK in
production) with its measured latency, ``probe=True`` for requests carrying
``X-Tailguard-Probe: 1``; each (node, model) heartbeats from the moment the node joins (a node
with ``join_s > 0`` listens only then). Scenario time is wall time × ``time_scale``; each
request's latency is real. The command line is :mod:`tailguard.sim.fleet_cli`.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from tailguard.sim.latency import LLM, NodeLatency, node_rng
from tailguard.sim.scenario import NodeSpec, Scenario, SimError

PROBE_HEADER = "X-Tailguard-Probe"
NODE_HEADER = "X-Tailguard-Node"


class MetricsPage(Protocol):
    """A node's ``/metrics`` (:class:`~tailguard.sim.metrics_fleet.MetricsReporter` has this shape)."""

    def bind(self, scenario_time: Callable[[], float]) -> None: ...

    def page(self, node_id: str, accept: str | None) -> tuple[int, bytes, str]: ...


class Reporter(Protocol):
    """Where a node reports its requests (the emitter SDK has this shape)."""

    def record(self, node_id: str, model: str, latency_us: float, *, ok: bool = True,
               ts: float | None = None, probe: bool = False, hardware: str | None = None,
               input_tokens: int | None = None, output_tokens: int | None = None,
               ttft_us: float | None = None) -> None: ...

    def heartbeat(self, node_id: str, model: str, hardware: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Served:
    """What one simulated request looked like."""

    latency_s: float
    ok: bool
    input_tokens: int | None
    output_tokens: int | None
    ttft_us: float | None


class SimNode:
    """One simulated inference node: draws latencies, serves HTTP, reports."""

    def __init__(self, scenario: Scenario, index: int, reporter: Reporter, *,
                 scenario_time: Callable[[], float], seed: int,
                 sleep: Callable[[float], Any] = asyncio.sleep,
                 monotonic: Callable[[], float] = time.monotonic,
                 metrics: MetricsPage | None = None, slots: int | None = None) -> None:
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be >= 1 (or None: no limit), got {slots!r}")
        self.scenario = scenario
        self._metrics = metrics
        self.spec: NodeSpec = scenario.nodes[index]
        self.node_id = self.spec.node_id
        self._reporter = reporter
        self._now_s = scenario_time
        self._sleep = sleep
        self._mono = monotonic
        self._rng = node_rng(seed, 1_000_000 + index)
        self._models: dict[str, NodeLatency] = {m: scenario.latency(self.node_id, m) for m in self.spec.models}
        self._llm = {m for m in self.spec.models if scenario.model(m).kind == "llm"}
        self._slots = asyncio.Semaphore(slots) if slots is not None else None
        self.requests = 0

    @property
    def models(self) -> tuple[str, ...]:
        return self.spec.models

    def draw(self, model: str, *, input_tokens: int | None = None,
             output_tokens: int | None = None) -> Served:
        """One request of ``model`` at the current scenario time (no sleeping)."""
        lat = self._models[model]
        sizes = None
        if isinstance(lat.base, LLM) and (input_tokens is not None or output_tokens is not None):
            inp, out = lat.base.sizes.draw(self._rng, 1)      # the trace fills in what is not given
            if input_tokens is not None:
                inp = np.array([input_tokens], dtype=np.int64)
            if output_tokens is not None:
                out = np.array([output_tokens], dtype=np.int64)
            sizes = (inp, out)
        d = lat.sample(self._rng, [self._now_s()], sizes)
        llm = model in self._llm and d.input_tokens is not None and d.output_tokens is not None
        return Served(
            latency_s=float(d.latency_us[0]) / 1e6, ok=bool(d.ok[0]),
            input_tokens=int(d.input_tokens[0]) if llm and d.input_tokens is not None else None,
            output_tokens=int(d.output_tokens[0]) if llm and d.output_tokens is not None else None,
            ttft_us=float(d.ttft_us[0]) if llm and d.ttft_us is not None else None)

    def announce(self) -> None:
        for m in self.spec.models:
            self._reporter.heartbeat(self.node_id, m, self.spec.hardware)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"node_id": self.node_id, "models": list(self.spec.models),
                                  "hardware": self.spec.hardware, "requests": self.requests,
                                  "scenario_time_s": round(self._now_s(), 3)})

    async def completions(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body must be a JSON object")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        model = body.get("model")
        if model not in self._models:
            return _error(404, f"model {model!r} is not served by {self.node_id}; "
                               f"served: {', '.join(self.spec.models)}")
        out_tok, err = _opt_int(body, "max_tokens")
        in_tok, err2 = _opt_int(body, "input_tokens")
        if err or err2:
            return _error(400, err or err2)
        if in_tok is None and isinstance(body.get("prompt"), str) and body["prompt"]:
            in_tok = max(1, len(body["prompt"]) // 4)
        probe = request.headers.get(PROBE_HEADER, "") == "1"
        t0 = self._mono()
        async with self._slots or contextlib.nullcontext():
            s = self.draw(str(model), input_tokens=in_tok, output_tokens=out_tok)
            await self._sleep(s.latency_s)
        elapsed_us = max(1.0, (self._mono() - t0) * 1e6)
        self.requests += 1
        self._report(str(model), elapsed_us, s, probe)
        headers = {NODE_HEADER: self.node_id}
        if not s.ok:
            return _error(500, "simulated failure", headers)
        usage = {"prompt_tokens": s.input_tokens or 0, "completion_tokens": s.output_tokens or 0,
                 "total_tokens": (s.input_tokens or 0) + (s.output_tokens or 0)}
        return web.json_response({
            "id": f"cmpl-{self.node_id}-{self.requests}", "object": "text_completion", "model": model,
            "node_id": self.node_id, "latency_ms": round(elapsed_us / 1e3, 3),
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage,
        }, headers=headers)

    def _report(self, model: str, elapsed_us: float, s: Served, probe: bool) -> None:
        sc = self.scenario
        tokens = sc.emit_tokens and s.output_tokens is not None
        ttft = min(s.ttft_us, elapsed_us) if sc.emit_ttft and tokens and s.ttft_us is not None else None
        self._reporter.record(
            self.node_id, model, elapsed_us, ok=s.ok, probe=probe,
            hardware=self.spec.hardware if sc.emit_hardware else None,
            input_tokens=s.input_tokens if tokens else None,
            output_tokens=s.output_tokens if tokens else None, ttft_us=ttft)

    async def metrics_page(self, request: web.Request) -> web.Response:
        assert self._metrics is not None
        status, body, content_type = self._metrics.page(self.node_id, request.headers.get("Accept"))
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    def app(self) -> web.Application:
        a = web.Application()
        a.router.add_post("/v1/completions", self.completions)
        a.router.add_get("/healthz", self.healthz)
        if self._metrics is not None:
            a.router.add_get("/metrics", self.metrics_page)
        return a


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status, headers=headers)


def _opt_int(body: dict[str, Any], key: str) -> tuple[int | None, str]:
    v = body.get(key)
    if v is None:
        return None, ""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
        return None, f"{key} must be an integer in [1, 1000000], got {v!r}"
    return v, ""


@dataclass(frozen=True, slots=True)
class Listening:
    node_id: str
    port: int
    url: str
    models: tuple[str, ...]
    hardware: str


class Fleet:
    """Runs the nodes of a scenario; an async context manager.

    ``time_scale`` compresses the scenario's timeline; ``monotonic`` is the
    clock scenario time is measured with (injectable for tests); ``slots`` caps each
    node's concurrent requests (``None``: no cap).
    """

    def __init__(self, scenario: Scenario, reporter: Reporter, *, base_port: int,
                 host: str = "127.0.0.1", time_scale: float = 1.0, seed: int | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 on_listen: Callable[[Listening], None] | None = None,
                 metrics: MetricsPage | None = None, slots: int | None = None) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        if not 0 <= base_port <= 65535 - len(scenario.nodes) + 1:
            raise ValueError(f"base_port must leave room for {len(scenario.nodes)} ports, got {base_port!r}")
        self.scenario = scenario
        self.host, self.base_port, self.time_scale = host, base_port, time_scale
        self._mono = monotonic
        self._t0 = monotonic()
        self._on_listen = on_listen
        seed = scenario.seed if seed is None else seed
        self.seed = seed
        self.nodes = [SimNode(scenario, i, reporter, scenario_time=self.scenario_time, seed=seed,
                              monotonic=monotonic, metrics=metrics, slots=slots)
                      for i in range(len(scenario.nodes))]
        if metrics is not None:
            metrics.bind(self.scenario_time)
        self.listening: dict[str, Listening] = {}
        self._runners: list[web.AppRunner] = []
        self._joins: list[asyncio.Task[None]] = []

    def scenario_time(self) -> float:
        return (self._mono() - self._t0) * self.time_scale

    def port_of(self, index: int) -> int:
        return 0 if self.base_port == 0 else self.base_port + index

    async def _start_node(self, index: int) -> None:
        node = self.nodes[index]
        runner = web.AppRunner(node.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port_of(index))
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise SimError(f"{node.node_id}: cannot listen on {self.host}:{self.port_of(index)} ({e.strerror}); "
                           "choose another --base-port") from None
        self._runners.append(runner)
        port = _bound_port(runner)
        info = Listening(node.node_id, port, f"http://{self.host}:{port}", node.models, node.spec.hardware)
        self.listening[node.node_id] = info
        node.announce()
        if self._on_listen is not None:
            self._on_listen(info)

    async def _join_later(self, index: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self._start_node(index)

    async def start(self) -> None:
        self._t0 = self._mono()
        for i, n in enumerate(self.scenario.nodes):
            if n.join_s <= 0:
                await self._start_node(i)
            else:
                self._joins.append(asyncio.create_task(self._join_later(i, n.join_s / self.time_scale)))

    async def stop(self) -> None:
        for t in self._joins:
            t.cancel()
        for t in self._joins:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for r in self._runners:
            await r.cleanup()
        self._runners.clear()

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise SimError("server started but reports no address")
