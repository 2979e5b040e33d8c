"""The emitter SDK: what an inference server imports to report request latencies.

::

    from app.emitter import LatencyEmitter

    async with LatencyEmitter("127.0.0.1:9092") as em:
        em.heartbeat("gpu-node-07", "llama-3-70b", hardware="A100")
        em.record("gpu-node-07", "llama-3-70b", latency_us=183_000, hardware="A100",
                  input_tokens=812, output_tokens=256, ttft_us=41_000)

Modules: :mod:`~app.emitter.emitter` (``LatencyEmitter``, asyncio),
:mod:`~app.emitter.sync` (``SyncEmitter``, any thread),
:mod:`~app.emitter.middleware` (ASGI request timing),
:mod:`~app.emitter.middleware_aiohttp` (aiohttp request timing; needs aiohttp),
:mod:`~app.emitter.wire` (the JSON on the wire),
:mod:`~app.emitter.buffer` (the bounded buffer), :mod:`~app.emitter.errors`.
``record()`` never blocks the request path, memory stays bounded when Kafka is
down (oldest samples dropped and counted), and every message follows the
latency-event contract in ARCHITECTURE.md.

Dependencies: aiokafka and orjson only (`pip install tailguard[emitter]`);
this package imports neither ``app.core`` nor ``app.streaming``. The aiohttp
names (``aiohttp_middleware``, ``AIOHTTP_INFO_KEY``) are imported on first
use, so that a server without aiohttp can import the rest.
"""

from typing import TYPE_CHECKING

from app.emitter.emitter import MAX_BATCH, EmitterStats, LatencyEmitter, Producer
from app.emitter.errors import EmitterError, EmitterStartError
from app.emitter.middleware import PROBE_HEADER, LatencyMiddleware, Recorder, RequestInfo
from app.emitter.sync import SyncEmitter

if TYPE_CHECKING:
    from app.emitter.middleware_aiohttp import AIOHTTP_INFO_KEY, aiohttp_middleware

_AIOHTTP_NAMES = frozenset({"AIOHTTP_INFO_KEY", "aiohttp_middleware"})


def __getattr__(name: str) -> object:
    """``aiohttp_middleware`` and ``AIOHTTP_INFO_KEY``, imported when first asked for."""
    if name in _AIOHTTP_NAMES:
        try:
            from app.emitter import middleware_aiohttp
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"app.emitter.{name} needs aiohttp ({e}); install it in the server's environment "
                "(`pip install aiohttp`), or use the ASGI LatencyMiddleware", name=e.name) from e
        return getattr(middleware_aiohttp, name)
    raise AttributeError(f"module 'app.emitter' has no attribute {name!r}")

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
