"""The binary batch form of a latency event: its byte layout, read and written with numpy.

Owns the layout of ``docs/contracts-binary.md`` (version 1) and nothing else:
validation of the values (latency bounds, event time, token counts) is
:mod:`tailguard.core.contract.events`' job, as for the JSON forms. The emitter writes the
same bytes with the standard library (``tailguard.emitter.wire``, which imports
nothing from the core); a test checks both writers agree byte for byte.

Guarantees:

* A message is binary exactly when it starts with :data:`MAGIC`
  (``0xF5 'T' 'G'``): ``0xF5`` never occurs in UTF-8 text, so no JSON
  message is ever read as binary, nor a binary one as JSON.
* :func:`parse` returns the columns as read-only float64 views of ``raw``
  (no per-sample Python object, no copy) or raises
  :class:`~tailguard.core.contract.errors.BadEvent` with reason ``bad_binary`` and a
  message naming what is wrong (version, flags, lengths, names that are not
  UTF-8, trailing or missing bytes). It raises nothing else for any bytes.
* :func:`encode` ∘ :func:`parse` is the identity on the values (float64
  round trip; ``NaN`` marks a missing size field).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tailguard.core.contract.errors import BadEvent

F64: TypeAlias = npt.NDArray[np.float64]

MAGIC: Final = b"\xf5TG"
VERSION: Final = 1
#: Every sample of the batch failed (the JSON form's batch-level ``"ok": false``).
FLAG_FAILED: Final = 0x01
#: Every sample of the batch is synthetic probe traffic (``"probe": true``).
FLAG_PROBE: Final = 0x02
#: Three more columns follow latency: input_tokens, output_tokens, ttft_us (NaN = absent).
FLAG_SIZED: Final = 0x04
#: A hardware name follows the model name.
FLAG_HARDWARE: Final = 0x08
#: An instance id (the reporting process) follows the hardware name.
FLAG_INSTANCE: Final = 0x10
_KNOWN_FLAGS: Final = FLAG_FAILED | FLAG_PROBE | FLAG_SIZED | FLAG_HARDWARE | FLAG_INSTANCE
#: magic, version, flags, reserved, len(node_id), len(model), len(hardware), len(instance),
#: samples.
HEADER: Final = struct.Struct("<3sBBBHHHHI")
_F64LE: Final = np.dtype("<f8")


@dataclass(frozen=True, slots=True, eq=False)
class BinaryBatch:
    """One binary batch as read: names, batch flags and float64 columns of ``n`` values."""

    node_id: str
    model: str
    hardware: str | None
    instance: str | None
    ok: bool
    probe: bool
    ts: F64
    latency_us: F64
    input_tokens: F64 | None
    output_tokens: F64 | None
    ttft_us: F64 | None


def is_binary(raw: object) -> bool:
    """True when ``raw`` is bytes in the binary form (starts with :data:`MAGIC`)."""
    return type(raw) is bytes and raw[:3] == MAGIC


def _bad(msg: str) -> BadEvent:
    return BadEvent("bad_binary", f"binary batch: {msg} (layout: docs/contracts-binary.md)")


def _text(raw: bytes, lo: int, n: int, what: str) -> str:
    try:
        return raw[lo:lo + n].decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{what} is not UTF-8") from None


def parse(raw: bytes) -> BinaryBatch:
    """Read the layout (module docstring); ``BadEvent("bad_binary")`` when it is broken."""
    if len(raw) < HEADER.size:
        raise _bad(f"{len(raw)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, flags, reserved, n_node, n_model, n_hw, n_inst, n = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise _bad("does not start with 0xF5 'T' 'G'")
    if version != VERSION:
        raise _bad(f"version {version} is not supported (this reader knows {VERSION})")
    if flags & ~_KNOWN_FLAGS or reserved:
        raise _bad(f"unknown flag bits {flags & ~_KNOWN_FLAGS:#04x} or reserved byte {reserved}")
    if not flags & FLAG_HARDWARE and n_hw:
        raise _bad("a hardware length without the hardware flag")
    if not flags & FLAG_INSTANCE and n_inst:
        raise _bad("an instance length without the instance flag")
    names_end = HEADER.size + n_node + n_model + n_hw + n_inst
    start = (names_end + 7) & ~7
    cols = 5 if flags & FLAG_SIZED else 2
    if len(raw) != start + 8 * cols * n:
        raise _bad(f"{len(raw)} bytes where the header announces {start + 8 * cols * n}"
                   f" ({n} samples of {cols} columns)")
    node = _text(raw, HEADER.size, n_node, "node_id")
    model = _text(raw, HEADER.size + n_node, n_model, "model")
    hw = _text(raw, HEADER.size + n_node + n_model, n_hw, "hardware") \
        if flags & FLAG_HARDWARE else None
    inst = _text(raw, HEADER.size + n_node + n_model + n_hw, n_inst, "instance") \
        if flags & FLAG_INSTANCE else None
    data = np.frombuffer(raw, dtype=_F64LE, count=cols * n, offset=start).reshape(cols, n)
    if not _F64LE.isnative:                     # a big-endian host: native order for numpy
        data = data.astype(np.float64)
    sized = bool(flags & FLAG_SIZED)
    return BinaryBatch(node, model, hw, inst, not flags & FLAG_FAILED, bool(flags & FLAG_PROBE),
                       data[0], data[1], data[2] if sized else None, data[3] if sized else None,
                       data[4] if sized else None)


def encode(node_id: str, model: str, hardware: str | None, ts: F64, latency_us: F64, *,
           ok: bool = True, probe: bool = False, input_tokens: F64 | None = None,
           output_tokens: F64 | None = None, ttft_us: F64 | None = None,
           instance: str | None = None) -> bytes:
    """The binary form of one batch (benchmarks, tests, producers that hold numpy arrays).

    Size columns are written when any of them is given (NaN where missing).
    """
    n = int(np.shape(ts)[0])
    sized = input_tokens is not None or output_tokens is not None or ttft_us is not None
    names = [node_id.encode(), model.encode(), b"" if hardware is None else hardware.encode(),
             b"" if instance is None else instance.encode()]
    flags = ((0 if ok else FLAG_FAILED) | (FLAG_PROBE if probe else 0)
             | (FLAG_SIZED if sized else 0) | (0 if hardware is None else FLAG_HARDWARE)
             | (0 if instance is None else FLAG_INSTANCE))
    head = HEADER.pack(MAGIC, VERSION, flags, 0, *map(len, names), n)
    body = head + b"".join(names)
    body += b"\0" * (-len(body) % 8)
    cols = [ts, latency_us]
    if sized:
        cols += [np.full(n, np.nan) if c is None else c
                 for c in (input_tokens, output_tokens, ttft_us)]
    return body + np.ascontiguousarray(np.stack(cols), dtype=_F64LE).tobytes()
