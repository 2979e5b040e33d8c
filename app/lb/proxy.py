"""``tailguard proxy`` — a reference HTTP load balancer that reads the routing set before each dispatch.

Owns :class:`Proxy` (and its command line, :func:`main`): for every request it finds the
model (:func:`model_of`: the ``--model-header`` header, else a JSON body's ``"model"``),
reads the model's routing through a :class:`~tailguard.lb.RoutingSource` (cached: no Redis
round-trip per request), picks a node with :class:`~tailguard.lb.balance.Balancer` — smooth weighted
round-robin by tailguard's routing weights (plain round-robin while all are 1.0) over the
``--backends`` tailguard has not taken out, or on a probe slot (``--probe-share``) a
quarantined node due for probing, marked ``X-Tailguard-Probe: 1`` — and forwards the request,
streaming the response back. Each behaviour in full: docs/lb.md ("Reference proxy").

Guarantees:

* **Never 503 because tailguard is down**: an unknown routing set, or one with no known
  address, means round-robin over every backend (counted as ``fallback``).
* **One retry** on another node when a backend cannot be reached or drops the connection
  before answering, then ``502``; nothing is retried once the response has started. A
  failed probe is retried on a routed node, so probing never fails a client.
* Only the proxy marks probe traffic (a client's ``X-Tailguard-Probe`` is removed). With
  ``--report-failures``, every attempt that got no answer is reported as an ``ok: false`` event.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tailguard.lb import BackendsError, RoutingSource
from tailguard.lb.balance import MAX_PROBE_SHARE, Balancer, Pick
from tailguard.lb.maps import load_pairs
from tailguard.lb.source import add_routing_args, open_routing, run_main, settings_from_args, stop_on_signals
from tailguard.settings import Settings, redact_url

log = logging.getLogger(__name__)

PROBE_HEADER = "X-Tailguard-Probe"
NODE_HEADER = "X-Tailguard-Node"
STATS_PATH = "/_tailguard/stats"
HEALTH_PATH = "/_tailguard/health"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length", PROBE_HEADER.lower(),
})
_RESPONSE_SKIP = _HOP_BY_HOP - {"content-length"} | {NODE_HEADER.lower()}


def model_of(headers: Mapping[str, str], body: bytes, model_header: str | None) -> str | None:
    """The request's model: the configured header, else the JSON body's ``"model"`` field, else ``None``."""
    if model_header:
        value = headers.get(model_header, "").strip()
        if value:
            return value
    if not body or body.lstrip()[:1] != b"{":
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = obj.get("model") if isinstance(obj, dict) else None
    return model.strip() or None if isinstance(model, str) else None


def parse_backends(arg: str) -> dict[str, str]:
    """``--backends``: node_id → base URL (``http[s]://host:port[/path]``, trailing ``/`` dropped)."""
    out: dict[str, str] = {}
    for node, url in load_pairs(arg, flag="--backends").items():
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
            raise BackendsError(f"--backends: {node}={url!r} is not an http(s)://host:port base URL")
        out[node] = url.rstrip("/")
    return out


def parse_listen(arg: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` (``[v6]:port`` too; port 0 = any free port)."""
    host, sep, port = arg.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BackendsError(f"--listen: {arg!r} is not HOST:PORT")
    return host, int(port)


@dataclass(slots=True)
class NodeStats:
    """Counters of one node. ``requests`` counts responses it served (probes included)."""

    requests: int = 0
    probes: int = 0
    fallback: int = 0
    failures: int = 0
    by_model: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class ProxyStats:
    """The proxy's counters, as served on ``GET /_tailguard/stats``."""

    requests: int = 0
    no_model: int = 0
    fallback: int = 0
    probes: int = 0
    retries: int = 0
    bad_gateway: int = 0
    nodes: dict[str, NodeStats] = field(default_factory=dict)

    def node(self, node_id: str) -> NodeStats:
        stats = self.nodes.get(node_id)
        if stats is None:
            stats = self.nodes[node_id] = NodeStats()
        return stats

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able counters: the totals, and per node ``requests``, ``probes``,
        ``fallback``, ``failures`` and ``by_model`` (model → requests; ``""`` = no model)."""
        # Not dataclasses.asdict: it rebuilds a Counter from (key, value) pairs.
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "nodes"}
        d["nodes"] = {
            n: {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "by_model"}
            | {"by_model": dict(s.by_model)}
            for n, s in sorted(self.nodes.items())
        }
        return d


# report_failure(node_id, model, latency_us, probe): an attempt the node never answered.
FailureSink = Callable[[str, str, float, bool], None]


# The emitter's heartbeat period for --report-failures: in effect never (one at the first report).
FAILURE_HEARTBEAT_S = 365 * 86_400.0


async def failure_reporter(stack: contextlib.AsyncExitStack, settings: Settings) -> FailureSink:
    """A :data:`FailureSink` that records ``ok: false`` events on ``settings``' latency-events
    topic through a :class:`~tailguard.emitter.LatencyEmitter` whose lifetime is ``stack``'s. It sends
    no heartbeats on a node's behalf: a dead node must not look alive."""
    from tailguard.emitter import LatencyEmitter
    from tailguard.security import check_kafka, kafka_client_options

    await check_kafka(settings)   # a refused login or certificate stops the start, in one line
    emitter = await stack.enter_async_context(LatencyEmitter(
        settings.kafka_bootstrap, topic=settings.topics.latency_events,
        heartbeat_interval_s=FAILURE_HEARTBEAT_S,
        producer_options=kafka_client_options(settings)))

    def report(node_id: str, model: str, latency_us: float, probe: bool) -> None:
        emitter.record(node_id, model, latency_us, ok=False, probe=probe)
    return report


async def open_lb_inputs(stack: contextlib.AsyncExitStack, args: argparse.Namespace,
                         ) -> tuple[Settings, RoutingSource, FailureSink | None]:
    """What ``tailguard proxy`` and ``tailguard probe`` read and write, living as long as
    ``stack``: the settings (environment + :func:`add_routing_args` flags), the routing source,
    and with ``--report-failures`` a :func:`failure_reporter`."""
    settings = settings_from_args(args)
    source = await stack.enter_async_context(
        open_routing(settings, poll_interval_s=args.poll_interval_s))
    report = await failure_reporter(stack, settings) if args.report_failures else None
    return settings, source, report


class _BackendFailed(Exception):
    def __init__(self, pick: Pick, why: str, unanswered_s: float | None = None) -> None:
        self.unanswered_s = unanswered_s      # set when the node never answered: how long we waited
        self.pick, self.why = pick, why
        super().__init__(f"{pick.node_id} ({pick.url}): {why}")


class Proxy:
    """The request handler and its counters; :meth:`make_app` builds the aiohttp application."""

    def __init__(
        self,
        source: RoutingSource,
        balancer: Balancer,
        *,
        model_header: str | None = None,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 300.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        clock: Callable[[], float] = time.time,
        report_failure: FailureSink | None = None,
    ) -> None:
        if not connect_timeout_s > 0 or not read_timeout_s > 0:
            raise ValueError("connect_timeout_s and read_timeout_s must be > 0")
        self._source = source
        self._balancer = balancer
        self._model_header = model_header
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self._report_failure = report_failure
        self._session: aiohttp.ClientSession | None = None
        self.stats = ProxyStats()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body_bytes)
        app.cleanup_ctx.append(self._session_ctx)
        app.router.add_get(STATS_PATH, self._stats)
        app.router.add_get(HEALTH_PATH, self._health)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def _session_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        self._session = aiohttp.ClientSession(
            timeout=self._timeout,
            auto_decompress=False,                 # pass bodies through byte for byte
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        try:
            yield
        finally:
            await self._session.close()
            self._session = None

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats.to_dict())

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _choose(self, model: str | None, routed: frozenset[str] | None,
                      held: frozenset[str], weights: Mapping[str, float]) -> Pick | None:
        if model is not None and self._balancer.probe_due(model):
            quarantined = await self._source.quarantined(model)
            if quarantined:
                probe = self._balancer.pick_probe(model, routed, quarantined, self._clock())
                if probe is not None:
                    return probe
        return self._balancer.pick(model, routed, held_out=held, weights=weights)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        model = model_of(request.headers, body, self._model_header)
        st = self.stats
        st.requests += 1
        held: frozenset[str] = frozenset()
        weights: Mapping[str, float] = {}
        if model is None:
            st.no_model += 1
            routed = None
        else:
            routed = await self._source.get(model)
            held = await self._source.held_out(model)
            weights = await self._source.weights(model)
        pick = await self._choose(model, routed, held, weights)
        tried: list[str] = []
        attempts = 0    # failed non-probe attempts: a failed probe does not use up the client's retry
        while pick is not None:
            tried.append(pick.node_id)
            try:
                return await self._forward(request, body, model, pick)
            except _BackendFailed as e:
                st.node(pick.node_id).failures += 1
                log.warning("backend failed: %s", e)
                if self._report_failure is not None and model is not None and e.unanswered_s is not None:
                    self._report_failure(pick.node_id, model, max(e.unanswered_s * 1e6, 1.0), pick.probe)
                attempts += not pick.probe
                if attempts >= 2:
                    break
                st.retries += 1
                pick = self._balancer.pick(model, routed, exclude=frozenset(tried), held_out=held)
        st.bad_gateway += 1
        return web.json_response(
            {"error": "bad_gateway", "detail": "no backend answered", "model": model, "tried": tried}, status=502
        )

    def _upstream_headers(self, request: web.Request, pick: Pick) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP
        )
        peer = request.remote
        if peer:
            prior = request.headers.get("X-Forwarded-For")
            headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
        if pick.probe:
            headers[PROBE_HEADER] = "1"
        return headers

    async def _forward(self, request: web.Request, body: bytes, model: str | None, pick: Pick) -> web.StreamResponse:
        session = self._session
        if session is None:
            raise RuntimeError("Proxy.handle called outside the application built by make_app()")
        url = pick.url + str(request.rel_url)
        t0 = time.monotonic()
        try:
            upstream = await session.request(
                request.method, url, headers=self._upstream_headers(request, pick), data=body or None,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise _BackendFailed(pick, f"{type(e).__name__}: {e}", time.monotonic() - t0) from e
        complete = False
        try:
            if pick.probe and upstream.status >= 500:
                raise _BackendFailed(pick, f"probe answered HTTP {upstream.status}")
            resp, complete = await self._relay(request, upstream, model, pick)
            return resp
        finally:
            # A fully read response gives its connection back to the pool; anything else closes it.
            if complete:
                upstream.release()
            else:
                upstream.close()

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, model: str | None, pick: Pick
    ) -> tuple[web.StreamResponse, bool]:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                  headers=_response_headers(upstream.headers, pick))
        node = self.stats.node(pick.node_id)
        node.requests += 1
        node.by_model[model or ""] += 1
        if pick.probe:
            node.probes += 1
            self.stats.probes += 1
        if pick.fallback:
            node.fallback += 1
            self.stats.fallback += 1
        await resp.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as e:
            # Headers are out: no retry possible. Close the client connection so it sees a cut body.
            node.failures += 1
            log.warning("backend %s failed mid-response: %s: %s", pick.node_id, type(e).__name__, e)
            if request.transport is not None:
                request.transport.close()
            return resp, False
        await resp.write_eof()
        return resp, True


def _response_headers(upstream: CIMultiDictProxy[str], pick: Pick) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in _RESPONSE_SKIP)
    headers[NODE_HEADER] = pick.node_id
    if pick.probe:
        headers[PROBE_HEADER] = "1"
    return headers


@contextlib.asynccontextmanager
async def serve(proxy: Proxy, host: str, port: int) -> AsyncIterator[int]:
    """Run ``proxy`` on ``host:port``; yields the bound port (useful with port 0)."""
    runner = web.AppRunner(proxy.make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        yield int(bound)
    finally:
        await runner.cleanup()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard proxy",
        description="Reference HTTP load balancer: smooth weighted round-robin over each model's "
                    "tailguard routing set (by its routing weights).",
    )
    p.add_argument("--listen", default=None,
                   help="HOST:PORT to listen on (default TAILGUARD_PROXY_LISTEN, 127.0.0.1:8080)")
    p.add_argument("--backends", required=True,
                   help="node_id=http://host:port,… or a file of such lines (every node the proxy may reach)")
    p.add_argument("--model-header", default=None,
                   help="read the model from this request header (else from the JSON body's \"model\" field)")
    p.add_argument("--probe-share", type=float, default=0.02,
                   help=f"share of each model's requests sent to quarantined nodes as probes, "
                        f"0..{MAX_PROBE_SHARE} (default 0.02)")
    p.add_argument("--connect-timeout-s", type=float, default=2.0, help="backend connect timeout (default 2)")
    p.add_argument("--read-timeout-s", type=float, default=300.0,
                   help="longest silence from a backend while reading its response (default 300)")
    p.add_argument("--report-failures", action="store_true",
                   help="report attempts a node never answered (refused, reset, timed out) as "
                        "ok:false events to TAILGUARD_KAFKA_BOOTSTRAP's latency-events topic, so a "
                        "dead node leaves routing by its error rate")
    add_routing_args(p)
    return p


def listen_address(args: argparse.Namespace) -> tuple[str, int]:
    """``--listen``, else ``TAILGUARD_PROXY_LISTEN`` (loopback by default)."""
    return parse_listen(args.listen or settings_from_args(args).proxy_listen)


async def _run(args: argparse.Namespace) -> int:
    host, port = listen_address(args)
    backends = parse_backends(args.backends)
    balancer = Balancer(backends, probe_share=args.probe_share)
    stop = stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        settings, source, report = await open_lb_inputs(stack, args)
        proxy = Proxy(source, balancer, model_header=args.model_header,
                      connect_timeout_s=args.connect_timeout_s, read_timeout_s=args.read_timeout_s,
                      report_failure=report)
        try:
            bound = await stack.enter_async_context(serve(proxy, host, port))
        except OSError as e:
            flag = "--listen" if args.listen else "TAILGUARD_PROXY_LISTEN"
            print(f"tailguard proxy: cannot listen on {flag} {host}:{port}: "
                  f"{os.strerror(e.errno) if e.errno else e}; stop "
                  f"what listens there or give {flag} a free address", file=sys.stderr)
            return 1
        print(f"tailguard proxy: listening on http://{host}:{bound} → {len(backends)} backends, "
              f"routing from {redact_url(settings.redis_url)} prefix {settings.key_prefix!r}"
              + (f"; failures reported to {settings.kafka_bootstrap}" if report else ""),
              file=sys.stderr, flush=True)
        await stop.wait()
    return 0


def main(argv: list[str]) -> int:
    return run_main("tailguard proxy", build_parser(), _run, argv)
