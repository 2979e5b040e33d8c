"""Request timing for web servers: a generic ASGI middleware, and what the aiohttp one shares.

The aiohttp middleware is :mod:`tailguard.emitter.middleware_aiohttp` (it needs aiohttp). Both
time each HTTP request from the moment the middleware sees it until the handler (or ASGI app)
has returned — for a streamed response, until its last chunk — and call ``emitter.record()``.

Guarantees:

* ``ok`` is ``is_ok(status)`` (default: status < 500); an exception from the handler records
  ``ok=False`` and is re-raised; a cancelled request (client gone) is not recorded.
* The load balancer's probe header ``X-Tailguard-Probe: 1`` records ``probe=True``.
* ``model`` is a fixed string or a function of the request (aiohttp ``Request``, ASGI
  ``scope``) returning the model name, or ``None`` to leave the request unrecorded.
* A handler refines the record through the :class:`RequestInfo` attached to the request
  (``request[AIOHTTP_INFO_KEY]`` in aiohttp, ``request.state.tailguard`` in
  Starlette/FastAPI, ``scope["state"]["tailguard"]`` in ASGI): tokens, TTFT, model, ``ok``,
  ``skip``.
* Telemetry never breaks a request: a value the emitter rejects is logged, the response goes
  out unchanged. Nothing here imports FastAPI, Starlette or aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

log = logging.getLogger("tailguard.emitter")

PROBE_HEADER: Final = "X-Tailguard-Probe"
INFO_KEY: Final = "tailguard"
_PROBE_HEADER_ASGI: Final = PROBE_HEADER.lower().encode()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Recorder(Protocol):
    """Anything with the emitter's ``record()`` (``LatencyEmitter``, ``SyncEmitter``)."""

    def record(self, node_id: str, model: str, latency_us: float, *, ok: bool = ..., ts: float | None = ...,
               probe: bool = ..., hardware: str | None = ..., input_tokens: int | None = ...,
               output_tokens: int | None = ..., ttft_us: float | None = ...) -> None: ...


@dataclass(slots=True)
class RequestInfo:
    """What a handler may tell the middleware about its request (all optional)."""

    model: str | None = None          # overrides the middleware's model
    input_tokens: int | None = None
    output_tokens: int | None = None
    ttft_us: float | None = None
    ok: bool | None = None            # overrides the status-based verdict
    skip: bool = False                # do not record this request


def default_is_ok(status: int) -> bool:
    """A request failed when the server failed (5xx); client errors are the client's."""
    return status < 500


def finish_request(emitter: Recorder, node_id: str, model: str | None, hardware: str | None, info: RequestInfo,
            start_ns: int, ok: bool, probe: bool) -> None:
    elapsed_ns = time.perf_counter_ns() - start_ns
    model = info.model or model
    if info.skip or model is None:
        return
    latency_us = max(elapsed_ns, 1) / 1000.0
    ttft_us = info.ttft_us
    if ttft_us is not None:
        ttft_us = min(ttft_us, latency_us)   # measured by the handler's own clock
    try:
        emitter.record(node_id, model, latency_us, ok=ok if info.ok is None else info.ok, probe=probe,
                       hardware=hardware, input_tokens=info.input_tokens, output_tokens=info.output_tokens,
                       ttft_us=ttft_us)
    except ValueError as e:
        log.warning("tailguard middleware: request not recorded: %s", e)


class LatencyMiddleware:
    """Generic ASGI middleware; with FastAPI/Starlette: ``app.add_middleware(LatencyMiddleware, emitter=…, …)``."""

    def __init__(
        self,
        app: ASGIApp,
        emitter: Recorder,
        *,
        node_id: str,
        model: str | Callable[[Scope], str | None],
        hardware: str | None = None,
        is_ok: Callable[[int], bool] = default_is_ok,
    ) -> None:
        self.app = app
        self.emitter = emitter
        self.node_id = node_id
        self.model_of: Callable[[Scope], str | None] = model if callable(model) else (lambda _scope: model)
        self.hardware = hardware
        self.is_ok = is_ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start_ns = time.perf_counter_ns()
        info = RequestInfo()
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[INFO_KEY] = info
        probe = any(k.lower() == _PROBE_HEADER_ASGI and v.strip() == b"1" for k, v in scope.get("headers", ()))
        status: int | None = None

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except asyncio.CancelledError:
            raise
        except Exception:
            finish_request(self.emitter, self.node_id, self.model_of(scope), self.hardware, info, start_ns, False,
                           probe)
            raise
        ok = status is not None and self.is_ok(status)
        finish_request(self.emitter, self.node_id, self.model_of(scope), self.hardware, info, start_ns, ok, probe)
