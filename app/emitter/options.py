"""The emitter's options checked: a clear ``ValueError`` naming the option, before anything starts.

Owns the bounds of :class:`~tailguard.emitter.emitter.LatencyEmitter`'s options
(:func:`check_options`, :func:`positive`) and ``MAX_BATCH``, the largest ``max_batch``.

Guarantees: a programming error (a wrong type or a value out of its bound) raises
``ValueError`` with the option's name, its bound and the value given; nothing else raises.
"""

from __future__ import annotations

import math
from typing import Any, Final

from tailguard.emitter.wire import WIRE_FORMATS

#: Upper bound of ``max_batch``: 5000 samples of ~90 bytes stay well under
#: Kafka's default 1 MB message limit (``max_request_size``, ``message.max.bytes``).
MAX_BATCH: Final = 5000


def check_options(bootstrap_servers: Any, topic: Any, max_batch: Any, max_buffered: Any, linger_s: Any,
                  max_in_flight: Any, retry_backoff_s: Any, max_retry_backoff_s: Any, wire_format: Any) -> None:
    """Raise ``ValueError`` for the first option out of its bound."""
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise ValueError(f"bootstrap_servers must be 'host:port[,host:port…]', got {bootstrap_servers!r}")
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty string, got {topic!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= MAX_BATCH:
        raise ValueError(f"max_batch must be an int in [1, {MAX_BATCH}], got {max_batch!r}")
    if isinstance(max_buffered, bool) or not isinstance(max_buffered, int) or max_buffered < max_batch:
        raise ValueError(f"max_buffered must be an int >= max_batch ({max_batch}), got {max_buffered!r}")
    if isinstance(linger_s, bool) or not isinstance(linger_s, int | float) or not 0 <= linger_s < math.inf:
        raise ValueError(f"linger_s must be a finite number >= 0, got {linger_s!r}")
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
    if isinstance(retry_backoff_s, bool) or not 0 <= retry_backoff_s <= max_retry_backoff_s:
        raise ValueError(f"retry_backoff_s must be in [0, max_retry_backoff_s={max_retry_backoff_s!r}],"
                         f" got {retry_backoff_s!r}")
    if wire_format not in WIRE_FORMATS:
        raise ValueError(f"wire_format must be one of {WIRE_FORMATS}, got {wire_format!r}")


def positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)
