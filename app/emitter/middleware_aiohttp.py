"""The aiohttp request-timing middleware (``web.Application(middlewares=[aiohttp_middleware(…)])``).

It behaves exactly like the ASGI :class:`~tailguard.emitter.middleware.LatencyMiddleware`
(same guarantees, listed in :mod:`tailguard.emitter.middleware`), and lives apart
because it imports aiohttp: an emitter-only install (aiokafka, orjson) does
not have it, and ``tailguard.emitter`` imports this module only when one of its
names is asked for. A handler refines its record through
``request[AIOHTTP_INFO_KEY]`` (a :class:`~tailguard.emitter.middleware.RequestInfo`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tailguard.emitter.middleware import INFO_KEY, PROBE_HEADER, Recorder, RequestInfo, default_is_ok, finish_request

# The key of the RequestInfo in an aiohttp request: ``request[AIOHTTP_INFO_KEY].output_tokens = n``.
if TYPE_CHECKING or hasattr(web, "RequestKey"):  # noqa: SIM108 (mypy sees one type only as a statement)
    AIOHTTP_INFO_KEY = web.RequestKey(INFO_KEY, RequestInfo)
else:  # aiohttp < 3.13: plain string keys
    AIOHTTP_INFO_KEY = INFO_KEY


def aiohttp_middleware(
    emitter: Recorder,
    *,
    node_id: str,
    model: str | Callable[[web.Request], str | None],
    hardware: str | None = None,
    is_ok: Callable[[int], bool] = default_is_ok,
) -> Middleware:
    """An aiohttp middleware recording every request's latency: ``web.Application(middlewares=[…])``."""
    model_of = model if callable(model) else (lambda _request: model)

    @web.middleware
    async def tailguard_latency(request: web.Request, handler: Handler) -> web.StreamResponse:
        start_ns = time.perf_counter_ns()
        info = RequestInfo()
        request[AIOHTTP_INFO_KEY] = info
        probe = request.headers.get(PROBE_HEADER, "").strip() == "1"
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            raise
        except web.HTTPException as e:
            finish_request(emitter, node_id, model_of(request), hardware, info, start_ns, is_ok(e.status), probe)
            raise
        except Exception:
            finish_request(emitter, node_id, model_of(request), hardware, info, start_ns, False, probe)
            raise
        finish_request(emitter, node_id, model_of(request), hardware, info, start_ns, is_ok(response.status), probe)
        return response

    return tailguard_latency
