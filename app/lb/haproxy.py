"""``tailguard haproxy-sync`` — mirror each model's routing set and weights onto HAProxy via the Runtime API.

Owns :class:`HaproxySync` (and its command line, :func:`main`): HAProxy keeps serving from its
own configuration; this process only flips servers between ``ready`` and ``maint`` with
``set server <backend>/<server> state ready|maint`` and sets their weights with
``set weight <backend>/<server> <N>%`` on the Runtime API socket (:class:`SocketRuntimeApi`).
``--backend-map model=backend,…`` names each model's backend; a node id maps to the server of
the same name unless ``--server-map node=server,…`` says otherwise. What to send is planned,
purely, by :mod:`tailguard.lb.haproxy_plan`. In full: docs/lb.md ("HAProxy").

Guarantees:

* **Only changes are sent**, as planned from one ``show servers state`` read per sync; a
  server configured with too small a weight to be graded keeps 100 %, with a warning.
* **Never all servers in maint.** A backend whose model is unknown, whose routing set names
  none of its servers, or all of whose servers would be held out is left exactly as it is.
* **Converges.** It syncs on every change the reader reports, when a poll of the cached sets
  finds a difference, and every ``--resync-interval-s``; a Redis outage leaves HAProxy as is.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tailguard.lb import BackendsError, RoutingSource, RuntimeApiError
from tailguard.lb.haproxy_plan import parse_servers_state, plan_backend
from tailguard.lb.maps import load_pairs
from tailguard.lb.source import add_routing_args, open_routing, run_main, settings_from_args, stop_on_signals
from tailguard.settings import redact_url

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")   # HAProxy proxy / server names


class RuntimeApi(Protocol):
    """HAProxy's Runtime API: one command in, its answer out."""

    async def command(self, line: str) -> str: ...


class SocketRuntimeApi:
    """The Runtime API over a UNIX socket (``/path``, ``unix@/path``) or TCP (``[ipv4@]host:port``).

    One connection per command (HAProxy's non-interactive mode: it answers and
    closes). Failures raise :class:`RuntimeApiError` naming the socket.
    """

    def __init__(self, address: str, *, timeout_s: float = 5.0) -> None:
        if not address:
            raise ValueError("--socket must name HAProxy's stats socket")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.address = address
        self._timeout_s = timeout_s
        addr = address.removeprefix("unix@")
        self._unix: str | None = None
        self._tcp: tuple[str, int] | None = None
        if addr.startswith(("/", ".")) or address.startswith("unix@"):
            self._unix = addr
        else:
            host, _, port = addr.removeprefix("ipv4@").removeprefix("ipv6@").rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"--socket {address!r} is neither a socket path nor host:port")
            self._tcp = (host.strip("[]"), int(port))

    async def command(self, line: str) -> str:
        if "\n" in line or ";" in line:
            raise ValueError(f"one Runtime API command at a time, got {line!r}")
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._unix is not None:
                    reader, writer = await asyncio.open_unix_connection(self._unix)
                else:
                    assert self._tcp is not None
                    reader, writer = await asyncio.open_connection(*self._tcp)
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    data = await reader.read()
                finally:
                    writer.close()
                    await writer.wait_closed()
        except (OSError, TimeoutError) as e:
            raise RuntimeApiError(
                f"HAProxy Runtime API at {self.address} failed on {line!r} ({type(e).__name__}: {e}); is HAProxy "
                "running with 'stats socket <path> level admin' in its global section?"
            ) from e
        return data.decode("utf-8", errors="replace")


@dataclass(slots=True)
class SyncResult:
    """What one sync did."""

    sent: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)    # backend → reason


class HaproxySync:
    """Keeps HAProxy's servers in step with the routing sets (see module docstring)."""

    def __init__(
        self,
        api: RuntimeApi,
        source: RoutingSource,
        backend_map: Mapping[str, str],
        server_map: Mapping[str, str] | None = None,
        *,
        resync_interval_s: float = 10.0,
        poll_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wake: asyncio.Event | None = None,
        weights: bool = True,
    ) -> None:
        validate_backend_map(backend_map)
        if not resync_interval_s > 0 or not poll_interval_s > 0:
            raise ValueError("resync_interval_s and poll_interval_s must be > 0")
        self._api = api
        self._source = source
        self._backend_map = dict(backend_map)
        self._server_map = dict(server_map or {})
        self._resync_interval_s = resync_interval_s
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._wake = wake or asyncio.Event()
        self._weights = weights
        self._last_skipped: dict[str, str] = {}
        self._last_notes: dict[str, tuple[str, ...]] = {}
        self.syncs = 0
        self.commands_sent = 0
        self.failures = 0

    def notify(self, *_args: Any) -> None:
        """Ask for a sync now (the reader's ``on_change`` callback)."""
        self._wake.set()

    async def routing_sets(self) -> dict[str, frozenset[str]]:
        return {m: await self._source.get(m) for m in self._backend_map}

    async def held_out_sets(self) -> dict[str, frozenset[str]]:
        return {m: await self._source.held_out(m) for m in self._backend_map}

    async def weight_maps(self) -> dict[str, dict[str, float]]:
        """Each mapped model's routing weights (empty with ``weights=False``)."""
        if not self._weights:
            return {}
        return {m: dict(await self._source.weights(m)) for m in self._backend_map}

    async def sync_once(self, sets: Mapping[str, frozenset[str]] | None = None,
                        held: Mapping[str, frozenset[str]] | None = None,
                        weights: Mapping[str, Mapping[str, float]] | None = None) -> SyncResult:
        """Read HAProxy's state once and send the commands that make it match ``sets`` (the
        routing sets), ``held`` (the held-out sets) and ``weights`` (the routing weights; each
        read now when not given).

        Raises :class:`RuntimeApiError` when ``show servers state`` fails;
        a refused ``set server`` is recorded in :attr:`SyncResult.errors`.
        """
        if sets is None:
            sets = await self.routing_sets()
        if held is None:
            held = await self.held_out_sets()
        if weights is None:
            weights = await self.weight_maps()
        state = parse_servers_state(await self._api.command("show servers state"))
        result = SyncResult()
        for model, backend in self._backend_map.items():
            plan = plan_backend(backend, state.get(backend), sets.get(model, frozenset()), self._server_map,
                                held.get(model, frozenset()),
                                weights.get(model, {}) if self._weights else None)
            if plan.notes != self._last_notes.get(backend, ()):
                for note in plan.notes:
                    log.warning("haproxy-sync: model %r: %s", model, note)
                self._last_notes[backend] = plan.notes
            if plan.skipped:
                result.skipped[backend] = plan.skipped
                if self._last_skipped.get(backend) != plan.skipped:
                    log.warning("haproxy-sync: model %r → backend %r: %s", model, backend, plan.skipped)
                continue
            for cmd in plan.commands:
                answer = (await self._api.command(cmd)).strip()
                if answer:
                    hint = _hint(answer)
                    result.errors.append(f"{cmd}: {answer}{hint}")
                    log.error("haproxy-sync: %r refused: %s%s", cmd, answer, hint)
                else:
                    result.sent.append(cmd)
                    log.info("haproxy-sync: %s (model %r)", cmd, model)
        self._last_skipped = result.skipped
        self.syncs += 1
        self.commands_sent += len(result.sent)
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Sync on changes and every ``resync_interval_s`` until ``stop`` is set."""
        applied: tuple[object, ...] | None = None
        next_full_s = float("-inf")
        healthy = True
        while not stop.is_set():
            self._wake.clear()
            sets = await self.routing_sets()
            held = await self.held_out_sets()
            weights = await self.weight_maps()
            now_s = self._clock()
            if (sets, held, weights) != applied or now_s >= next_full_s:
                try:
                    await self.sync_once(sets, held, weights)
                except RuntimeApiError as e:
                    self.failures += 1
                    if healthy:
                        log.error("haproxy-sync: %s; retrying every %.1f s", e, self._poll_interval_s)
                    healthy, applied = False, None
                else:
                    if not healthy:
                        log.info("haproxy-sync: HAProxy reachable again")
                    healthy = True
                    applied = (sets, held, weights)   # refused commands are retried at the next full re-sync
                    next_full_s = now_s + self._resync_interval_s
            await _wait_any(stop, self._wake, self._poll_interval_s)


def _hint(answer: str) -> str:
    low = answer.lower()
    if "denied" in low:
        return " (the stats socket needs 'level admin')"
    if "static" in low:
        return (" (graded weights need a dynamic 'balance' algorithm such as roundrobin or leastconn; "
                "or run with --no-weights)")
    return ""


async def _wait_any(a: asyncio.Event, b: asyncio.Event, timeout_s: float) -> None:
    waiters = [asyncio.create_task(a.wait()), asyncio.create_task(b.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


def validate_backend_map(backend_map: Mapping[str, str]) -> None:
    """One backend per model, one model per backend, HAProxy-valid backend names."""
    if not backend_map:
        raise BackendsError("--backend-map: name at least one model=backend")
    seen: dict[str, str] = {}
    for model, backend in backend_map.items():
        if not _NAME.match(backend):
            raise BackendsError(f"--backend-map: {model}={backend!r} is not a valid HAProxy backend name")
        if backend in seen:
            raise BackendsError(
                f"--backend-map: backend {backend!r} is mapped from both {seen[backend]!r} and {model!r}; "
                "each backend must follow one model's routing set"
            )
        seen[backend] = model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard haproxy-sync",
        description="Put HAProxy servers in maint/ready and set their weights to match tailguard's routing "
                    "sets and weights (Runtime API).",
    )
    p.add_argument("--socket", required=True,
                   help="HAProxy's stats socket: a UNIX path or host:port ('stats socket … level admin')")
    p.add_argument("--backend-map", required=True,
                   help="model=backend,… or a file of such lines: the HAProxy backend serving each model")
    p.add_argument("--server-map", default=None,
                   help="node_id=server,… or a file: HAProxy server name of each node (default: the node id)")
    p.add_argument("--resync-interval-s", type=float, default=10.0,
                   help="full re-sync period even without changes, to repair HAProxy restarts (default 10)")
    p.add_argument("--no-weights", dest="weights", action="store_false",
                   help="leave server weights alone (default: set each ready server's weight to its node's "
                        "routing weight, 100%% without one)")
    p.add_argument("--once", action="store_true", help="sync once and exit (exit 1 if anything failed)")
    add_routing_args(p)
    return p


async def _run(args: argparse.Namespace) -> int:
    backend_map = load_pairs(args.backend_map, flag="--backend-map")
    validate_backend_map(backend_map)
    server_map = load_pairs(args.server_map, flag="--server-map") if args.server_map else {}
    api = SocketRuntimeApi(args.socket)
    settings = settings_from_args(args)
    wake = asyncio.Event()
    async with open_routing(settings, poll_interval_s=args.poll_interval_s, on_change=lambda _e: wake.set(),
                            follow=not args.once) as source:
        sync = HaproxySync(api, source, backend_map, server_map, resync_interval_s=args.resync_interval_s,
                           poll_interval_s=args.poll_interval_s, wake=wake, weights=args.weights)
        if args.once:
            try:
                result = await sync.sync_once()
            except RuntimeApiError as e:
                print(f"tailguard haproxy-sync: {e}", file=sys.stderr)
                return 1
            for cmd in result.sent:
                print(cmd)
            return 1 if result.errors else 0
        stop = stop_on_signals()
        print(f"tailguard haproxy-sync: {api.address}: {', '.join(f'{m}→{b}' for m, b in backend_map.items())}; "
              f"routing from {redact_url(settings.redis_url)} prefix {settings.key_prefix!r}",
              file=sys.stderr, flush=True)
        await sync.run(stop)
    return 0


def main(argv: list[str]) -> int:
    return run_main("tailguard haproxy-sync", build_parser(), _run, argv)
