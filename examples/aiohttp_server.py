"""A tiny aiohttp "inference server" that reports every request's latency to tailguard.

Run (the local stack from scripts/up must be running):

    .venv/bin/python examples/aiohttp_server.py --node-id gpu-node-01 --model llama-3-8b --port 8001
    curl -s localhost:8001/v1/completions -d '{"prompt": "hello there", "max_tokens": 32}'

The middleware times each request and records it (``X-Tailguard-Probe: 1``
marks probe traffic); the handler adds the request's size through
``request[AIOHTTP_INFO_KEY]``; a heartbeat announces the node before it has
traffic. Latency here is simulated: a lognormal time to first token plus a
fixed time per generated token.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
from collections.abc import AsyncIterator

from aiohttp import web

from tailguard.emitter import AIOHTTP_INFO_KEY, LatencyEmitter, Recorder, aiohttp_middleware
from tailguard.security import kafka_client_options
from tailguard.settings import load

TPOT_S = 0.002       # simulated time per output token


async def completions(request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    n_out = max(1, int(body.get("max_tokens", 16)))
    ttft_s = random.lognormvariate(math.log(0.03), 0.3)
    await asyncio.sleep(ttft_s + n_out * TPOT_S)
    info = request[AIOHTTP_INFO_KEY]
    info.input_tokens = len(str(body.get("prompt", "")).split())
    info.output_tokens = n_out
    info.ttft_us = ttft_s * 1e6
    return web.json_response({"choices": [{"text": "lorem " * n_out}],
                              "usage": {"prompt_tokens": info.input_tokens, "completion_tokens": n_out}})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(emitter: Recorder, *, node_id: str, model: str, hardware: str | None = None) -> web.Application:
    app = web.Application(middlewares=[aiohttp_middleware(
        emitter, node_id=node_id, hardware=hardware,
        model=lambda request: None if request.path == "/health" else model)])   # health checks are not traffic
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> None:
    settings = load()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node-id", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--hardware", default=None)
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--bootstrap", default=settings.kafka_bootstrap)
    args = p.parse_args(argv)

    emitter = LatencyEmitter(args.bootstrap, topic=settings.topics.latency_events,
                             producer_options=kafka_client_options(settings))  # SASL/TLS settings

    async def emitter_lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with emitter:                       # flushes on shutdown
            emitter.heartbeat(args.node_id, args.model, args.hardware)
            yield

    app = make_app(emitter, node_id=args.node_id, model=args.model, hardware=args.hardware)
    app.cleanup_ctx.append(emitter_lifecycle)
    web.run_app(app, port=args.port)


if __name__ == "__main__":
    main()
