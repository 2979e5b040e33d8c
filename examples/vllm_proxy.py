"""Report latency, TTFT and token counts of an OpenAI-compatible server (vLLM, SGLang, TGI …).

A small reverse proxy that sits next to the inference server on the same node:

    vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000
    .venv/bin/python examples/vllm_proxy.py --upstream http://127.0.0.1:8000 --node-id gpu-node-07 --port 9000

Clients (or the load balancer) talk to :9000 exactly as to vLLM. For every
``/v1/completions`` and ``/v1/chat/completions`` request the proxy records:

* ``latency_us`` — until the last byte of the response;
* ``ttft_us`` — until the first streamed chunk that carries generated text
  (streaming requests only);
* ``input_tokens`` / ``output_tokens`` — the response's
  ``usage.prompt_tokens`` / ``usage.completion_tokens``. For streams the proxy
  asks for ``stream_options.include_usage`` and, when the client did not ask
  for it, removes the extra usage-only chunk again, so clients see what they
  asked for;
* ``ok`` — false on 5xx or an unreachable upstream; ``probe`` from
  ``X-Tailguard-Probe: 1``.

At start it announces (heartbeat) every model the upstream lists in ``/v1/models``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from tailguard.emitter import PROBE_HEADER, LatencyEmitter, Recorder
from tailguard.security import kafka_client_options
from tailguard.settings import load

log = logging.getLogger("vllm_proxy")
ROUTES = ("/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass(frozen=True)
class Config:
    upstream: str
    node_id: str
    hardware: str | None = None


CONFIG = web.AppKey("config", Config)
EMITTER = web.AppKey("emitter", Recorder)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def proxy(request: web.Request) -> web.StreamResponse:
    cfg, emitter, session = request.app[CONFIG], request.app[EMITTER], request.app[SESSION]
    t0 = time.perf_counter()
    body = await request.json()
    model = str(body.get("model") or "unknown")
    stream = bool(body.get("stream"))
    hide_usage = stream and not (body.get("stream_options") or {}).get("include_usage")
    if stream:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    usage: dict[str, Any] = {}
    ttft_us: float | None = None
    response: web.StreamResponse
    try:
        async with session.post(cfg.upstream + request.path, json=body, headers=headers) as up:
            status = up.status
            if not stream or status != 200:
                payload = await up.read()
                if status == 200:
                    usage = json.loads(payload).get("usage") or {}
                response = web.Response(body=payload, status=status, content_type=up.content_type)
            else:
                response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                                   "Cache-Control": "no-cache"})
                await response.prepare(request)
                async for line in up.content:          # server-sent events, one line at a time
                    if line.startswith(b"data: {"):
                        chunk = json.loads(line[6:])
                        if ttft_us is None and _has_text(chunk):
                            ttft_us = (time.perf_counter() - t0) * 1e6
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                            if hide_usage and not chunk.get("choices"):
                                continue               # the usage-only chunk the client did not ask for
                    await response.write(line)
                await response.write_eof()
    except aiohttp.ClientError as e:
        status, response = 502, web.json_response({"error": f"upstream: {e}"}, status=502)
    latency_us = (time.perf_counter() - t0) * 1e6
    try:
        emitter.record(cfg.node_id, model, latency_us, ok=status < 500, hardware=cfg.hardware,
                       probe=request.headers.get(PROBE_HEADER, "").strip() == "1",
                       input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens"),
                       ttft_us=None if ttft_us is None else min(ttft_us, latency_us))
    except ValueError as e:                            # odd upstream values must not fail the request
        log.warning("not recorded: %s", e)
    return response


def make_app(emitter: Recorder, cfg: Config) -> web.Application:
    app = web.Application()
    app[CONFIG], app[EMITTER] = cfg, emitter

    async def session_lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)) as s:
            app[SESSION] = s
            yield

    app.cleanup_ctx.append(session_lifecycle)
    for route in ROUTES:
        app.router.add_post(route, proxy)
    return app


def main(argv: list[str] | None = None) -> None:
    settings = load()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", default="http://127.0.0.1:8000", help="the OpenAI-compatible server")
    p.add_argument("--node-id", required=True)
    p.add_argument("--hardware", default=None, help="GPU class, e.g. A100")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--bootstrap", default=settings.kafka_bootstrap)
    args = p.parse_args(argv)
    cfg = Config(args.upstream.rstrip("/"), args.node_id, args.hardware)
    emitter = LatencyEmitter(args.bootstrap, topic=settings.topics.latency_events,
                             producer_options=kafka_client_options(settings))  # SASL/TLS settings

    async def emitter_lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with emitter:
            try:
                async with app[SESSION].get(cfg.upstream + "/v1/models") as r:
                    for m in (await r.json()).get("data", []):
                        emitter.heartbeat(cfg.node_id, m["id"], cfg.hardware)
            except aiohttp.ClientError as e:
                log.warning("no heartbeats: cannot list the upstream's models (%s)", e)
            yield

    app = make_app(emitter, cfg)
    app.cleanup_ctx.append(emitter_lifecycle)
    web.run_app(app, port=args.port)


if __name__ == "__main__":
    main()
