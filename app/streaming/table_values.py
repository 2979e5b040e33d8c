"""How stage 2's table values are stored: plain JSON while small, zlib and base64 when large.

Stage 2 writes each model's state and hints to faust tables backed by compacted changelog
topics (:mod:`tailguard.streaming.stage2`). :func:`pack_value` turns a value into what is
stored and says how many bytes of JSON it takes; :func:`unpack_value` gives the value back.

Guarantees:

* A value whose JSON is at most ``plain_max_bytes`` (:data:`PLAIN_MAX_BYTES` by default) is
  stored as it is, readable in the changelog; a larger one as ``{"zlib_b64": …}``.
* ``unpack_value(pack_value(v)[0]) == v`` for every JSON-able ``v``; a plain value comes back
  as the same object.
* A packed value that does not decode raises ValueError, never anything else.
* :data:`MAX_VALUE_BYTES` is the largest value a writer may store: under the producer's 1 MB
  ``max_request_size``, with room for the key and the record's framing.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["MAX_VALUE_BYTES", "PLAIN_MAX_BYTES", "pack_value", "unpack_value", "value_json"]

#: The largest table value written (JSON bytes): under the 1 MB ``max_request_size`` of the
#: producer, with room for the key and the record's framing.
MAX_VALUE_BYTES = 900_000
#: Table values up to this many bytes of JSON are stored as they are (readable in the
#: changelog); larger ones compressed (:func:`pack_value`).
PLAIN_MAX_BYTES = 64_000
_PACKED = "zlib_b64"


def value_json(value: Any) -> bytes:
    """``value``'s JSON as :func:`pack_value` stores it (equal values, built in the same order,
    give equal bytes)."""
    return orjson.dumps(value, default=str)


def pack_value(value: Any, plain_max_bytes: int = PLAIN_MAX_BYTES,
               raw: bytes | None = None) -> tuple[Any, int]:
    """A table value as stored, and its size in bytes of JSON: ``value`` itself when its
    JSON is at most ``plain_max_bytes``, else ``{"zlib_b64": base64 of its zlib-compressed
    JSON}``. ``raw``: ``value_json(value)`` when the caller has it already."""
    raw = value_json(value) if raw is None else raw
    if len(raw) <= plain_max_bytes:
        return value, len(raw)
    packed = base64.b64encode(zlib.compress(raw, 1)).decode("ascii")
    return {_PACKED: packed}, len(packed) + len(_PACKED) + 6


def unpack_value(stored: Any) -> Any:
    """The value :func:`pack_value` stored (a plain value is returned as it is).

    Raises ValueError when a packed value does not decode (truncated, not zlib, not JSON).
    """
    if not (isinstance(stored, Mapping) and len(stored) == 1 and _PACKED in stored):
        return stored
    try:
        return orjson.loads(zlib.decompress(base64.b64decode(stored[_PACKED], validate=True)))
    except (binascii.Error, zlib.error, TypeError, ValueError) as e:
        raise ValueError(f"a packed table value does not decode: {e}") from e
