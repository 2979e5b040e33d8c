"""The emitter's counters as one consistent snapshot (:class:`EmitterStats`).

Owns the names and meanings of the counters that :attr:`LatencyEmitter.stats
<tailguard.emitter.emitter.LatencyEmitter.stats>` and :attr:`SyncEmitter.stats
<tailguard.emitter.sync.SyncEmitter.stats>` return.

Guarantees: a snapshot is frozen; taken while the emitter is idle, ``recorded == sent +
dropped + buffered + in_flight`` (the emitter's accounting, tested in tests/unit/test_emitter.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """A consistent snapshot of an emitter's counters (samples unless noted).

    ``recorded``: accepted by ``record()``; ``sent``: acknowledged by Kafka;
    ``dropped``: lost (buffer overflow, non-retriable error, recorded after
    close, left over at close); ``buffered``: waiting in memory;
    ``in_flight``: handed to the producer, not yet acknowledged;
    ``send_errors``: failed send attempts (messages, incl. heartbeats);
    ``heartbeats_sent``: acknowledged heartbeat messages; ``connected``:
    whether a producer is up.
    """

    recorded: int
    sent: int
    dropped: int
    send_errors: int
    buffered: int
    in_flight: int
    heartbeats_sent: int
    connected: bool
