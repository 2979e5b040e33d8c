"""Routing weights reach the load balancers: a REAL HAProxy, and the reference proxy, over the REAL Redis.

Two sources of weights: the test playing tailguard's writer with plain redis-py
(:func:`tailguard.lb.testing.write_routing`: routing set and ``P:weights:<m>`` in one
``MULTI``/``EXEC``, weight 0.625), so the load balancers are checked against the key contract;
and tailguard itself, in-process (:class:`Tailguard`: the detector ticked on latencies of a node
1.6x slower than its 7 peers, each tick written by the worker's ``RoutingWriter``).

* HAProxy (Debian's, started by the test; servers with ``weight 100``), kept in step by
  ``tailguard haproxy-sync`` running as a subprocess: the slow node's server gets
  ``set weight …/node-b 62%``, HAProxy's own traffic follows, and it is back at 100 % once the
  weight is gone (recovery).
* ``tailguard proxy``'s share of requests to the node follows its weight.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import redis.asyncio as aioredis
from test_haproxy import BACKEND, MODEL, NODES, Rig, start_haproxy, start_sync

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import parse_event
from tailguard.core.replay.detector import Detector
from tailguard.lb.balance import Balancer
from tailguard.lb.haproxy import SocketRuntimeApi
from tailguard.lb.proxy import Proxy, serve
from tailguard.lb.source import open_routing
from tailguard.lb.testing import echo_backend, eventually, scratch_redis, write_routing
from tailguard.routing.writer import RoutingWriter
from tailguard.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SLOW, WEIGHT = "node-b", 0.625


@dataclass
class Tailguard:
    """tailguard in-process: 8 nodes (3 of them HAProxy's servers) report 100 requests per 1-s
    tick; each tick of the detector is written by the worker's RoutingWriter."""

    redis: aioredis.Redis
    prefix: str
    nodes: tuple[str, ...] = (*NODES, "node-d", "node-e", "node-f", "node-g", "node-h")
    detector: Detector = field(default_factory=lambda: Detector(DetectorSettings(
        tick_interval_s=1.0, warmup_s=0.0, window_size=200, min_samples=50)))
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(7))
    ts: float = 1_764_680_000.0

    async def tick(self, slow: dict[str, float]) -> dict[str, float]:
        """One tick with ``slow`` nodes that much slower (lognormal, median 100 ms, sigma 0.3); its weights."""
        events = []
        for n in self.nodes:
            lat = 100_000.0 * slow.get(n, 1.0) * np.exp(0.3 * self.rng.standard_normal(100))
            ts = self.ts + np.arange(100) / 100.0
            events.append(parse_event({"node_id": n, "model": MODEL, "samples": np.column_stack([ts, lat]).tolist()}))
        self.ts += 1.0
        self.detector.observe(events)
        (tick,) = self.detector.evaluate(self.ts).models
        assert await RoutingWriter(self.redis, self.prefix).apply(tick)
        return dict(tick.weights)


def within_count_tolerance(got: int, n: int, share: float) -> bool:
    """``got`` of ``n`` requests is the expected share, within 4 binomial standard deviations."""
    return abs(got - n * share) <= 4.0 * math.sqrt(n * share * (1.0 - share)) + 1.0


@pytest.fixture
async def weighted_rig(tmp_path: Path, redis_url: str, unique_name: Callable[[str], str]) -> AsyncIterator[Rig]:
    prefix = unique_name("lb-weights")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        sock, port = await start_haproxy(stack, tmp_path, backends, " weight 100")
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Rig(r, prefix, SocketRuntimeApi(sock, timeout_s=2.0), f"http://127.0.0.1:{port}", backends, http, sock)


async def test_haproxy_gets_the_slow_nodes_weight_and_full_weight_after_recovery(
        weighted_rig: Rig, tmp_path: Path, redis_url: str) -> None:
    rig = weighted_rig

    async def weights() -> dict[str, int | None]:
        return {n: s.uweight for n, s in (await rig.state()).items()}

    async def weights_are(want: dict[str, int]) -> bool:
        return await weights() == want

    async with AsyncExitStack() as stack:
        await write_routing(rig.redis, rig.prefix, MODEL, NODES)
        await start_sync(stack, tmp_path, rig.sock, redis_url, rig.prefix)
        assert await rig.send(30) == {"node-a": 10, "node-b": 10, "node-c": 10}

        # tailguard weights node-b down (1.6x slower than its peers): set weight be_llama/node-b 62%
        await write_routing(rig.redis, rig.prefix, MODEL, NODES, weights={SLOW: WEIGHT})
        await eventually(lambda: weights_are({"node-a": 100, "node-b": 62, "node-c": 100}),
                         what="HAProxy's weight of node-b at 62 (sync log: sync.log)")
        state = await rig.state()
        assert all(s.serving for s in state.values())              # weighted down, not taken out
        n = 262 * 3
        got = await rig.send(n)
        assert within_count_tolerance(got[SLOW], n, 62 / 262), got
        assert got[SLOW] < min(got["node-a"], got["node-c"]), got

        # Someone sets it back by hand: the periodic re-sync repairs it.
        assert await rig.api.command(f"set weight {BACKEND}/{SLOW} 100%") == "\n"
        await eventually(lambda: weights_are({"node-a": 100, "node-b": 62, "node-c": 100}),
                         what="re-sync puts node-b's weight back to 62")

        # Recovered: tailguard drops the weight, HAProxy gives the server its full weight again.
        await write_routing(rig.redis, rig.prefix, MODEL, NODES)
        await eventually(lambda: weights_are(dict.fromkeys(NODES, 100)), what="node-b back at weight 100")
        assert await rig.send(30) == {"node-a": 10, "node-b": 10, "node-c": 10}
    assert f"set weight {BACKEND}/{SLOW} 62%" in (tmp_path / "sync.log").read_text()


async def test_the_reference_proxys_share_follows_the_weight(redis_url: str,
                                                             unique_name: Callable[[str], str]) -> None:
    prefix = unique_name("lb-weights-proxy")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        await write_routing(r, prefix, MODEL, NODES)
        source = await stack.enter_async_context(
            open_routing(Settings(redis_url=redis_url, key_prefix=prefix), poll_interval_s=0.2))
        proxy = Proxy(source, Balancer({n: b.url for n, b in backends.items()}, probe_share=0.0))
        port = await stack.enter_async_context(serve(proxy, "127.0.0.1", 0))
        http = await stack.enter_async_context(aiohttp.ClientSession())

        async def send(n: int) -> Counter[str]:
            got: Counter[str] = Counter()
            for _ in range(n):
                async with http.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL}) as resp:
                    assert resp.status == 200
                    got[resp.headers["X-Tailguard-Node"]] += 1
            return got

        assert await send(30) == {"node-a": 10, "node-b": 10, "node-c": 10}
        await write_routing(r, prefix, MODEL, NODES, weights={SLOW: WEIGHT})

        async def weighted() -> bool:
            return dict(await source.weights(MODEL)) == {SLOW: WEIGHT}

        await eventually(weighted, what="the proxy's reader sees node-b's weight")
        n = 600
        got = await send(n)
        share = WEIGHT / (2 + WEIGHT)
        assert within_count_tolerance(got[SLOW], n, share), got
        assert abs(got["node-a"] - got["node-c"]) <= 1, got
        assert proxy.stats.nodes[SLOW].requests == 10 + got[SLOW]

        await write_routing(r, prefix, MODEL, NODES)             # recovered: plain round-robin again

        async def unweighted() -> bool:
            return not await source.weights(MODEL)

        await eventually(unweighted, what="the proxy's reader sees no weight")
        assert await send(30) == {"node-a": 10, "node-b": 10, "node-c": 10}


async def test_tailguards_own_weight_for_a_slower_node_reaches_haproxy_and_steps_back(
        weighted_rig: Rig, tmp_path: Path, redis_url: str) -> None:
    rig = weighted_rig
    tg = Tailguard(rig.redis, rig.prefix)
    async with AsyncExitStack() as stack:
        await start_sync(stack, tmp_path, rig.sock, redis_url, rig.prefix)
        weights: dict[str, float] = {}
        for _ in range(10):                                   # admission, then 3 confirming windows
            weights = await tg.tick({SLOW: 1.6})
            if SLOW in weights:
                break
        assert set(weights) == {SLOW} and 0.1 <= weights[SLOW] <= 0.7, weights
        for _ in range(3):                                    # settle on the confirmed weight
            weights = await tg.tick({SLOW: 1.6})
        want = round(weights[SLOW] * 100)

        async def haproxy_weight_is(w: int) -> bool:
            return (await rig.state())[SLOW].uweight == w

        await eventually(lambda: haproxy_weight_is(want), what=f"HAProxy's weight of node-b at {want}")
        state = await rig.state()
        assert state["node-a"].uweight == state["node-c"].uweight == 100 and state[SLOW].serving

        # It recovers: the weight comes back in steps, then HAProxy's full weight.
        seen = [weights[SLOW]]
        for _ in range(20):
            weights = await tg.tick({})
            seen.append(weights.get(SLOW, 1.0))
            if not weights:
                break
        assert seen[-1] == 1.0 and len(set(seen)) > 2, seen     # stepped up, not at once
        await eventually(lambda: haproxy_weight_is(100), what="HAProxy's weight of node-b back at 100")
    log = (tmp_path / "sync.log").read_text()
    assert f"set weight {BACKEND}/{SLOW} {want}%" in log and f"set weight {BACKEND}/{SLOW} 100%" in log
