"""Load balancers that read tailguard's routing set before they dispatch.

Two integrations live here:

* :mod:`tailguard.lb.proxy` — ``tailguard proxy``, a reference async HTTP reverse proxy:
  smooth weighted round-robin over a model's routing set, a small share of probe traffic to
  quarantined nodes, fallback to every known backend when the routing set is unknown.
* :mod:`tailguard.lb.haproxy` — ``tailguard haproxy-sync``, which mirrors each model's routing
  set onto HAProxy servers through the Runtime API.

Both read routing state through :class:`RoutingSource`, a two-method Protocol that
:class:`tailguard.routing.reader.RoutingTable` satisfies; tests pass a fake. The selection and
diffing logic (:mod:`tailguard.lb.balance`, :mod:`tailguard.lb.haproxy_plan`) does no I/O and
reads no clock.

Exceptions: :class:`LbError`, the base of what this package raises on purpose;
:class:`BackendsError`, the ``--backends`` / ``--server-map`` / ``--backend-map`` input is
malformed; :class:`RuntimeApiError`, HAProxy's Runtime API refused a command or cannot be
reached. Bad arguments to functions raise the built-in ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class RoutingSource(Protocol):
    """Where a load balancer reads routing state (cached; no Redis round-trip per call).

    ``get`` returns the node ids that may receive traffic for ``model``; an
    empty set means "unknown" to the load balancers (tailguard never empties a
    model's routing set on purpose, and writes none before a node is admitted).
    ``quarantined`` maps node id → the Unix time (s) from which it may be
    probed. ``held_out`` is the nodes tailguard took out (ejected, quarantined,
    retired, gone, drained): a load balancer with its own server list serves
    the list minus these, so that nodes tailguard has not judged yet get the
    traffic that admits them. ``weights`` maps node id → routing weight in
    (0, 1], from the same version as ``get``'s set; a node without an entry
    weighs 1.0. All may raise when nothing is cached and Redis cannot be read;
    callers treat that as "unknown".
    """

    async def get(self, model: str) -> frozenset[str]: ...

    async def quarantined(self, model: str) -> Mapping[str, float]: ...

    async def held_out(self, model: str) -> frozenset[str]: ...

    async def weights(self, model: str) -> Mapping[str, float]: ...


class LbError(Exception):
    """Base of the load-balancer package's domain and I/O errors."""


class BackendsError(LbError, ValueError):
    """A backend / server / backend map given on the command line or in a file is malformed."""


class RuntimeApiError(LbError):
    """HAProxy's Runtime API could not be reached or answered a command with an error."""
