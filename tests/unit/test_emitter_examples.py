"""The examples work: the vLLM proxy against a fake OpenAI-compatible upstream; the aiohttp server.

(examples/fastapi_server.py needs FastAPI, which tailguard does not depend on:
it is only compiled here.)
"""

from __future__ import annotations

import importlib.util
import json
import py_compile
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tailguard_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Calls:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def record(self, node_id: str, model: str, latency_us: float, **kw: Any) -> None:
        self.calls.append({"node_id": node_id, "model": model, "latency_us": latency_us, **kw})


CHAT_CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
]
BODIES = web.AppKey("bodies", list)
USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


async def fake_vllm(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[BODIES].append(body)
    if body.get("model") == "broken":
        return web.json_response({"error": "CUDA OOM"}, status=500)
    if not body.get("stream"):
        return web.json_response({"choices": [{"text": "Hello"}], "usage": USAGE})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunks = CHAT_CHUNKS + ([{"choices": [], "usage": USAGE}]
                            if (body.get("stream_options") or {}).get("include_usage") else [])
    for c in chunks:
        await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def proxy() -> Any:
    mod = load_example("vllm_proxy")
    upstream_app = web.Application()
    upstream_app[BODIES] = []
    upstream_app.router.add_post("/v1/completions", fake_vllm)
    upstream_app.router.add_post("/v1/chat/completions", fake_vllm)
    async with TestServer(upstream_app) as upstream:
        calls = Calls()
        app = mod.make_app(calls, mod.Config(str(upstream.make_url("")).rstrip("/"), "gpu-node-07", "A100"))
        async with TestClient(TestServer(app)) as client:
            client.calls, client.upstream_bodies = calls.calls, upstream_app[BODIES]
            yield client


async def test_streamed_chat_records_ttft_and_tokens_and_hides_the_injected_usage_chunk(proxy: Any) -> None:
    r = await proxy.post("/v1/chat/completions", json={"model": "llama", "stream": True, "messages": []},
                         headers={"X-Tailguard-Probe": "1"})
    text = await r.text()
    assert r.status == 200 and '"Hel"' in text and '"usage"' not in text and text.rstrip().endswith("[DONE]")
    assert proxy.upstream_bodies[0]["stream_options"] == {"include_usage": True}
    [c] = proxy.calls
    assert (c["node_id"], c["model"], c["hardware"], c["ok"], c["probe"]) == ("gpu-node-07", "llama", "A100",
                                                                           True, True)
    assert (c["input_tokens"], c["output_tokens"]) == (7, 2)
    assert 0 < c["ttft_us"] <= c["latency_us"]


async def test_a_client_that_asked_for_usage_still_gets_it(proxy: Any) -> None:
    r = await proxy.post("/v1/completions", json={"model": "llama", "stream": True, "prompt": "hi",
                                                  "stream_options": {"include_usage": True}})
    assert '"usage"' in await r.text()
    assert proxy.calls[0]["output_tokens"] == 2


async def test_non_streamed_reads_usage_and_5xx_is_a_failure(proxy: Any) -> None:
    r = await proxy.post("/v1/completions", json={"model": "llama", "prompt": "hi"})
    assert (await r.json())["usage"] == USAGE
    r = await proxy.post("/v1/completions", json={"model": "broken", "prompt": "hi"})
    assert r.status == 500
    assert [(c["model"], c["ok"], c["input_tokens"], c["ttft_us"]) for c in proxy.calls] == [
        ("llama", True, 7, None), ("broken", False, None, None)]


async def test_aiohttp_server_example_reports_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load_example("aiohttp_server")
    monkeypatch.setattr(mod.random, "lognormvariate", lambda mu, sigma: 0.0)
    monkeypatch.setattr(mod, "TPOT_S", 0.0)
    calls = Calls()
    async with TestClient(TestServer(mod.make_app(calls, node_id="gpu-1", model="llama"))) as client:
        r = await client.post("/v1/completions", json={"prompt": "one two three", "max_tokens": 4})
        assert r.status == 200
        assert (await client.get("/health")).status == 200
    assert [(c["model"], c["input_tokens"], c["output_tokens"], c["ok"]) for c in calls.calls] == [
        ("llama", 3, 4, True)]


def test_fastapi_example_is_valid_python() -> None:
    py_compile.compile(str(EXAMPLES / "fastapi_server.py"), doraise=True)
