"""``tailguard probe`` — synthetic probes for quarantined nodes that a load balancer sends nothing.

Behind HAProxy (``haproxy-sync`` puts a quarantined node in ``maint``) or any load balancer
without probe traffic, a quarantined node gets no requests and can never show that it
recovered. Every ``1 / rate_per_node`` seconds this command reads each model's quarantine
through a :class:`~tailguard.lb.RoutingSource` and sends every node whose probe time has come
one request (``--method``, ``--path``, ``--body`` with ``{model}`` replaced), marked
``X-Tailguard-Probe: 1``, which the node's emitter records as ``probe: true``.

Guarantees:

* Only quarantined nodes whose probe time has passed, and that have an address in
  ``--backends``, are probed; a routed node never gets a request from here.
* Nodes are probed concurrently, one request in flight per node and round, each with a
  timeout (``timeout_s``): one hung node delays no other.
* With ``--report-failures`` a probe the node never answered (refused, reset, timed out) is
  reported as an ``ok: false``, ``probe: true`` event for it, as ``tailguard proxy`` does.
* Routing state unreadable (Redis down, nothing cached): no probes this round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from tailguard.lb import RoutingSource
from tailguard.lb.proxy import PROBE_HEADER, FailureSink, open_lb_inputs, parse_backends
from tailguard.lb.source import add_routing_args, run_main, stop_on_signals

log = logging.getLogger(__name__)

DEFAULT_BODY = '{"model": "{model}", "prompt": "tailguard probe", "max_tokens": 1}'
# How often the command logs what it probed (long runs show progress).
REPORT_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """What one probe sends; ``{model}`` in ``body`` is replaced by the model."""

    method: str = "POST"
    path: str = "/v1/completions"
    body: str = DEFAULT_BODY
    model_header: str | None = None

    def body_for(self, model: str) -> bytes:
        return self.body.replace("{model}", model).encode()


@dataclass(frozen=True, slots=True)
class ProbeResult:
    node_id: str
    model: str
    status: int | None          # None: no answer (refused, reset, timed out)
    latency_s: float


class Prober:
    """One probing round at a time over ``models`` (see the module docstring)."""

    def __init__(self, source: RoutingSource, backends: Mapping[str, str], models: Sequence[str],
                 request: ProbeRequest = ProbeRequest(), *, timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.time,
                 report_failure: FailureSink | None = None) -> None:
        if not models:
            raise ValueError("give at least one model to probe (--model)")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._source, self._backends, self._models = source, dict(backends), list(models)
        self._request, self._clock, self._report_failure = request, clock, report_failure
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.sent: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    async def due(self) -> list[tuple[str, str]]:
        """(model, node) pairs to probe now: quarantined, probe time passed, address known."""
        now = self._clock()
        out = []
        for model in self._models:
            try:
                quarantine = await self._source.quarantined(model)
            except Exception as e:        # nothing cached and Redis down: next round
                log.warning("cannot read the quarantine of %s (%s); no probes this round", model, e)
                continue
            out += [(model, node) for node, after in sorted(quarantine.items())
                    if after <= now and node in self._backends]
        return out

    async def round(self, session: aiohttp.ClientSession) -> list[ProbeResult]:
        """Probe every due node once, concurrently."""
        due = await self.due()
        return list(await asyncio.gather(*(self._probe(session, m, n) for m, n in due)))

    async def _probe(self, session: aiohttp.ClientSession, model: str, node: str) -> ProbeResult:
        req = self._request
        headers = {PROBE_HEADER: "1", "Content-Type": "application/json"}
        if req.model_header:
            headers[req.model_header] = model
        url = self._backends[node].rstrip("/") + req.path
        self.sent[node] += 1
        t0 = time.monotonic()
        try:
            async with session.request(req.method, url, data=req.body_for(model), headers=headers,
                                       timeout=self._timeout) as resp:
                await resp.read()
                return ProbeResult(node, model, resp.status, time.monotonic() - t0)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            took = time.monotonic() - t0
            self.failed[node] += 1
            log.info("probe of %s (%s) got no answer: %s: %s", node, model, type(e).__name__, e)
            if self._report_failure is not None:
                self._report_failure(node, model, max(took * 1e6, 1.0), True)
            return ProbeResult(node, model, None, took)


async def run_prober(prober: Prober, rate_per_node: float, stop: asyncio.Event) -> None:
    """Rounds every ``1 / rate_per_node`` s until ``stop``; logs progress every 30 s."""
    if not 0 < rate_per_node <= 100:
        raise ValueError(f"--rate-per-node must be in (0, 100], got {rate_per_node!r}")
    period_s = 1.0 / rate_per_node
    last_report = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            t0 = time.monotonic()
            await prober.round(session)
            if time.monotonic() - last_report >= REPORT_INTERVAL_S:
                last_report = time.monotonic()
                log.info("probes sent so far %s; unanswered %s",
                         dict(prober.sent) or "none", dict(prober.failed) or "none")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, period_s - (time.monotonic() - t0)))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard probe",
        description="Send synthetic probe requests (X-Tailguard-Probe: 1) to quarantined nodes "
                    "whose probe time has come, for load balancers that send them nothing.")
    p.add_argument("--backends", required=True,
                   help="node_id=http://host:port,… or a file of such lines")
    p.add_argument("--model", action="append", required=True, dest="models",
                   help="a model whose quarantined nodes to probe (repeat for several)")
    p.add_argument("--method", default="POST", help="HTTP method of a probe (default POST)")
    p.add_argument("--path", default="/v1/completions", help="path of a probe (default /v1/completions)")
    p.add_argument("--body", default=DEFAULT_BODY,
                   help="body of a probe; {model} is replaced by the model (default: a 1-token completion)")
    p.add_argument("--model-header", default=None, help="also send the model in this header")
    p.add_argument("--rate-per-node", type=float, default=1.0,
                   help="probes per second to each due node (default 1)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="timeout of one probe (default 30)")
    p.add_argument("--report-failures", action="store_true",
                   help="report probes a node never answered as ok:false events to "
                        "TAILGUARD_KAFKA_BOOTSTRAP's latency-events topic")
    add_routing_args(p)
    return p


async def _run(args: argparse.Namespace) -> int:
    backends = parse_backends(args.backends)
    stop = stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        _, source, report = await open_lb_inputs(stack, args)
        request = ProbeRequest(args.method.upper(), args.path, args.body, args.model_header)
        prober = Prober(source, backends, args.models, request, timeout_s=args.timeout_s,
                        report_failure=report)
        print(f"tailguard probe: {len(backends)} backends, models {', '.join(args.models)}, "
              f"{args.rate_per_node:g}/s to each quarantined node whose probe time has come",
              file=sys.stderr, flush=True)
        await run_prober(prober, args.rate_per_node, stop)
    return 0


def main(argv: list[str]) -> int:
    return run_main("tailguard probe", build_parser(), _run, argv)
