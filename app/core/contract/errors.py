"""Errors of the pure detection core.

The tree::

    CoreError                 base of every domain error raised by tailguard.core
    └── BadEvent              one input message violates the latency-event contract

Bad arguments to functions (wrong types from our own code) raise the
built-in ``ValueError``/``TypeError``; :class:`CoreError` is for bad *data*
arriving from outside, which the edges count, log with their Kafka
coordinates, dead-letter, and then carry on.
"""

from __future__ import annotations


class CoreError(Exception):
    """Base of the core's domain errors."""


class BadEvent(CoreError):
    """An input message that is not a valid latency event.

    ``reason`` is a short machine-readable slug, stable across releases, for
    metrics labels and dead-letter headers (see ``tailguard.core.contract.events.REASONS``);
    ``field`` names the offending field when there is one; the message says
    what was wrong and what is allowed.
    """

    def __init__(self, reason: str, message: str, *, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_bad_event, (self.reason, str(self), self.field))


def _rebuild_bad_event(reason: str, message: str, field: str | None) -> BadEvent:
    return BadEvent(reason, message, field=field)
