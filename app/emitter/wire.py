"""What the emitter puts on the wire: Kafka key and value (binary or JSON) per message.

Owns the mapping from buffered samples to the latency-event contract (ARCHITECTURE.md,
"Latency event"); nothing else in :mod:`tailguard.emitter` knows the layout. Guarantees:

* Samples go out in the contract's batch form: by default its binary layout
  (docs/contracts-binary.md; written with the standard library, so no numpy), or with
  ``fmt="json"`` ``{"node_id", "model", "hardware"?, "samples": [[ts, latency_us], …]}``, a
  sample with any request-size field as ``[ts, latency_us, input_tokens, output_tokens,
  ttft_us]`` (``null`` for what it lacks; the binary form: NaN).
* Failed requests and probe samples go as *separate batches* with batch-level ``"ok": false``
  and/or ``"probe": true``: one flush of a series is up to four messages, one per (ok, probe)
  group; the ordinary group carries no flag.
* ``hardware`` is omitted when unknown, never ``null``. Heartbeats are ``{"type":
  "heartbeat", "node_id", "model", "hardware"?, "ts"}``. Every message carries the emitter's
  ``instance`` (random per process start) when given.
* The Kafka key is ``node_id|model`` (UTF-8): a series stays on one partition, in order.
* Every message decodes with :func:`tailguard.core.contract.events.decode` (tested) when the
  sample values came through :func:`sample_values` (``record()`` calls it).
"""

from __future__ import annotations

import math
import numbers
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any, Final, Literal, TypeAlias

import orjson

#: What :func:`encode_batches` writes: the binary batch layout or the JSON batch form.
WireFormat: TypeAlias = Literal["binary", "json"]
WIRE_FORMATS: Final = ("binary", "json")

# A buffered sample: (seq, t_in, ts, latency_us, input_tokens, output_tokens, ttft_us, ok, probe).
# ``seq`` orders samples across series (drop-oldest); ``t_in`` is the monotonic
# time it was buffered (linger). A plain tuple: record() is on the request path.
Sample: TypeAlias = tuple[int, float, float, float, int | None, int | None, float | None, bool, bool]
SEQ: Final = 0
T_IN: Final = 1

# A series: (node_id, model, hardware). One buffer, one set of batches, per series.
SeriesKey: TypeAlias = tuple[str, str, str | None]

MAX_NAME_CHARS: Final = 256      # the contract's bound on node_id / model / hardware
MAX_TOKENS: Final = 10_000_000   # the decoder's bound on a token count


def message_key(series: SeriesKey) -> bytes:
    """Kafka key of a series: ``node_id|model``."""
    return f"{series[0]}|{series[1]}".encode()


def _row(s: Sample) -> list[float | int | None]:
    if s[4] is None and s[5] is None and s[6] is None:
        return [s[2], s[3]]
    return [s[2], s[3], s[4], s[5], s[6]]


# The binary layout (docs/contracts-binary.md; tailguard.core.contract.binary reads it): magic, version,
# flags, reserved, four name lengths, sample count; names; zero padding to 8; columns.
_BIN_HEADER: Final = struct.Struct("<3sBBBHHHHI")
_BIN_MAGIC: Final = b"\xf5TG"
_BIN_FAILED, _BIN_PROBE, _BIN_SIZED, _BIN_HARDWARE, _BIN_INSTANCE = 0x01, 0x02, 0x04, 0x08, 0x10
_NAN: Final = math.nan


def _column(values: list[float]) -> bytes:
    col = array("d", values)
    if sys.byteorder != "little":  # pragma: no cover - the layout is little-endian
        col.byteswap()
    return col.tobytes()


def encode_binary(series: SeriesKey, group: Sequence[Sample], *, ok: bool, probe: bool,
                  instance: str | None = None) -> bytes:
    """One binary batch of ``group`` (samples of one (ok, probe) group, in order)."""
    node_id, model, hardware = series
    sized = any(s[4] is not None or s[5] is not None or s[6] is not None for s in group)
    names = [node_id.encode(), model.encode(), b"" if hardware is None else hardware.encode(),
             b"" if instance is None else instance.encode()]
    flags = ((0 if ok else _BIN_FAILED) | (_BIN_PROBE if probe else 0)
             | (_BIN_SIZED if sized else 0) | (0 if hardware is None else _BIN_HARDWARE)
             | (0 if instance is None else _BIN_INSTANCE))
    head = _BIN_HEADER.pack(_BIN_MAGIC, 1, flags, 0, *map(len, names), len(group))
    parts = [head, *names]
    size = len(head) + sum(len(n) for n in names)
    parts.append(b"\0" * (-size % 8))
    parts.append(_column([s[2] for s in group]))
    parts.append(_column([s[3] for s in group]))
    if sized:
        for i in (4, 5, 6):
            parts.append(_column([_NAN if s[i] is None else s[i] for s in group]))  # type: ignore[misc]
    return b"".join(parts)


def encode_batches(series: SeriesKey, samples: Sequence[Sample], instance: str | None = None,
                   fmt: WireFormat = "json") -> list[tuple[bytes, list[Sample]]]:
    """Encode samples of one series as 1–4 batch messages, one per (ok, probe) group.

    ``instance``: the sending process's id (a new one tells tailguard the node restarted).

    Returns ``(value, samples_in_that_message)`` pairs; samples keep their
    order within each group. ``fmt``: ``"json"`` (the JSON batch form) or
    ``"binary"`` (:func:`encode_binary`).
    """
    groups: dict[tuple[bool, bool], list[Sample]] = {}
    for s in samples:
        flags = (s[7], s[8])
        g = groups.get(flags)
        if g is None:
            groups[flags] = [s]
        else:
            g.append(s)
    node_id, model, hardware = series
    out: list[tuple[bytes, list[Sample]]] = []
    for (ok, probe), group in groups.items():
        if fmt == "binary":
            out.append((encode_binary(series, group, ok=ok, probe=probe, instance=instance),
                        group))
            continue
        doc: dict[str, object] = {"node_id": node_id, "model": model}
        if hardware is not None:
            doc["hardware"] = hardware
        if instance is not None:
            doc["instance"] = instance
        if not ok:
            doc["ok"] = False
        if probe:
            doc["probe"] = True
        doc["samples"] = [_row(s) for s in group]
        out.append((orjson.dumps(doc), group))
    return out


def encode_heartbeat(series: SeriesKey, ts: float, instance: str | None = None) -> bytes:
    """Encode one heartbeat of ``series`` at event time ``ts``."""
    node_id, model, hardware = series
    doc: dict[str, object] = {"type": "heartbeat", "node_id": node_id, "model": model}
    if hardware is not None:
        doc["hardware"] = hardware
    if instance is not None:
        doc["instance"] = instance
    doc["ts"] = ts
    return orjson.dumps(doc)


def check_series(node_id: object, model: object, hardware: object) -> None:
    """Raise ValueError unless the names satisfy the contract."""
    for name, value in (("node_id", node_id), ("model", model)):
        if type(value) is not str or not 0 < len(value) <= MAX_NAME_CHARS:
            raise ValueError(f"{name} must be a non-empty string of at most {MAX_NAME_CHARS}"
                             f" characters, got {value!r:.80}")
    if hardware is not None and (type(hardware) is not str or len(hardware) > MAX_NAME_CHARS):
        raise ValueError(f"hardware must be None or a string of at most {MAX_NAME_CHARS}"
                         f" characters, got {hardware!r:.80}")


_INF: Final = math.inf


def sample_values(latency_us: Any, ts: Any, input_tokens: Any, output_tokens: Any,
                  ttft_us: Any) -> tuple[float, float, int | None, int | None, float | None]:
    """Validate one sample's values; return them as plain int/float (numpy scalars are converted).

    Raises ValueError on anything the decoder would reject (bools are not numbers).
    The common case — plain ``int``/``float`` values, no size fields — costs a
    handful of comparisons: this runs on the request path.
    """
    t = type(latency_us)
    if (t is float or t is int) and 0 < latency_us < _INF:
        t = type(ts)
        if (t is float or t is int) and 0 <= ts < _INF:
            if input_tokens is None and output_tokens is None and ttft_us is None:
                return latency_us, ts, None, None, None
            if ((input_tokens is None or (type(input_tokens) is int and 0 <= input_tokens <= MAX_TOKENS))
                    and (output_tokens is None or (type(output_tokens) is int and 0 <= output_tokens <= MAX_TOKENS))
                    and (ttft_us is None or ((type(ttft_us) is float or type(ttft_us) is int)
                                             and 0 <= ttft_us <= latency_us))):
                return latency_us, ts, input_tokens, output_tokens, ttft_us
    return _slow_sample_values(latency_us, ts, input_tokens, output_tokens, ttft_us)


def _real(name: str, v: Any, what: str) -> float:
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        f = float(v)
        if math.isfinite(f):
            return f
    raise ValueError(f"{name} must be {what}, got {v!r:.80}")


def _count(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and 0 <= (n := int(v)) <= MAX_TOKENS:
        return n
    raise ValueError(f"{name} must be None or an int in [0, {MAX_TOKENS}], got {v!r:.80}")


def _slow_sample_values(latency_us: Any, ts: Any, input_tokens: Any, output_tokens: Any,
                        ttft_us: Any) -> tuple[float, float, int | None, int | None, float | None]:
    what = "a finite number > 0 (microseconds)"
    lat = _real("latency_us", latency_us, what)
    if not lat > 0:
        raise ValueError(f"latency_us must be {what}, got {latency_us!r:.80}")
    what = "a finite number >= 0 (seconds since the epoch)"
    ts_s = _real("ts", ts, what)
    if not ts_s >= 0:
        raise ValueError(f"ts must be {what}, got {ts!r:.80}")
    ttft: float | None = None
    if ttft_us is not None:
        what = f"None or a number in [0, latency_us={lat!r}]"
        ttft = _real("ttft_us", ttft_us, what)
        if not 0 <= ttft <= lat:
            raise ValueError(f"ttft_us must be {what}, got {ttft_us!r:.80}")
    return lat, ts_s, _count("input_tokens", input_tokens), _count("output_tokens", output_tokens), ttft
