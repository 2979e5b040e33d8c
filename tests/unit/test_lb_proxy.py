"""The reference proxy against a fake routing source and tiny loopback backends (no Redis, no sleeps)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from tailguard.lb import BackendsError
from tailguard.lb.balance import Balancer
from tailguard.lb.proxy import FailureSink, Proxy, model_of, parse_backends, parse_listen, serve
from tailguard.lb.source import SafeSource
from tailguard.lb.testing import EchoBackend, StaticSource, echo_backend

MODEL = "llama-3-70b"


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


class Fleet:
    def __init__(self, backends: dict[str, EchoBackend], proxy: Proxy, url: str, source: StaticSource,
                 http: aiohttp.ClientSession) -> None:
        self.backends, self.proxy, self.url, self.source, self.http = backends, proxy, url, source, http
        self.all_nodes: frozenset[str] = frozenset(backends)

    def route(self, model: str, nodes: set[str]) -> None:
        """Route ``nodes`` and hold out every other backend, as tailguard does for the nodes it
        took out (a backend neither routed nor held out would get traffic: not judged yet)."""
        self.source.routing[model] = frozenset(nodes)
        self.source.held[model] = self.all_nodes - frozenset(nodes)

    async def send(self, n: int, *, model: str | None = MODEL, headers: dict[str, str] | None = None) -> list[str]:
        """Send n requests; the node ids that answered, in order."""
        nodes = []
        for _ in range(n):
            body = {"model": model, "prompt": "hi"} if model else {"prompt": "hi"}
            async with self.http.post(self.url + "/v1/completions?x=1", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                data = json.loads(await r.read())
                assert r.headers["X-Tailguard-Node"] == data["node"]
                nodes.append(data["node"])
        return nodes


async def make_fleet(stack: AsyncExitStack, names: list[str], *, probe_share: float = 0.0,
                     extra: dict[str, str] | None = None,
                     report_failure: FailureSink | None = None, source: StaticSource | None = None) -> Fleet:
    backends = {n: await stack.enter_async_context(echo_backend(n)) for n in names}
    urls = {n: b.url for n, b in backends.items()} | (extra or {})
    source = source or StaticSource()
    proxy = Proxy(SafeSource(source), Balancer(urls, probe_share=probe_share), clock=lambda: 1000.0,
                  report_failure=report_failure)
    port = await stack.enter_async_context(serve(proxy, "127.0.0.1", 0))
    http = await stack.enter_async_context(aiohttp.ClientSession())
    fleet = Fleet(backends, proxy, f"http://127.0.0.1:{port}", source, http)
    fleet.all_nodes = frozenset(urls)
    return fleet


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


async def test_a_backend_tailguard_has_not_judged_gets_its_share(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b", "c", "new"])
    f.source.routing[MODEL] = frozenset({"a", "c"})
    f.source.held[MODEL] = frozenset({"b"})           # taken out; "new" is neither
    assert await f.send(6) == ["a", "c", "new"] * 2


async def test_round_robin_over_routed_nodes_only(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b", "c"])
    f.route(MODEL, {"a", "c"})
    assert await f.send(6) == ["a", "c"] * 3
    assert f.backends["b"].seen == []
    seen = f.backends["a"].seen[0]
    assert seen.path == "/v1/completions?x=1" and json.loads(seen.body)["model"] == MODEL
    stats = f.proxy.stats.to_dict()
    assert stats["nodes"]["a"]["requests"] == 3 and stats["nodes"]["a"]["by_model"] == {MODEL: 3}
    assert "b" not in stats["nodes"] and stats["fallback"] == 0


async def test_weights_shape_the_rotation_and_all_full_is_plain_round_robin(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b", "c"])
    f.route(MODEL, {"a", "b", "c"})
    f.source.weight[MODEL] = {"a": 1.0, "b": 1.0, "c": 1.0}
    assert await f.send(6) == ["a", "b", "c"] * 2
    f.source.weight[MODEL] = {"b": 0.5}                     # a cycle of 2.5 units: a 2, b 1, c 2
    assert Counter(await f.send(10)) == {"a": 4, "b": 2, "c": 4}
    assert f.proxy.stats.to_dict()["nodes"]["b"]["requests"] == 4
    f.source.weight[MODEL] = {}
    assert Counter(await f.send(6)) == {"a": 2, "b": 2, "c": 2}


async def test_unreadable_weights_are_full_weights(stack: AsyncExitStack) -> None:
    class NoWeights(StaticSource):
        async def weights(self, model: str) -> dict[str, float]:
            raise ConnectionError("weights unreadable")

    f = await make_fleet(stack, ["a", "b"], source=NoWeights({MODEL: frozenset({"a", "b"})}))
    assert await f.send(4) == ["a", "b"] * 2


async def test_routing_change_takes_effect_on_the_next_request(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b", "c"])
    f.route(MODEL, {"a", "b", "c"})
    assert Counter(await f.send(6)) == {"a": 2, "b": 2, "c": 2}
    f.route(MODEL, {"a", "c"})
    assert "b" not in await f.send(6)
    f.route(MODEL, {"a", "b", "c"})
    assert Counter(await f.send(3)) == {"a": 1, "b": 1, "c": 1}


async def test_unknown_set_or_dead_source_falls_back_to_all_backends(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b", "c"])
    assert Counter(await f.send(6)) == {"a": 2, "b": 2, "c": 2}            # never written
    f.source.fail = True                                                    # tailguard / Redis down
    assert Counter(await f.send(3)) == {"a": 1, "b": 1, "c": 1}
    assert Counter(await f.send(3, model=None)) == {"a": 1, "b": 1, "c": 1}  # no model at all
    stats = f.proxy.stats.to_dict()
    assert stats["fallback"] == 12 and stats["no_model"] == 3


async def test_model_header_wins_over_body(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b"])
    f.proxy._model_header = "X-Model"
    f.route("other", {"b"})
    f.route(MODEL, {"a"})
    assert await f.send(2, headers={"X-Model": "other"}) == ["b", "b"]
    assert await f.send(1) == ["a"]


async def test_probe_share_sends_marked_probes_to_due_quarantined_nodes(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b", "c", "d"], probe_share=0.25)
    f.route(MODEL, {"a", "b"})
    f.source.quarantine[MODEL] = {"c": 999.0, "d": 5000.0}   # clock is 1000: c is due, d is not yet
    nodes = await f.send(20)
    assert Counter(nodes) == {"a": 8, "b": 7, "c": 5}
    assert [i for i, n in enumerate(nodes) if n == "c"] == [3, 7, 11, 15, 19]
    assert f.backends["c"].probes == 5 and len(f.backends["c"].seen) == 5
    assert f.backends["a"].probes == 0 and f.backends["d"].seen == []
    assert f.proxy.stats.to_dict()["nodes"]["c"]["probes"] == 5


async def test_client_cannot_forge_probe_header(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a"])
    f.route(MODEL, {"a"})
    await f.send(2, headers={"X-Tailguard-Probe": "1"})
    assert f.backends["a"].probes == 0


async def test_failed_backend_is_retried_once_elsewhere(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b"], extra={"dead": closed_port_url()})
    f.route(MODEL, {"a", "dead"})
    nodes = await f.send(4)
    assert nodes == ["a", "a", "a", "a"]
    stats = f.proxy.stats.to_dict()
    assert stats["nodes"]["dead"]["failures"] == 2 and stats["retries"] == 2 and stats["bad_gateway"] == 0


async def test_unanswered_attempts_are_reported_for_the_node_answers_are_not(
        stack: AsyncExitStack) -> None:
    reported: list[tuple[str, str, float, bool]] = []
    f = await make_fleet(stack, ["a", "q", "err"], probe_share=0.5,
                         extra={"dead": closed_port_url()},
                         report_failure=lambda *a: reported.append(a))
    f.backends["q"].status = 500      # a probe answered 500: the node reports that itself
    f.backends["err"].status = 503
    f.route(MODEL, {"a", "dead"})
    f.source.quarantine[MODEL] = {"q": 0.0}
    assert set(await f.send(4)) == {"a"}
    dead_failures = f.proxy.stats.nodes["dead"].failures
    assert dead_failures >= 1 and f.proxy.stats.nodes["q"].failures >= 1
    assert [(n, m, probe) for n, m, _, probe in reported] == [("dead", MODEL, False)] * dead_failures
    assert all(0 < lat < 2e6 for _, _, lat, _ in reported)    # µs: a refused connect is fast
    n_reported = len(reported)
    f.route(MODEL, {"err"})
    async with f.http.post(f.url + "/v1/chat", json={"model": MODEL}) as r:
        assert r.status == 503
    async with f.http.post(f.url + "/v1/chat", json={"prompt": "no model"}) as r:
        assert r.status in (200, 500, 502, 503)    # whichever backend it reached
    assert len(reported) == n_reported    # an answer (any status), a request without a model: no


async def test_502_when_both_attempts_fail(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, [], extra={"x": closed_port_url(), "y": closed_port_url(), "z": closed_port_url()})
    async with f.http.post(f.url + "/v1/chat", json={"model": MODEL}) as r:
        assert r.status == 502
        body = await r.json()
    assert body["error"] == "bad_gateway" and len(body["tried"]) == 2 and len(set(body["tried"])) == 2
    assert f.proxy.stats.bad_gateway == 1


async def test_failing_probe_is_retried_on_a_routed_node(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "q"], probe_share=0.5)
    f.backends["q"].status = 500
    f.route(MODEL, {"a"})
    f.source.quarantine[MODEL] = {"q": 0.0}
    assert await f.send(4) == ["a"] * 4
    assert f.backends["q"].probes == 2
    assert f.proxy.stats.nodes["q"].failures == 2 and f.proxy.stats.nodes["q"].requests == 0


async def test_backend_errors_other_than_probes_pass_through(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a"])
    f.backends["a"].status = 503
    async with f.http.post(f.url + "/v1/chat", json={"model": MODEL}) as r:
        assert r.status == 503 and r.headers["X-Tailguard-Node"] == "a"


async def test_streamed_response_passes_through_intact(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a"])
    f.backends["a"].chunks = 7
    async with f.http.get(f.url + "/stream") as r:
        assert r.status == 200 and r.headers.get("Transfer-Encoding") == "chunked"
        data = json.loads(await r.read())
    assert data == {"node": "a", "probe": False, "method": "GET", "path": "/stream", "body_bytes": 0}


async def test_stats_and_health_endpoints(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b"])
    f.route(MODEL, {"b"})
    await f.send(3)
    async with f.http.get(f.url + "/_tailguard/stats") as r:
        stats = await r.json()
    assert stats["requests"] == 3 and stats["nodes"]["b"]["requests"] == 3
    async with f.http.get(f.url + "/_tailguard/health") as r:
        assert await r.text() == "ok\n"
    assert f.backends["a"].seen == [] and len(f.backends["b"].seen) == 3


async def test_concurrent_requests_share_one_routing_read(stack: AsyncExitStack) -> None:
    f = await make_fleet(stack, ["a", "b"])
    f.route(MODEL, {"a", "b"})
    await asyncio.gather(*(f.send(5) for _ in range(4)))
    assert sum(len(b.seen) for b in f.backends.values()) == 20
    assert Counter(n for b in f.backends.values() for n in [b.node_id] * len(b.seen)) == {"a": 10, "b": 10}


@pytest.mark.parametrize(
    ("headers", "body", "header", "expected"),
    [
        ({}, b'{"model": "m1", "x": 1}', None, "m1"),
        ({"X-Model": "h"}, b'{"model": "m1"}', "X-Model", "h"),
        ({"X-Model": " "}, b'  {"model": "m1"}', "X-Model", "m1"),
        ({}, b'{"model": 3}', None, None),
        ({}, b'{"model": "  "}', None, None),
        ({}, b"[1, 2]", None, None),
        ({}, b"{not json", None, None),
        ({}, b"\xff\xfe{", None, None),
        ({}, b"", None, None),
        ({}, b"model=m1", None, None),
    ],
)
def test_model_of(headers: dict[str, str], body: bytes, header: str | None, expected: str | None) -> None:
    assert model_of(headers, body, header) == expected


def test_parse_backends_and_listen() -> None:
    assert parse_backends("a=http://h:1/,b=https://h:2/v1") == {"a": "http://h:1", "b": "https://h:2/v1"}
    for bad in ("a=ftp://h:1", "a=h:1", "a=http://h:1/?q=1"):
        with pytest.raises(BackendsError, match="--backends"):
            parse_backends(bad)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    for bad in ("8080", ":80", "h:x", "h:70000"):
        with pytest.raises(BackendsError, match="--listen"):
            parse_listen(bad)


@pytest.mark.parametrize("flag", ["--listen", "TAILGUARD_PROXY_LISTEN"])
def test_a_listen_address_in_use_exits_1_naming_it(
    flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tailguard.lb import proxy

    monkeypatch.setenv("TAILGUARD_REDIS_URL", closed_port_url().replace("http://", "redis://"))
    with socket.socket() as busy:       # another program listening there
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        where = f"127.0.0.1:{busy.getsockname()[1]}"
        argv = ["--backends", "a=http://127.0.0.1:1"]
        if flag == "--listen":
            argv += ["--listen", where]
        else:
            monkeypatch.setenv("TAILGUARD_PROXY_LISTEN", where)
        assert proxy.main(argv) == 1
    err = capsys.readouterr().err
    assert f"tailguard proxy: cannot listen on {flag} {where}: Address already in use" in err
    assert "Traceback" not in err
