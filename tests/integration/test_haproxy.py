"""A REAL haproxy in front of 3 loopback backends, kept in step with the routing set in the REAL Redis.

The test writes a generated haproxy.cfg (admin stats socket in a temp dir, one
backend of 3 servers, health checks off), starts Debian's haproxy in the
foreground, runs ``tailguard haproxy-sync`` as a subprocess, and plays
tailguard by writing the routing set with plain redis-py. It checks HAProxy's
own view (``show servers state``) and where traffic through HAProxy lands.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from tailguard.lb import RuntimeApiError
from tailguard.lb.haproxy import SocketRuntimeApi
from tailguard.lb.haproxy_plan import ServerState, parse_servers_state
from tailguard.lb.testing import EchoBackend, echo_backend, eventually, scratch_redis, spawn, write_routing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "llama-3-70b"
BACKEND = "be_llama"
NODES = ["node-a", "node-b", "node-c"]

CONFIG = """\
global
    stats socket {sock} mode 600 level admin
    stats timeout 30s
    pidfile {dir}/haproxy.pid

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s

frontend fe_llm
    bind 127.0.0.1:{port}
    default_backend {backend}

backend {backend}
    balance roundrobin
{servers}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Rig:
    redis: aioredis.Redis
    prefix: str
    api: SocketRuntimeApi
    url: str
    backends: dict[str, EchoBackend]
    http: aiohttp.ClientSession
    sock: str

    async def state(self) -> dict[str, ServerState]:
        return parse_servers_state(await self.api.command("show servers state"))[BACKEND]

    async def maint(self) -> set[str]:
        return {n for n, s in (await self.state()).items() if s.forced_maint}

    async def send(self, n: int) -> Counter[str]:
        got: Counter[str] = Counter()
        for _ in range(n):
            async with self.http.get(self.url + "/v1/models") as r:
                assert r.status == 200, await r.text()
                got[r.headers["X-Echo-Node"]] += 1
        return got


async def start_haproxy(stack: AsyncExitStack, tmp: Path, backends: dict[str, EchoBackend],
                        server_opts: str = "") -> tuple[str, int]:
    # Debian installs it in /usr/sbin, which is not on every user's PATH.
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if haproxy is None:
        pytest.fail("haproxy is not installed: `apt-get install haproxy` (Debian package; scripts/test installs it)",
                    pytrace=False)
    sock, port = str(tmp / "admin.sock"), free_port()
    servers = "\n".join(f"    server {n} {b.url.removeprefix('http://')}{server_opts}" for n, b in backends.items())
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(CONFIG.format(sock=sock, dir=tmp, port=port, backend=BACKEND, servers=servers))
    log = open(tmp / "haproxy.log", "wb")  # noqa: SIM115 - closed by the exit stack
    stack.callback(log.close)
    proc = await spawn(stack, haproxy, "-db", "-f", str(cfg), stdout=log, stderr=log)
    api = SocketRuntimeApi(sock, timeout_s=2.0)

    async def answers() -> bool:
        if proc.returncode is not None:
            pytest.fail(f"haproxy exited with {proc.returncode}: {(tmp / 'haproxy.log').read_text()}", pytrace=False)
        try:
            return BACKEND in parse_servers_state(await api.command("show servers state"))
        except RuntimeApiError:
            return False

    await eventually(answers, timeout_s=15.0, what="haproxy answers on its admin socket")
    return sock, port


async def start_sync(stack: AsyncExitStack, tmp: Path, sock: str, redis_url: str, prefix: str,
                     *extra: str, env: dict[str, str] | None = None, model: str = MODEL) -> None:
    log = open(tmp / "sync.log", "wb")  # noqa: SIM115 - closed by the exit stack
    stack.callback(log.close)
    await spawn(
        stack, sys.executable, "-m", "tailguard.cli", "haproxy-sync", "--socket", sock, "--backend-map",
        f"{model}={BACKEND}", "--redis-url", redis_url, "--key-prefix", prefix, "--poll-interval-s", "0.2",
        "--resync-interval-s", "1", *extra, stdout=log, stderr=log, env=dict(os.environ if env is None else env),
    )


@pytest.fixture
async def rig(tmp_path: Path, redis_url: str, unique_name: Callable[[str], str]) -> AsyncIterator[Rig]:
    prefix = unique_name("lb-haproxy")
    async with AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
        sock, port = await start_haproxy(stack, tmp_path, backends)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Rig(r, prefix, SocketRuntimeApi(sock, timeout_s=2.0), f"http://127.0.0.1:{port}", backends, http, sock)


async def test_routing_changes_reach_haproxy_and_its_traffic(rig: Rig, tmp_path: Path, redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        await write_routing(rig.redis, rig.prefix, MODEL, NODES)
        await start_sync(stack, tmp_path, rig.sock, redis_url, rig.prefix)
        assert await rig.send(9) == {"node-a": 3, "node-b": 3, "node-c": 3}

        # tailguard takes node-b out.
        await write_routing(rig.redis, rig.prefix, MODEL, ["node-a", "node-c"], {"node-b": 0.0})
        await eventually(lambda: _eq(rig.maint(), {"node-b"}), what="node-b in maint (sync log: sync.log)")
        state = await rig.state()
        assert state["node-a"].serving and state["node-c"].serving and not state["node-b"].serving
        before = len(rig.backends["node-b"].seen)
        got = await rig.send(12)
        assert got == {"node-a": 6, "node-c": 6} and len(rig.backends["node-b"].seen) == before

        # Someone (or a restarted HAProxy) puts it back by hand: the periodic re-sync repairs it.
        assert await rig.api.command(f"set server {BACKEND}/node-b state ready") == "\n"
        assert await rig.maint() == set()
        await eventually(lambda: _eq(rig.maint(), {"node-b"}), what="re-sync puts node-b back in maint")

        # Re-admitted.
        await write_routing(rig.redis, rig.prefix, MODEL, NODES)
        await eventually(lambda: _eq(rig.maint(), set()), what="node-b ready again")
        assert await rig.send(9) == {"node-a": 3, "node-b": 3, "node-c": 3}


async def sync_once(rig: Rig, redis_url: str) -> tuple[list[str], str]:
    """Run ``tailguard haproxy-sync --once``; the commands it printed, and its log."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard.cli", "haproxy-sync", "--once", "--socket", rig.sock,
        "--backend-map", f"{MODEL}={BACKEND}", "--redis-url", redis_url, "--key-prefix", rig.prefix,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode().splitlines(), err.decode()


async def test_never_puts_every_server_in_maint(rig: Rig, redis_url: str) -> None:
    # A routing set naming no server of the backend, then an empty/unknown one: HAProxy is left alone.
    for nodes in (["ghost-1"], []):
        await write_routing(rig.redis, rig.prefix, MODEL, nodes)
        sent, log = await sync_once(rig, redis_url)
        assert sent == [] and "as it is" in log
        assert await rig.maint() == set()
    assert await rig.send(3) == {"node-a": 1, "node-b": 1, "node-c": 1}

    # --once applies a real change and prints the commands it sent (tailguard took a and b out).
    await write_routing(rig.redis, rig.prefix, MODEL, ["node-c"], held_out=["node-a", "node-b"])
    sent, _ = await sync_once(rig, redis_url)
    assert sent == [f"set server {BACKEND}/node-a state maint", f"set server {BACKEND}/node-b state maint"]
    assert await rig.send(4) == {"node-c": 4}


async def _eq(got: object, want: object) -> bool:
    assert asyncio.iscoroutine(got)
    return bool(await got == want)
