"""A FastAPI "inference server" reporting latency through tailguard's ASGI middleware.

Needs ``pip install fastapi uvicorn`` (not tailguard dependencies). Run:

    TG_NODE_ID=gpu-node-02 TG_MODEL=llama-3-8b .venv/bin/python examples/fastapi_server.py
    curl -s localhost:8002/v1/completions -H 'content-type: application/json' -d '{"max_tokens": 8}'

``LatencyMiddleware`` is plain ASGI, so the same line works for Starlette,
Litestar or any ASGI app; handlers add token counts through
``request.state.tailguard``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from tailguard.emitter import LatencyEmitter, LatencyMiddleware
from tailguard.security import kafka_client_options
from tailguard.settings import load

NODE_ID = os.environ.get("TG_NODE_ID", "gpu-node-02")
MODEL = os.environ.get("TG_MODEL", "llama-3-8b")
settings = load()
emitter = LatencyEmitter(settings.kafka_bootstrap, topic=settings.topics.latency_events,
                         producer_options=kafka_client_options(settings))  # SASL/TLS settings


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with emitter:                           # started with the app, flushed at shutdown
        emitter.heartbeat(NODE_ID, MODEL)
        yield


app = FastAPI(lifespan=lifespan)
app.add_middleware(LatencyMiddleware, emitter=emitter, node_id=NODE_ID,
                   model=lambda scope: None if scope["path"] == "/health" else MODEL)


@app.post("/v1/completions")
async def completions(request: Request) -> dict[str, Any]:
    body = await request.json()
    n_out = max(1, int(body.get("max_tokens", 16)))
    await asyncio.sleep(0.03 + 0.002 * n_out)     # stands in for the model
    request.state.tailguard.output_tokens = n_out
    return {"choices": [{"text": "lorem " * n_out}], "usage": {"completion_tokens": n_out}}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, port=8002)
