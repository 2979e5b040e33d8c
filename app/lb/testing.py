"""Test doubles for load-balancer code: a settable routing source and tiny HTTP backends.

* :class:`StaticSource` is a :class:`~app.lb.RoutingSource` whose routing sets
  and quarantines are plain dicts the test sets; ``fail = True`` makes every
  read raise, like a reader with Redis down and nothing cached.
* :func:`echo_backend` runs one tiny aiohttp server on a free loopback port that
  answers every request with JSON naming its ``node_id``, whether the request
  carried ``X-Tailguard-Probe: 1``, and the request's method, path and body
  (``status`` and ``chunks`` shape the answer). Each request is also recorded
  in :attr:`EchoBackend.seen`.

Nothing here touches Redis; used by the unit and integration tests of
:mod:`app.lb` and handy for trying a load-balancer setup by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from app.lb import LbError


class StaticSource:
    """A :class:`~app.lb.RoutingSource` over dicts (see module docstring)."""

    def __init__(
        self,
        routing: Mapping[str, frozenset[str]] | None = None,
        quarantine: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.routing: dict[str, frozenset[str]] = dict(routing or {})
        self.quarantine: dict[str, dict[str, float]] = {m: dict(q) for m, q in (quarantine or {}).items()}
        self.fail = False
        self.reads = 0

    async def get(self, model: str) -> frozenset[str]:
        self.reads += 1
        if self.fail:
            raise LbError(f"StaticSource.fail is set (model {model!r})")
        return self.routing.get(model, frozenset())

    async def quarantined(self, model: str) -> Mapping[str, float]:
        self.reads += 1
        if self.fail:
            raise LbError(f"StaticSource.fail is set (model {model!r})")
        return dict(self.quarantine.get(model, {}))


@dataclass(frozen=True, slots=True)
class Seen:
    """One request an :class:`EchoBackend` received."""

    method: str
    path: str
    probe: bool
    headers: Mapping[str, str]
    body: bytes


@dataclass(slots=True)
class EchoBackend:
    """A running :func:`echo_backend`: where it listens and what it received."""

    node_id: str
    url: str
    status: int = 200
    chunks: int = 1
    seen: list[Seen] = field(default_factory=list)

    @property
    def probes(self) -> int:
        return sum(s.probe for s in self.seen)


@contextlib.asynccontextmanager
async def echo_backend(node_id: str, *, host: str = "127.0.0.1", status: int = 200) -> AsyncIterator[EchoBackend]:
    """Run an echo backend for ``node_id`` on a free port of ``host`` (see module docstring)."""
    backend = EchoBackend(node_id=node_id, url="", status=status)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        probe = request.headers.get("X-Tailguard-Probe") == "1"
        backend.seen.append(Seen(request.method, request.path_qs, probe, dict(request.headers), body))
        payload = (
            f'{{"node": "{node_id}", "probe": {str(probe).lower()}, "method": "{request.method}", '
            f'"path": "{request.path}", "body_bytes": {len(body)}}}'
        ).encode()
        resp = web.StreamResponse(status=backend.status, headers={"Content-Type": "application/json",
                                                                  "X-Echo-Node": node_id})
        await resp.prepare(request)
        # Several writes make a chunked response, as a streaming LLM server sends.
        step = max(1, len(payload) // max(1, backend.chunks))
        for i in range(0, len(payload), step):
            await resp.write(payload[i:i + step])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, 0)
        await site.start()
        port = runner.addresses[0][1]
        backend.url = f"http://{host}:{port}"
        yield backend
    finally:
        await runner.cleanup()
