"""tailguard's Redis side: the routing writer (service) and the routing reader (load balancers).

* :mod:`tailguard.routing.keys` — the key layout (the contract with load balancers).
* :mod:`tailguard.routing.apply_script` — one model's verdict as one atomic Lua script run;
  idempotent; never empties a routing set.
* :mod:`tailguard.routing.writer` — :class:`RoutingWriter`: runs it for every model, retries
  and rides out Redis outages.
* :mod:`tailguard.routing.reader` — :class:`RoutingTable`: cached sets refreshed by
  pub/sub and version polling; serves the last-known sets while Redis is down.
* :mod:`tailguard.routing.status` — ``tailguard status``.
* :mod:`tailguard.routing.client` — :func:`connect`, a fail-fast Redis client.
"""

from tailguard.routing.apply_script import WriteResult
from tailguard.routing.client import connect
from tailguard.routing.errors import RoutingError, RoutingUnavailable
from tailguard.routing.keys import Keys
from tailguard.routing.reader import ModelRouting, ReaderMetrics, RoutingTable
from tailguard.routing.writer import RoutingWriter, WriterMetrics

__all__ = [
    "Keys",
    "ModelRouting",
    "ReaderMetrics",
    "RoutingError",
    "RoutingTable",
    "RoutingUnavailable",
    "RoutingWriter",
    "WriteResult",
    "WriterMetrics",
    "connect",
]
