"""The emitter SDK: what an inference server imports to report request latencies.

::

    from tailguard.emitter import LatencyEmitter

    async with LatencyEmitter("127.0.0.1:9092") as em:
        em.heartbeat("gpu-node-07", "llama-3-70b", hardware="A100")
        em.record("gpu-node-07", "llama-3-70b", latency_us=183_000, hardware="A100",
                  input_tokens=812, output_tokens=256, ttft_us=41_000)

Modules: ``emitter`` (``LatencyEmitter``, asyncio), ``sync`` (``SyncEmitter``, any thread),
``middleware`` (ASGI request timing), ``middleware_aiohttp`` (needs aiohttp), ``wire`` (the
bytes on the wire), ``buffer``, ``kafka`` (the producer), ``options``, ``stats``, ``errors``.

Guarantees: ``record()`` never blocks the request path, memory stays bounded when Kafka is
down (oldest samples dropped and counted), every message follows the latency-event contract.
Dependencies: aiokafka and orjson only (``pip install tailguard[emitter]``); nothing from
``tailguard.core`` or ``tailguard.streaming``; the aiohttp names (``aiohttp_middleware``,
``AIOHTTP_INFO_KEY``) are imported on first use, so a server without aiohttp imports the rest.
"""

from typing import TYPE_CHECKING

from tailguard.emitter.emitter import LatencyEmitter
from tailguard.emitter.errors import EmitterError, EmitterStartError
from tailguard.emitter.kafka import Producer
from tailguard.emitter.middleware import PROBE_HEADER, LatencyMiddleware, Recorder, RequestInfo
from tailguard.emitter.options import MAX_BATCH
from tailguard.emitter.stats import EmitterStats
from tailguard.emitter.sync import SyncEmitter

if TYPE_CHECKING:
    from tailguard.emitter.middleware_aiohttp import AIOHTTP_INFO_KEY, aiohttp_middleware

_AIOHTTP_NAMES = frozenset({"AIOHTTP_INFO_KEY", "aiohttp_middleware"})


def __getattr__(name: str) -> object:
    """``aiohttp_middleware`` and ``AIOHTTP_INFO_KEY``, imported when first asked for."""
    if name in _AIOHTTP_NAMES:
        try:
            from tailguard.emitter import middleware_aiohttp
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"tailguard.emitter.{name} needs aiohttp ({e}); install it in the server's environment "
                "(`pip install aiohttp`), or use the ASGI LatencyMiddleware", name=e.name) from e
        return getattr(middleware_aiohttp, name)
    raise AttributeError(f"module 'tailguard.emitter' has no attribute {name!r}")

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
