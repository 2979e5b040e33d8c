"""The emitter's pacing in trouble: when it may try Kafka again, and how often it says so.

:class:`Backoff` is the flusher's retry clock (:class:`tailguard.emitter.emitter.LatencyEmitter`):
each failure (a send, a connection) doubles the wait before the next try, from
``initial_s`` up to ``max_s``; a delivered message starts the doubling over, a new
connection also allows a try at once. :class:`LogLimiter` keeps a server's log readable
while Kafka is down: one line per kind of trouble at most every ``every_s``.

Guarantees:

* ``Backoff.delay_s`` is 0 or in ``[initial_s, max_s]``; ``retry_at`` is never before the
  last failure plus its delay (``-inf`` until the first failure and after a connection).
* :meth:`LogLimiter.log` logs the first line of a kind at once and then at most one every
  ``every_s`` of the injected monotonic clock; it says whether it logged.
* No I/O but the log line; the clock is injected.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

__all__ = ["Backoff", "LogLimiter"]


class Backoff:
    """Exponential back-off on a monotonic clock; see the module docstring."""

    def __init__(self, initial_s: float, max_s: float, monotonic: Callable[[], float]) -> None:
        self.initial_s = float(initial_s)
        self.max_s = float(max_s)
        self._mono = monotonic
        self.delay_s = 0.0
        self.retry_at = -math.inf

    def failed(self) -> None:
        """One more failure: wait twice as long as the last time (at least ``initial_s``)."""
        self.delay_s = min(max(self.delay_s * 2, self.initial_s), self.max_s)
        self.retry_at = self._mono() + self.delay_s

    def delivered(self) -> None:
        """A message got through: the next failure waits ``initial_s`` again."""
        self.delay_s = 0.0

    def connected(self) -> None:
        """A new connection: no wait, and the next failure waits ``initial_s``."""
        self.delay_s = 0.0
        self.retry_at = -math.inf


class LogLimiter:
    """At most one log line per kind every ``every_s``; see the module docstring."""

    def __init__(self, log: logging.Logger, every_s: float, monotonic: Callable[[], float]) -> None:
        self._log = log
        self.every_s = every_s
        self._mono = monotonic
        self._last: dict[str, float] = {}

    def log(self, kind: str, level: int, msg: str, *args: object) -> bool:
        now = self._mono()
        if now - self._last.get(kind, -math.inf) < self.every_s:
            return False
        self._last[kind] = now
        self._log.log(level, msg, *args)
        return True
