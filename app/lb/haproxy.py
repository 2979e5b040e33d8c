"""``tailguard haproxy-sync`` — mirror each model's routing set and weights onto HAProxy via the Runtime API.

Owns :class:`HaproxySync` (and its command line, :func:`main`): HAProxy keeps serving from its
own configuration; this process only flips servers between ``ready`` and ``maint`` with
``set server <backend>/<server> state ready|maint`` and sets their weights with
``set weight <backend>/<server> <N>%`` on the Runtime API socket (:class:`SocketRuntimeApi`).
``--backend-map model=backend,…`` names each model's backend; a node id maps to the server of
the same name unless ``--server-map node=server,…`` says otherwise. A server whose node
tailguard took out (its held-out set) goes to ``maint``, every other server of a mapped backend
to ``ready`` at ``N`` = its node's routing weight × 100 (100 % without one; ``--no-weights``
leaves weights alone). In full: docs/lb.md ("HAProxy").

Guarantees:

* **Only changes are sent.** Each sync reads ``show servers state`` once
  (:func:`parse_servers_state`, format version 1) and :func:`plan_backend` commands only the
  servers whose forced maintenance flag or weight (``srv_uweight`` against what ``N``% of
  ``srv_iweight`` gives) disagrees with the routing set and weights. A held-out server's
  weight is left alone; a server configured with too small a weight to be graded (``weight 1``
  makes anything under 100 % a 0) keeps 100 %, with a warning naming it.
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
from tailguard.lb.maps import load_pairs
from tailguard.lb.source import add_routing_args, open_routing, run_main, settings_from_args, stop_on_signals
from tailguard.settings import redact_url

log = logging.getLogger(__name__)

# srv_admin_state bits (HAProxy include/haproxy/server-t.h, SRV_ADMF_*).
FMAINT = 0x01   # forced maintenance: what `set server … state maint|ready` sets and clears
IMAINT = 0x02   # inherited from a tracked server
CMAINT = 0x04   # `disabled` in the configuration
FDRAIN = 0x08   # forced drain
RMAINT = 0x40   # DNS resolution failed
# srv_op_state values.
OP_STOPPED, OP_STARTING, OP_RUNNING, OP_STOPPING = 0, 1, 2, 3

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")   # HAProxy proxy / server names


@dataclass(frozen=True, slots=True)
class ServerState:
    """One row of ``show servers state``."""

    backend: str
    server: str
    op_state: int
    admin_state: int
    uweight: int | None = None      # the weight in effect (srv_uweight)
    iweight: int | None = None      # the weight in the configuration (srv_iweight)

    @property
    def forced_maint(self) -> bool:
        return bool(self.admin_state & FMAINT)

    @property
    def serving(self) -> bool:
        """Running and in no maintenance of any kind (what HAProxy sends traffic to)."""
        return self.op_state == OP_RUNNING and not self.admin_state & (FMAINT | IMAINT | CMAINT | RMAINT)


def parse_servers_state(text: str) -> dict[str, dict[str, ServerState]]:
    """``show servers state`` output → backend → server → :class:`ServerState`.

    Raises :class:`RuntimeApiError` if the text is not format version 1 with
    the ``be_name srv_name srv_op_state srv_admin_state`` columns.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].strip() != "1":
        raise RuntimeApiError(f"unexpected answer to 'show servers state': {text[:200]!r}")
    columns: list[str] = []
    out: dict[str, dict[str, ServerState]] = {}
    for line in lines[1:]:
        if line.startswith("#"):
            columns = line[1:].split()
            continue
        try:
            idx = {c: columns.index(c) for c in ("be_name", "srv_name", "srv_op_state", "srv_admin_state")}
        except ValueError:
            raise RuntimeApiError(f"'show servers state' lacks the expected columns: {columns}") from None
        f = line.split()
        try:
            st = ServerState(f[idx["be_name"]], f[idx["srv_name"]], int(f[idx["srv_op_state"]]),
                             int(f[idx["srv_admin_state"]]),
                             *(int(f[columns.index(c)]) if c in columns else None
                               for c in ("srv_uweight", "srv_iweight")))
        except (IndexError, ValueError):
            raise RuntimeApiError(f"malformed 'show servers state' line: {line!r}") from None
        out.setdefault(st.backend, {})[st.server] = st
    return out


@dataclass(frozen=True, slots=True)
class BackendPlan:
    """What to do to one backend: commands to send, and why nothing is done when ``skipped``."""

    backend: str
    commands: tuple[str, ...] = ()
    ready: frozenset[str] = frozenset()     # servers that should take traffic
    maint: frozenset[str] = frozenset()     # servers that should not
    skipped: str | None = None
    notes: tuple[str, ...] = ()             # weights that cannot be applied, and why


MAX_WEIGHT = 256    # HAProxy's largest server weight


def weight_percent(weight: float) -> int:
    """A routing weight (0, 1] as the whole percent sent to HAProxy, 1..100."""
    return min(100, max(1, round(weight * 100)))


def effective_weight(iweight: int, percent: int) -> int:
    """The weight HAProxy gives a server for ``set weight …/… <percent>%`` (src/server.c:
    ``iweight * percent / 100`` in integers, at most 256)."""
    return min(MAX_WEIGHT, iweight * percent // 100)


def plan_weights(
    backend: str,
    servers: Mapping[str, ServerState],
    ready: frozenset[str],
    routed: frozenset[str],
    weights: Mapping[str, float],
    server_map: Mapping[str, str] | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``set weight`` commands that give each of ``ready``'s servers its node's weight
    (routed nodes: ``weights``, absent = 1.0; any other: 100 %), and notes on the servers whose
    configured weight cannot express it (pure; see module docstring)."""
    node_of = {srv: node for node, srv in (server_map or {}).items()}
    commands: list[str] = []
    notes: list[str] = []
    for s in sorted(ready):
        st = servers[s]
        if st.iweight is None or st.uweight is None:
            continue
        node = node_of.get(s, s)
        percent = weight_percent(weights.get(node, 1.0)) if node in routed else 100
        if percent < 100 and effective_weight(st.iweight, percent) < 1:
            notes.append(f"server {backend}/{s} has 'weight {st.iweight}' in the configuration, too small for "
                         f"a weight of {percent}% (HAProxy would make it 0); give its server line (or "
                         "default-server) 'weight 100' to let tailguard grade it")
            percent = 100
        if effective_weight(st.iweight, percent) != st.uweight:
            commands.append(f"set weight {backend}/{s} {percent}%")
    return tuple(commands), tuple(notes)


def plan_backend(
    backend: str,
    servers: Mapping[str, ServerState] | None,
    routed: frozenset[str],
    server_map: Mapping[str, str] | None = None,
    held_out: frozenset[str] = frozenset(),
    weights: Mapping[str, float] | None = None,
) -> BackendPlan:
    """The ``set server`` commands that put ``backend``'s held-out servers in maint and the
    others ready, then, unless ``weights`` is ``None``, the ``set weight`` commands of
    :func:`plan_weights` (pure; see module docstring)."""
    if servers is None:
        return BackendPlan(backend, skipped=f"backend {backend!r} does not exist in HAProxy")
    if not routed and not held_out:
        return BackendPlan(backend, skipped="routing set unknown (empty): leaving the backend as it is")
    smap = server_map or {}
    if routed and not any(smap.get(n, n) in servers for n in routed):
        return BackendPlan(
            backend,
            skipped=f"no node of the routing set ({', '.join(sorted(routed)[:5])}…) is a server of the backend "
            f"(servers: {', '.join(sorted(servers)[:5])}…; see --server-map): leaving it as it is",
        )
    maint = frozenset(s for s in (smap.get(n, n) for n in held_out) if s in servers)
    ready = frozenset(servers) - maint
    if not ready:
        return BackendPlan(backend, skipped="every server of the backend is held out: leaving it as it is")
    commands = [f"set server {backend}/{s} state ready" for s in sorted(ready) if servers[s].forced_maint]
    commands += [f"set server {backend}/{s} state maint" for s in sorted(maint) if not servers[s].forced_maint]
    notes: tuple[str, ...] = ()
    if weights is not None:
        weighting, notes = plan_weights(backend, servers, ready, routed, weights, smap)
        commands += weighting
    return BackendPlan(backend, tuple(commands), ready, maint, notes=notes)


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
