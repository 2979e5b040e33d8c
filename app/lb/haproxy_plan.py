"""What ``tailguard haproxy-sync`` would change in one HAProxy backend: pure, no I/O, no clock.

Owns :func:`parse_servers_state` (the Runtime API's ``show servers state`` answer, format
version 1, as :class:`ServerState` per backend and server), the ``srv_admin_state`` bits and
``srv_op_state`` values it reads, and :func:`plan_backend` / :func:`plan_weights`: the
``set server … state ready|maint`` and ``set weight … N%`` commands that bring one backend in
line with its model's routing set and weights (:class:`BackendPlan`).

Guarantees: only servers whose forced maintenance flag or weight disagrees are commanded; a
backend whose model is unknown, whose routing set names none of its servers, or all of whose
servers would be held out gets no command; a held-out server's weight is left alone; a server
configured with too small a weight to be graded keeps 100 %, with a note naming it. The
process around it (the socket, the sync loop, the command line) is :mod:`tailguard.lb.haproxy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.lb import RuntimeApiError

# srv_admin_state bits (HAProxy include/haproxy/server-t.h, SRV_ADMF_*).
FMAINT = 0x01   # forced maintenance: what `set server … state maint|ready` sets and clears
IMAINT = 0x02   # inherited from a tracked server
CMAINT = 0x04   # `disabled` in the configuration
FDRAIN = 0x08   # forced drain
RMAINT = 0x40   # DNS resolution failed
# srv_op_state values.
OP_STOPPED, OP_STARTING, OP_RUNNING, OP_STOPPING = 0, 1, 2, 3



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
