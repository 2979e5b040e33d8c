"""aiohttp and ASGI middlewares: one record per request, status → ok, probe header, handler annotations."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tailguard.emitter import AIOHTTP_INFO_KEY, LatencyMiddleware, RequestInfo, aiohttp_middleware
from tailguard.emitter.middleware import Message, Scope


class Calls:
    """A Recorder that remembers its calls (and validates like the emitter)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def record(self, node_id: str, model: str, latency_us: float, **kw: Any) -> None:
        if kw.get("input_tokens") == -1:
            raise ValueError("input_tokens must be None or an int in [0, 10000000], got -1")
        assert latency_us > 0
        self.calls.append({"node_id": node_id, "model": model, **kw})


# ------------------------------------------------------------------ aiohttp

async def completions(request: web.Request) -> web.Response:
    info = request[AIOHTTP_INFO_KEY]
    info.input_tokens, info.output_tokens, info.ttft_us = 12, 3, 1e12   # ttft above latency is clamped
    return web.json_response({"ok": True})


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError("CUDA error: out of memory")


async def missing(request: web.Request) -> web.Response:
    raise web.HTTPNotFound()


async def overloaded(request: web.Request) -> web.Response:
    return web.json_response({}, status=503)


async def bad_annotation(request: web.Request) -> web.Response:
    request[AIOHTTP_INFO_KEY].input_tokens = -1
    return web.json_response({})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def client() -> Any:
    calls = Calls()
    app = web.Application(middlewares=[aiohttp_middleware(
        calls, node_id="gpu-1", hardware="A100",
        model=lambda r: None if r.path == "/health" else r.headers.get("X-Model", "llama"))])
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/broken", broken)
    app.router.add_get("/missing", missing)
    app.router.add_get("/overloaded", overloaded)
    app.router.add_get("/bad", bad_annotation)
    app.router.add_get("/health", health)
    async with TestClient(TestServer(app)) as c:
        c.calls = calls
        yield c


async def test_aiohttp_records_each_request_with_status_probe_and_tokens(client: Any) -> None:
    r = await client.post("/v1/completions", headers={"X-Tailguard-Probe": "1", "X-Model": "mistral"})
    assert r.status == 200
    assert (await client.get("/broken")).status == 500
    assert (await client.get("/missing")).status == 404
    assert (await client.get("/overloaded")).status == 503
    assert (await client.get("/health")).status == 200
    calls = client.calls.calls
    assert [(c["model"], c["ok"], c["probe"]) for c in calls] == [
        ("mistral", True, True), ("llama", False, False), ("llama", True, False), ("llama", False, False)]
    first = calls[0]
    assert (first["node_id"], first["hardware"], first["input_tokens"], first["output_tokens"]) == ("gpu-1", "A100",
                                                                                                   12, 3)
    assert 0 < first["ttft_us"] < 1e12          # clamped to the measured latency
    assert all(c["input_tokens"] is None for c in calls[1:])


async def test_aiohttp_a_rejected_annotation_never_breaks_the_response(client: Any,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    assert (await client.get("/bad")).status == 200
    assert client.calls.calls == []
    assert "request not recorded" in caplog.text


# ------------------------------------------------------------------ ASGI

def http_scope(path: str = "/v1/chat/completions", headers: list[tuple[bytes, bytes]] | None = None) -> Scope:
    return {"type": "http", "method": "POST", "path": path, "headers": headers or []}


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def run(mw: LatencyMiddleware, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await mw(scope, receive, send)
    return sent


def asgi_app(status: int, *, annotate: bool = False, fail: bool = False) -> Any:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if fail:
            raise RuntimeError("boom")
        if annotate:
            info: RequestInfo = scope["state"]["tailguard"]
            info.model, info.output_tokens = "override", 42
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
    return app


@pytest.mark.parametrize(("status", "ok"), [(200, True), (429, True), (500, False), (504, False)])
async def test_asgi_ok_follows_the_status(status: int, ok: bool) -> None:
    calls = Calls()
    sent = await run(LatencyMiddleware(asgi_app(status), calls, node_id="n1", model="llama"), http_scope())
    assert sent[0]["status"] == status                      # the response passes through unchanged
    assert [(c["model"], c["ok"], c["probe"]) for c in calls.calls] == [("llama", ok, False)]


async def test_asgi_probe_header_annotations_and_skips() -> None:
    calls = Calls()
    mw = LatencyMiddleware(asgi_app(200, annotate=True), calls, node_id="n1",
                           model=lambda scope: None if scope["path"] == "/metrics" else "llama")
    await run(mw, http_scope(headers=[(b"x-tailguard-probe", b"1"), (b"content-type", b"application/json")]))
    await run(mw, http_scope(headers=[(b"X-Tailguard-Probe", b"0")]))
    await run(LatencyMiddleware(asgi_app(200), calls, node_id="n1", model=lambda s: None), http_scope("/metrics"))
    assert [(c["model"], c["probe"], c["output_tokens"]) for c in calls.calls] == [
        ("override", True, 42), ("override", False, 42)]


async def test_asgi_exception_is_recorded_as_failed_and_reraised() -> None:
    calls = Calls()
    with pytest.raises(RuntimeError, match="boom"):
        await run(LatencyMiddleware(asgi_app(200, fail=True), calls, node_id="n1", model="m"), http_scope())
    assert [c["ok"] for c in calls.calls] == [False]


async def test_asgi_passes_non_http_scopes_through_unrecorded() -> None:
    calls = Calls()
    seen = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await LatencyMiddleware(app, calls, node_id="n1", model="m")({"type": "lifespan"}, receive, receive)  # type: ignore[arg-type]
    assert seen == ["lifespan"] and calls.calls == []
