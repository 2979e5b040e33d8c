"""Benchmark of the reference proxy: the cost of reading the routing set before each dispatch.

Run: ``python -m bench.bench_lb [--quick] [--redis URL]`` (the real Redis of
``scripts/up``). Two comparisons, each in the same run:

1. **Routing decision** (wall-clock µs per request, best of several repeats):
   what ``tailguard proxy`` does — ``await source.get(model)`` from the
   RoutingTable cache, plus the round-robin pick — against the naive
   alternative of reading the set from Redis (``SMEMBERS``) on every request.
2. **HTTP through the proxy** (requests/s, 32 concurrent clients, a tiny
   loopback backend): direct to the backend vs through ``tailguard proxy``.
   The ratio is the proxy's whole per-request overhead (aiohttp in and out),
   of which the routing read is the small part measured in 1.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import aiohttp

from bench import timing
from tailguard.lb.balance import Balancer
from tailguard.lb.proxy import Proxy, serve
from tailguard.lb.source import open_routing
from tailguard.lb.testing import echo_backend, scratch_redis, write_routing
from tailguard.routing.keys import Keys
from tailguard.settings import Settings

MODEL = "llama-3-70b"
NODES = [f"gpu-node-{i:02d}" for i in range(8)]


def row(label: str, value: str, note: str = "") -> None:
    timing.row(label, value, note, width=56)


async def best_wall_s(fn: object, n: int, repeat: int = 5) -> float:
    assert callable(fn)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        times.append(time.perf_counter() - t0)
    return min(times)


async def bench_decision(redis_url: str, n: int) -> None:
    prefix = f"tgbench-{uuid.uuid4().hex[:12]}"
    urls = {node: f"http://127.0.0.1:{9000 + i}" for i, node in enumerate(NODES)}
    async with scratch_redis(redis_url, prefix) as redis, open_routing(
        Settings(redis_url=redis_url, key_prefix=prefix)
    ) as source:
        await write_routing(redis, prefix, MODEL, NODES[:6], {NODES[6]: 0.0})
        balancer = Balancer(urls)
        key = Keys(prefix).routing(MODEL)

        async def cached() -> None:
            balancer.pick(MODEL, await source.get(MODEL))

        async def per_request_redis() -> None:
            members = await redis.smembers(key)
            balancer.pick(MODEL, frozenset(m.decode() if isinstance(m, bytes) else m for m in members))

        await cached()
        t_cached = await best_wall_s(cached, n) / n
        t_naive = await best_wall_s(per_request_redis, max(n // 10, 100)) / max(n // 10, 100)
    print(f"routing decision per request ({len(NODES[:6])} routed nodes), wall-clock µs (lower is better)")
    row("tailguard proxy: RoutingTable cache + round-robin", f"{t_cached * 1e6:.2f} µs")
    row("naive: SMEMBERS from Redis on every request", f"{t_naive * 1e6:.2f} µs",
        f"{t_naive / t_cached:.0f}x slower")


async def bench_http(redis_url: str, n: int, concurrency: int = 32) -> None:
    prefix = f"tgbench-{uuid.uuid4().hex[:12]}"
    async with scratch_redis(redis_url, prefix) as redis, echo_backend("node-a") as backend, open_routing(
        Settings(redis_url=redis_url, key_prefix=prefix)
    ) as source:
        await write_routing(redis, prefix, MODEL, ["node-a"])
        proxy = Proxy(source, Balancer({"node-a": backend.url}))
        async with serve(proxy, "127.0.0.1", 0) as port, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency)
        ) as http:
            body = {"model": MODEL, "prompt": "x" * 200}

            async def load(url: str) -> float:
                async def worker(k: int) -> None:
                    for _ in range(k):
                        async with http.post(url, json=body) as r:
                            await r.read()
                            assert r.status == 200

                per = n // concurrency
                t0 = time.perf_counter()
                await asyncio.gather(*(worker(per) for _ in range(concurrency)))
                return per * concurrency / (time.perf_counter() - t0)

            direct_url, proxy_url = backend.url + "/v1/completions", f"http://127.0.0.1:{port}/v1/completions"
            await load(direct_url)
            await load(proxy_url)
            direct = max([await load(direct_url) for _ in range(3)])
            proxied = max([await load(proxy_url) for _ in range(3)])
    print(f"HTTP, {concurrency} concurrent clients, tiny loopback backend, requests/s (higher is better)")
    row("direct to the backend", f"{direct:,.0f} req/s")
    row("through tailguard proxy", f"{proxied:,.0f} req/s", f"{proxied / direct:.2f}x of direct")
    assert proxy.stats.fallback == 0, "the benchmark must measure routed dispatch, not fallback"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    n = 20_000 if args.quick else 100_000
    asyncio.run(bench_decision(args.redis, n))
    asyncio.run(bench_http(args.redis, 3_200 if args.quick else 16_000))


if __name__ == "__main__":
    main()
