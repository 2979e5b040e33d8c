"""What the emitter puts on the wire: Kafka key and JSON value per message.

Owns the mapping from buffered samples to the latency-event contract
(ARCHITECTURE.md, "Latency event"); nothing else in :mod:`app.emitter` knows
the JSON layout. Guarantees:

* Samples go out in the contract's batch form,
  ``{"node_id", "model", "hardware"?, "samples": [[ts, latency_us], …]}``.
  A sample that carries any request-size field is written
  ``[ts, latency_us, input_tokens, output_tokens, ttft_us]`` with ``null``
  for the fields it lacks; a batch may mix both shapes.
* The batch form has no per-sample ``ok``/``probe``. Failed requests and
  probe samples are sent as *separate batches* with batch-level
  ``"ok": false`` and/or ``"probe": true`` (which
  :func:`app.core.events.decode` applies to every sample of that batch). So
  one flush of a series is up to four messages, one per (ok, probe) group;
  the ordinary group (ok, not probe) carries no flag at all.
* ``hardware`` is omitted when unknown (``None``), never sent as ``null``.
* Heartbeats are ``{"type": "heartbeat", "node_id", "model", "hardware"?, "ts"}``.
* The Kafka message key is ``node_id|model`` (UTF-8), so all messages of a
  series land on one partition, in order.
* Every message decodes with :func:`app.core.events.decode` (tested), as
  long as the sample values passed :func:`check_sample` (the emitter's
  ``record()`` calls it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, TypeAlias

import orjson

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


def encode_batches(series: SeriesKey, samples: Sequence[Sample]) -> list[tuple[bytes, list[Sample]]]:
    """Encode samples of one series as 1–4 batch messages, one per (ok, probe) group.

    Returns ``(value, samples_in_that_message)`` pairs; samples keep their
    order within each group.
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
        doc: dict[str, object] = {"node_id": node_id, "model": model}
        if hardware is not None:
            doc["hardware"] = hardware
        if not ok:
            doc["ok"] = False
        if probe:
            doc["probe"] = True
        doc["samples"] = [_row(s) for s in group]
        out.append((orjson.dumps(doc), group))
    return out


def encode_heartbeat(series: SeriesKey, ts: float) -> bytes:
    """Encode one heartbeat of ``series`` at event time ``ts``."""
    node_id, model, hardware = series
    doc: dict[str, object] = {"type": "heartbeat", "node_id": node_id, "model": model}
    if hardware is not None:
        doc["hardware"] = hardware
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


def _is_number(v: object) -> bool:
    return (type(v) is float or type(v) is int) and math.isfinite(v)


def check_sample(latency_us: object, ts: object, input_tokens: object, output_tokens: object,
                 ttft_us: object) -> None:
    """Raise ValueError unless the values satisfy the contract (bools are not numbers)."""
    if not _is_number(latency_us) or not latency_us > 0:  # type: ignore[operator]
        raise ValueError(f"latency_us must be a finite number > 0 (microseconds), got {latency_us!r}")
    if not _is_number(ts) or not ts >= 0:  # type: ignore[operator]
        raise ValueError(f"ts must be a finite number >= 0 (seconds since the epoch), got {ts!r}")
    for name, v in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_TOKENS):
            raise ValueError(f"{name} must be None or an int in [0, {MAX_TOKENS}], got {v!r}")
    if ttft_us is not None and (not _is_number(ttft_us)
                                or not 0 <= ttft_us <= latency_us):  # type: ignore[operator]
        raise ValueError(f"ttft_us must be None or a number in [0, latency_us={latency_us!r}],"
                         f" got {ttft_us!r}")
