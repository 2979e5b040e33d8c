"""Errors of the emitter SDK.

The tree::

    EmitterError        base of the emitter's own failures
    └── EmitterStartError   the SyncEmitter's background thread could not start

Bad arguments (``latency_us <= 0``, an empty ``node_id`` …) raise the built-in
``ValueError``. Kafka being slow or down is *not* an error for the caller: it
shows in ``stats`` (``dropped``, ``send_errors``, ``connected``) and in the
``tailguard.emitter`` log, because telemetry must never fail a request.
"""

from __future__ import annotations


class EmitterError(Exception):
    """Base of the emitter's errors."""


class EmitterStartError(EmitterError):
    """The SyncEmitter's event-loop thread failed to start (the cause is chained)."""
