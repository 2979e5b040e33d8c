"""The summary batch: many window summaries of one model in one ``node-window-stats`` message.

Owns the byte layout of docs/contracts.md ("Summary batch", version 1): a header, the
names as JSON (model, node ids, the distinct signals and hardware names), the non-empty
``extra`` dicts as JSON, then one little-endian numpy row (:data:`ROW`) per summary. Stage 1
sends a tick's summaries this way (:func:`encode_by_model`); stage 2 unpacks them
(:func:`decode_batch`, through ``tailguard.streaming.wire.decode_stage2``).

Guarantees:

* A batch starts with :data:`MAGIC` (``0xF5 'T' 'S'``): ``0xF5`` never occurs in UTF-8
  text, so it is never read as JSON, nor a JSON message as a batch.
* :func:`encode_batches` ∘ :func:`decode_batch` is the identity on every summary whose
  numbers are finite (a missing number, and a NaN, decode as None), in order.
* Every message :func:`encode_batches` returns is at most ``max_bytes`` (unless one
  summary alone is larger) and holds at most ``max_rows`` summaries.
* :func:`decode_batch` raises :class:`~tailguard.core.contract.errors.BadEvent` with reason
  ``bad_batch`` (never anything else) for any bytes that are not such a batch, and repairs
  the optional fields as ``WindowSummary.from_dict`` does (a bad fresh count → none).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.types import WindowSummary

MAGIC: Final = b"\xf5TS"
VERSION: Final = 1
#: magic, version, flags, reserved, rows, bytes of the names JSON, bytes of the extras JSON.
HEADER: Final = struct.Struct("<3sBBBIII")
#: Summaries per message at most, and bytes per message (well under Kafka's 1 MB default).
MAX_ROWS: Final = 2000
MAX_BYTES: Final = 512 * 1024
MAX_NAME_CHARS: Final = 256

_FLOATS: Final = ("tick_ts", "p50", "p99", "latency_p50_us", "latency_p99_us", "first_seen_ts",
                  "last_seen_ts", "probe_p50", "probe_p99", "fresh_p50", "instance_ts",
                  "resumed_ts")
_INTS: Final = ("samples", "failed", "probe_samples", "fresh_samples", "requests_total",
                "failed_total", "fresh_over")
#: One summary's numbers: float64 (NaN = none), int64 (``fresh_over`` -1 = none), and the
#: indexes of its signal and hardware name in the names (hardware -1 = none).
ROW: Final = np.dtype([*((f, "<f8") for f in _FLOATS), *((f, "<i8") for f in _INTS),
                       ("signal", "<i4"), ("hardware", "<i4")])
_FIELD_AT: Final = {f: i for i, f in enumerate(WindowSummary._fields)}


@dataclass(frozen=True, slots=True)
class SummaryBatch:
    """The summaries of one decoded batch (all of ``model``), in the order they were sent."""

    model: str
    summaries: tuple[WindowSummary, ...]


def _index(values: Sequence[str | None]) -> tuple[list[str], list[int]]:
    """The distinct non-None values in order of first appearance, and each value's index
    among them (-1: None)."""
    names = [v for v in dict.fromkeys(values) if v is not None]
    at: dict[str | None, int] = {v: i for i, v in enumerate(names)}
    at[None] = -1
    return names, list(map(at.__getitem__, values))


def _encode(model: str, rows: Sequence[WindowSummary]) -> bytes:
    cols = list(zip(*rows, strict=True))
    arr = np.empty(len(rows), dtype=ROW)
    for f in _FLOATS:
        arr[f] = np.array(cols[_FIELD_AT[f]], dtype=np.float64)
    for f in _INTS:
        col = cols[_FIELD_AT[f]]
        arr[f] = np.array([-1 if v is None else v for v in col] if f == "fresh_over" else col,
                          dtype=np.int64)
    signals, arr["signal"] = _index(cols[_FIELD_AT["signal"]])
    hardware, arr["hardware"] = _index(cols[_FIELD_AT["hardware"]])
    names = orjson.dumps({"model": model, "nodes": cols[_FIELD_AT["node_id"]],
                          "signals": signals, "hardware": hardware})
    extras = [[i, dict(x)] for i, x in enumerate(cols[_FIELD_AT["extra"]]) if x]
    extra = orjson.dumps(extras, option=orjson.OPT_SERIALIZE_NUMPY) if extras else b""
    head = HEADER.pack(MAGIC, VERSION, 0, 0, len(rows), len(names), len(extra))
    pad = b"\0" * (-(len(head) + len(names) + len(extra)) % 8)
    return b"".join((head, names, extra, pad, arr.tobytes()))


def encode_batches(model: str, summaries: Sequence[WindowSummary], *, max_rows: int = MAX_ROWS,
                   max_bytes: int = MAX_BYTES) -> list[bytes]:
    """``summaries`` (all of ``model``) as batch messages, in order (module docstring)."""
    out: list[bytes] = []
    todo = [summaries[i:i + max_rows] for i in range(0, len(summaries), max_rows)]
    todo.reverse()
    while todo:
        rows = todo.pop()
        raw = _encode(model, rows)
        if len(raw) > max_bytes and len(rows) > 1:   # large extras: split in halves
            half = len(rows) // 2
            todo += [rows[half:], rows[:half]]
            continue
        out.append(raw)
    return out


def encode_by_model(summaries: Sequence[WindowSummary]) -> list[tuple[str, bytes]]:
    """``(model, message)`` for every batch of ``summaries``, each model's in their order."""
    by_model: dict[str, list[WindowSummary]] = {}
    for s in summaries:
        by_model.setdefault(s.model, []).append(s)
    return [(model, raw) for model, rows in by_model.items() for raw in encode_batches(model, rows)]


def _bad(what: str) -> BadEvent:
    return BadEvent("bad_batch", f"summary batch: {what}")


def _names(raw: bytes, n: int) -> tuple[str, list[str], list[str], list[str]]:
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise _bad(f"the names are not JSON ({e})") from None
    if not isinstance(d, dict):
        raise _bad("the names are not a JSON object")
    model, nodes, signals, hardware = (d.get(k) for k in ("model", "nodes", "signals", "hardware"))
    if not isinstance(model, str) or not 0 < len(model) <= MAX_NAME_CHARS:
        raise _bad(f"model must be a non-empty string of at most {MAX_NAME_CHARS} chars")
    for what, v in (("nodes", nodes), ("signals", signals), ("hardware", hardware)):
        if not isinstance(v, list) or not all(type(x) is str and 0 < len(x) <= MAX_NAME_CHARS
                                               for x in v):
            raise _bad(f"{what} must be a list of non-empty strings of at most "
                       f"{MAX_NAME_CHARS} chars")
    assert isinstance(nodes, list) and isinstance(signals, list) and isinstance(hardware, list)
    if len(nodes) != n:
        raise _bad(f"{len(nodes)} node ids for {n} rows")
    return model, nodes, signals, hardware


def _extras(raw: bytes, n: int) -> dict[int, dict[str, Any]]:
    if not raw:
        return {}
    try:
        pairs = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise _bad(f"the extras are not JSON ({e})") from None
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and type(p[0]) is int and 0 <= p[0] < n
            and isinstance(p[1], dict) for p in pairs):
        raise _bad("the extras must be a list of [row, object] pairs")
    return {i: x for i, x in pairs}


def _repair(arr: np.ndarray[Any, Any]) -> None:
    """What ``WindowSummary.from_dict`` repairs, on every row at once (in place)."""
    fresh_p50 = arr["fresh_p50"]
    bad = (arr["fresh_samples"] < 0) | ~(np.isnan(fresh_p50) | (np.isfinite(fresh_p50)
                                                              & (fresh_p50 > 0)))
    arr["fresh_samples"][bad] = 0
    arr["fresh_p50"][bad] = np.nan
    for f in _FLOATS[1:]:       # an infinite number is as good as none
        col = arr[f]
        col[np.isinf(col)] = np.nan
    over = arr["fresh_over"]
    over[(over < -1) | (over > arr["fresh_samples"])] = -1
    req, failed = arr["requests_total"], arr["failed_total"]
    bad = (failed < 0) | (failed > req)
    req[bad] = 0
    failed[bad] = 0


def _none_for_nan(values: list[float]) -> list[float | None]:
    return [None if x != x else x for x in values]


def decode_batch(raw: bytes) -> SummaryBatch:
    """The summaries of one batch message (module docstring); BadEvent ``bad_batch`` if broken."""
    if len(raw) < HEADER.size or raw[:3] != MAGIC:
        raise _bad("too short or no magic")
    _magic, version, flags, reserved, n, n_names, n_extra = HEADER.unpack_from(raw)
    if version != VERSION or flags or reserved:
        raise _bad(f"version {version}, flags {flags}, reserved {reserved}: this worker reads "
                   f"version {VERSION} with flags and reserved 0 (a newer stage 1?)")
    start = HEADER.size + n_names + n_extra
    start += -start % 8
    if len(raw) != start + n * ROW.itemsize:
        raise _bad(f"{len(raw)} bytes, {start + n * ROW.itemsize} expected for {n} rows")
    model, nodes, signals, hardware = _names(raw[HEADER.size:HEADER.size + n_names], n)
    extras = _extras(raw[HEADER.size + n_names:HEADER.size + n_names + n_extra], n)
    arr = np.frombuffer(raw, dtype=ROW, count=n, offset=start).copy()
    if not np.isfinite(arr["tick_ts"]).all():
        raise _bad("a tick_ts is not a finite number")
    sig, hw = arr["signal"], arr["hardware"]
    if n and (sig.min() < 0 or sig.max() >= len(signals) or hw.min() < -1
              or hw.max() >= len(hardware)):
        raise _bad("a signal or hardware index is out of range")
    _repair(arr)
    col: dict[str, list[Any]] = {f: _none_for_nan(arr[f].tolist()) for f in _FLOATS[1:]}
    col["tick_ts"] = arr["tick_ts"].tolist()
    for f in _INTS:
        col[f] = arr[f].tolist()
    col["fresh_over"] = [None if x < 0 else x for x in col["fresh_over"]]
    col["signal"] = [signals[i] for i in sig.tolist()]
    col["hardware"] = [None if i < 0 else hardware[i] for i in hw.tolist()]
    col["node_id"] = nodes
    col["model"] = [model] * n
    no_extra = WindowSummary._field_defaults["extra"]
    col["extra"] = [extras.get(i, no_extra) for i in range(n)] if extras else [no_extra] * n
    make = WindowSummary._make
    rows = tuple(make(r) for r in zip(*(col[f] for f in WindowSummary._fields), strict=True))
    return SummaryBatch(model, rows)
