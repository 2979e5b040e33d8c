"""``tailguard probe``: synthetic probes reach due quarantined nodes only (real loopback HTTP)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from tailguard.lb.prober import Prober, ProbeRequest, build_parser, run_prober
from tailguard.lb.testing import StaticSource, echo_backend

MODEL = "llama-3-70b"
NOW = 1000.0


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


async def test_only_due_quarantined_nodes_get_marked_probes(stack: AsyncExitStack) -> None:
    b = {n: await stack.enter_async_context(echo_backend(n)) for n in ("routed", "due", "later")}
    source = StaticSource({MODEL: frozenset({"routed"})},
                          {MODEL: {"due": NOW - 1.0, "later": NOW + 60.0, "no-address": 0.0}})
    reported: list[tuple[str, str, float, bool]] = []
    prober = Prober(source, {n: x.url for n, x in b.items()}, [MODEL],
                    ProbeRequest(model_header="X-Model"), clock=lambda: NOW,
                    report_failure=lambda *a: reported.append(a))
    async with aiohttp.ClientSession() as session:
        results = await prober.round(session)
        await prober.round(session)
    assert [(r.node_id, r.model, r.status) for r in results] == [("due", MODEL, 200)]
    assert [len(x.seen) for x in b.values()] == [0, 2, 0]
    seen = b["due"].seen[0]
    assert seen.probe and seen.method == "POST" and seen.path == "/v1/completions"
    assert json.loads(seen.body)["model"] == MODEL and seen.headers["X-Model"] == MODEL
    assert reported == [] and prober.sent == {"due": 2}


async def test_a_probe_nobody_answers_is_reported_and_a_dead_source_probes_nothing(
        stack: AsyncExitStack) -> None:
    source = StaticSource({}, {MODEL: {"dead": 0.0}})
    reported: list[tuple[str, str, float, bool]] = []
    prober = Prober(source, {"dead": closed_port_url()}, [MODEL], clock=lambda: NOW,
                    report_failure=lambda *a: reported.append(a))
    async with aiohttp.ClientSession() as session:
        (res,) = await prober.round(session)
        assert res.status is None and prober.failed == {"dead": 1}
        assert [(n, m, probe) for n, m, _, probe in reported] == [("dead", MODEL, True)]
        source.fail = True
        assert await prober.round(session) == []


async def test_run_prober_paces_rounds_and_stops() -> None:
    async with echo_backend("due") as b:
        prober = Prober(StaticSource({}, {MODEL: {"due": 0.0}}), {"due": b.url}, [MODEL])
        stop = asyncio.Event()
        task = asyncio.create_task(run_prober(prober, 20.0, stop))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(task, 5)
    assert 3 <= len(b.seen) <= 15          # about 10 rounds at 20/s in 0.5 s


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one model"):
        Prober(StaticSource(), {}, [])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--backends", "a=http://x"])          # --model is required
    args = build_parser().parse_args(["--backends", "a=http://x", "--model", "m", "--model", "n"])
    assert args.models == ["m", "n"] and args.rate_per_node == 1.0


async def test_rate_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match="rate-per-node"):
        await run_prober(Prober(StaticSource(), {}, [MODEL]), 0.0, asyncio.Event())
