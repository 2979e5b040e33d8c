"""A load generator: open-loop Poisson traffic through a load balancer, client-side latency.

``tailguard simulate load --target http://127.0.0.1:8080 --rate 200 --duration 120 --model M``
sends ``POST {target}/v1/completions`` at ``rate`` requests/s (Poisson
arrivals, independent of how fast answers come back, as real clients do)
and measures each request from send to full response. Every
``interval_s`` it writes one JSON line (to ``--out``, else stdout)::

    {"t_s": 10.0, "ts": 1764680010.0, "sent": 2003, "completed": 1998, "errors": 0,
     "p50_ms": 181.2, "p99_ms": 402.7, "by_node": {"gpu-node-01": 250, …}}

and a final summary line ``{"summary": true, …}`` (overall and per node)
on stdout. ``by_node`` comes from the ``X-Tailguard-Node`` response header
(set by the reference proxy and by simulated nodes). With ``--trace conv``
or ``code`` the request sizes (``input_tokens``, ``max_tokens``) are drawn
from the shipped Azure traces. Pure accounting lives in :class:`Recorder`
(clock-free, unit-tested); the network in :func:`run`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import aiohttp
import numpy as np

from tailguard.sim.latency import RequestSizes, node_rng
from tailguard.sim.scenario import SimError

NODE_HEADER = "X-Tailguard-Node"


def _quantiles_ms(lat_s: list[float]) -> tuple[float | None, float | None]:
    if not lat_s:
        return None, None
    p50, p99 = np.percentile(np.asarray(lat_s) * 1e3, [50, 99])
    return round(float(p50), 3), round(float(p99), 3)


@dataclass(slots=True)
class Recorder:
    """Counts requests per interval and overall. Times are seconds since the run's start."""

    interval_s: float
    sent: int = 0
    errors: int = 0
    _lat: list[float] = field(default_factory=list)
    _by_node: dict[str, list[float]] = field(default_factory=dict)
    _iv_sent: int = 0
    _iv_errors: int = 0
    _iv_lat: list[float] = field(default_factory=list)
    _iv_nodes: dict[str, int] = field(default_factory=dict)

    def on_sent(self) -> None:
        self.sent += 1
        self._iv_sent += 1

    def on_done(self, latency_s: float, ok: bool, node: str | None) -> None:
        if not ok:
            self.errors += 1
            self._iv_errors += 1
            return
        self._lat.append(latency_s)
        self._iv_lat.append(latency_s)
        if node:
            self._by_node.setdefault(node, []).append(latency_s)
            self._iv_nodes[node] = self._iv_nodes.get(node, 0) + 1

    def interval(self, t_s: float, wall_ts: float) -> dict[str, Any]:
        """The line for the interval ending at ``t_s``; starts the next one."""
        p50, p99 = _quantiles_ms(self._iv_lat)
        line = {"t_s": round(t_s, 3), "ts": round(wall_ts, 3), "sent": self._iv_sent,
                "completed": len(self._iv_lat), "errors": self._iv_errors, "p50_ms": p50, "p99_ms": p99,
                "by_node": dict(sorted(self._iv_nodes.items()))}
        self._iv_sent, self._iv_errors, self._iv_lat, self._iv_nodes = 0, 0, [], {}
        return line

    def summary(self, duration_s: float) -> dict[str, Any]:
        p50, p99 = _quantiles_ms(self._lat)
        nodes = {}
        for n, lat in sorted(self._by_node.items()):
            q50, q99 = _quantiles_ms(lat)
            nodes[n] = {"completed": len(lat), "p50_ms": q50, "p99_ms": q99}
        return {"summary": True, "duration_s": round(duration_s, 3), "sent": self.sent,
                "completed": len(self._lat), "errors": self.errors, "p50_ms": p50, "p99_ms": p99,
                "by_node": nodes}


@dataclass(frozen=True, slots=True)
class LoadSpec:
    target: str
    rate_per_s: float
    duration_s: float
    model: str
    interval_s: float = 5.0
    path: str = "/v1/completions"
    max_tokens: int = 16
    timeout_s: float = 60.0
    max_in_flight: int = 4096
    seed: int = 1

    def __post_init__(self) -> None:
        if not self.target.startswith(("http://", "https://")):
            raise ValueError(f"--target must be an http(s):// URL, got {self.target!r}")
        for name in ("rate_per_s", "duration_s", "interval_s", "timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and v > 0 and np.isfinite(v)):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


async def run(spec: LoadSpec, *, sizes: RequestSizes | None = None,
              emit: Callable[[dict[str, Any]], None] = lambda line: None,
              clock: Callable[[], float] = time.time,
              monotonic: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Drive ``spec``'s traffic; ``emit`` gets each interval line; returns the summary."""
    rng = node_rng(spec.seed, 7)
    rec = Recorder(spec.interval_s)
    url = spec.target.rstrip("/") + spec.path
    in_flight: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    connector = aiohttp.TCPConnector(limit=spec.max_in_flight)

    async def one(session: aiohttp.ClientSession, body: dict[str, Any]) -> None:
        t0 = monotonic()
        try:
            async with session.post(url, json=body) as resp:
                await resp.read()
                rec.on_done(monotonic() - t0, resp.status < 400, resp.headers.get(NODE_HEADER))
        except (aiohttp.ClientError, TimeoutError):
            rec.on_done(monotonic() - t0, False, None)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = monotonic()
        next_send = 0.0
        next_report = spec.interval_s
        while True:
            now = monotonic() - start
            if now >= spec.duration_s:
                break
            if now >= next_report:
                emit(rec.interval(next_report, clock()))
                next_report += spec.interval_s
            if now < next_send:
                await asyncio.sleep(min(next_send, next_report, spec.duration_s) - now)
                continue
            body: dict[str, Any] = {"model": spec.model, "max_tokens": spec.max_tokens}
            if sizes is not None:
                inp, out = sizes.draw(rng, 1)
                body["input_tokens"], body["max_tokens"] = int(inp[0]), int(out[0])
            if len(in_flight) < spec.max_in_flight:
                rec.on_sent()
                task = asyncio.create_task(one(session, body))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            else:
                rec.on_done(0.0, False, None)
            next_send += float(rng.exponential(1.0 / spec.rate_per_s))
        if in_flight:
            await asyncio.wait(in_flight, timeout=spec.timeout_s)
        emit(rec.interval(monotonic() - start, clock()))
        return rec.summary(monotonic() - start)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("load", help="drive traffic through a load balancer; client-side P50/P99 per interval")
    p.add_argument("--target", required=True, help="base URL of the load balancer, e.g. http://127.0.0.1:8080")
    p.add_argument("--rate", type=float, required=True, help="requests per second (Poisson arrivals)")
    p.add_argument("--duration", type=float, required=True, help="seconds to run")
    p.add_argument("--model", required=True, help="model name sent in the request body")
    p.add_argument("--interval-s", type=float, default=5.0, help="report every this many seconds (default 5)")
    p.add_argument("--out", default=None, help="write interval JSON lines here (default: stdout)")
    p.add_argument("--trace", choices=("conv", "code"), default=None,
                   help="draw request sizes from the shipped Azure trace")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens when --trace is not given")
    p.add_argument("--path", default="/v1/completions", help="request path (default /v1/completions)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per-request timeout (default 60)")
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(run=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    try:
        spec = LoadSpec(args.target, args.rate, args.duration, args.model, interval_s=args.interval_s,
                        path=args.path, max_tokens=args.max_tokens, timeout_s=args.timeout_s, seed=args.seed)
    except ValueError as e:
        raise SimError(str(e)) from None
    sizes = None
    if args.trace:
        from tailguard.sim.scenario import request_sizes

        sizes = request_sizes(args.trace)
    out: TextIO = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        def emit(line: dict[str, Any]) -> None:
            out.write(json.dumps(line) + "\n")
            out.flush()

        summary = asyncio.run(run(spec, sizes=sizes, emit=emit))
    finally:
        if out is not sys.stdout:
            out.close()
    print(json.dumps(summary), flush=True)
    return 0
