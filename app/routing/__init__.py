"""tailguard's Redis side: the routing writer (service) and the routing reader (load balancers).

* :mod:`app.routing.keys` — the key layout (the contract with load balancers).
* :mod:`app.routing.apply_script` — one model's verdict as one atomic Lua script run;
  idempotent; never empties a routing set.
* :mod:`app.routing.writer` — :class:`RoutingWriter`: runs it for every model, retries
  and rides out Redis outages.
* :mod:`app.routing.reader` — :class:`RoutingTable`: cached sets refreshed by
  pub/sub and version polling; serves the last-known sets while Redis is down.
* :mod:`app.routing.status` — ``tailguard status``.
* :mod:`app.routing.client` — :func:`connect`, a fail-fast Redis client.
"""

from app.routing.apply_script import WriteResult
from app.routing.client import connect
from app.routing.errors import RoutingError, RoutingUnavailable
from app.routing.keys import Keys
from app.routing.reader import ModelRouting, ReaderMetrics, RoutingTable
from app.routing.writer import RoutingWriter, WriterMetrics

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
