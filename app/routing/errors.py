"""The routing package's exceptions.

::

    RoutingError                 base of everything this package raises on purpose
    ├── RoutingUnavailable       Redis could not be read and there is no last-known
    │                            routing set to serve instead (reader's first load)
    └── WrongKeyType             a key of tailguard's layout holds another Redis type
                                 (something else wrote it): names the key and both types

Bad arguments raise the built-in ``ValueError``/``TypeError``. The writer never
raises for Redis failures: it keeps the latest desired state, retries, and
reports through :class:`~tailguard.routing.writer.WriterMetrics`.
"""

from __future__ import annotations


class RoutingError(Exception):
    """Base of the routing package's domain and I/O errors."""


class RoutingUnavailable(RoutingError):
    """Redis is unreachable and nothing was cached yet for ``model``."""

    def __init__(self, model: str, cause: BaseException) -> None:
        self.model, self.cause = model, cause
        super().__init__(
            f"cannot read the routing set of model {model!r} from Redis ({cause}); "
            "no last-known set to serve — check that Redis is up and TAILGUARD_REDIS_URL points at it"
        )


class WrongKeyType(RoutingError):
    """``key`` holds a Redis ``found`` type where tailguard's layout has an ``expected`` one."""

    def __init__(self, key: str, expected: str, found: str) -> None:
        self.key, self.expected, self.found = key, expected, found
        super().__init__(
            f"Redis key {key!r} holds a {found}, tailguard expects a {expected} there: "
            "something else wrote it (another program sharing TAILGUARD_KEY_PREFIX?); "
            "delete the key or choose another TAILGUARD_KEY_PREFIX"
        )
