"""The emitter SDK: what an inference server imports to report request latencies.

::

    from app.emitter import LatencyEmitter

    async with LatencyEmitter("127.0.0.1:9092") as em:
        em.heartbeat("gpu-node-07", "llama-3-70b", hardware="A100")
        em.record("gpu-node-07", "llama-3-70b", latency_us=183_000, hardware="A100",
                  input_tokens=812, output_tokens=256, ttft_us=41_000)

Modules: :mod:`~app.emitter.emitter` (``LatencyEmitter``, asyncio),
:mod:`~app.emitter.sync` (``SyncEmitter``, any thread),
:mod:`~app.emitter.middleware` (aiohttp and ASGI request timing),
:mod:`~app.emitter.wire` (the JSON on the wire),
:mod:`~app.emitter.buffer` (the bounded buffer), :mod:`~app.emitter.errors`.
``record()`` never blocks the request path, memory stays bounded when Kafka is
down (oldest samples dropped and counted), and every message follows the
latency-event contract in ARCHITECTURE.md.
"""

from app.emitter.emitter import MAX_BATCH, EmitterStats, LatencyEmitter, Producer
from app.emitter.errors import EmitterError, EmitterStartError
from app.emitter.middleware import (
    AIOHTTP_INFO_KEY,
    PROBE_HEADER,
    LatencyMiddleware,
    Recorder,
    RequestInfo,
    aiohttp_middleware,
)
from app.emitter.sync import SyncEmitter

__all__ = [
    "AIOHTTP_INFO_KEY",
    "MAX_BATCH",
    "PROBE_HEADER",
    "EmitterError",
    "EmitterStartError",
    "EmitterStats",
    "LatencyEmitter",
    "LatencyMiddleware",
    "Producer",
    "Recorder",
    "RequestInfo",
    "SyncEmitter",
    "aiohttp_middleware",
]
