"""Latency events: decode and validate the contract's JSON (ARCHITECTURE.md).

Owns the boundary between untrusted bytes and the detector (one concept: the contract's
forms and their validation, kept together so no form drifts from the others). :func:`decode`
takes one message — a single event or a batch (JSON or binary) → :class:`SampleBatch`, a
heartbeat → :class:`Heartbeat` — and :func:`parse_event` one decoded JSON value. The field
rules are in docs/contracts.md, the binary layout in docs/contracts-binary.md.

Guarantees:

* Bad input raises :class:`~tailguard.core.contract.errors.BadEvent` with a ``reason`` slug from
  :data:`REASONS` and a message naming the field; nothing else is raised for any bytes.
* Every value in a returned batch meets the contract (limits from ``settings``, ids by the
  rule of :mod:`tailguard.core.contract.ids`); ``true``/``false`` are never numbers, unknown keys are ignored.
* A batch whose header is bad is rejected whole; otherwise bad samples are dropped and
  counted in :attr:`SampleBatch.rejected`, and a batch with no good sample raises.
* The msgspec fast paths (:mod:`tailguard.core.contract.events_fast`) give the same values, drops and
  errors as the general path here (tested). Grouping messages into one batch per series is
  :mod:`tailguard.core.window.accumulate`'s job.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tailguard.core.contract import binary, events_fast, ids
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events_fast import FastDecoder, Group, Row
from tailguard.core.contract.fields import (
    MAX_TOKENS,
    MAX_TS_S,
    flag_field,
    is_num,
    latency_error,
    name_field,
    sample_error,
    text_field,
    tokens_field,
    ts_error,
)
from tailguard.core.contract.hist_event import HistogramBatch, parse_histogram
from tailguard.core.contract.ids import MAX_NAME_CHARS, IdRule

FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

DEFAULT_SETTINGS: Final = DetectorSettings()
MAX_BATCH_SAMPLES: Final = 100_000

REASONS: Final = (
    "bad_json",       # not JSON (or NaN/Infinity literals, or invalid UTF-8)
    "not_object",     # JSON, but not an object
    "unknown_form",   # an object with an unknown "type"
    "missing_field",  # a required field is absent or null
    "empty_field",    # node_id/model is ""
    "too_long",       # hardware/instance above 256 chars, or a batch above MAX_BATCH_SAMPLES samples
    "bad_node_id",    # node_id breaks the id rule (tailguard.core.contract.ids; TAILGUARD_ID_PATTERN)
    "bad_model",      # model breaks the id rule
    "not_allowlisted",  # node_id not on the allowlist (accumulate.Accumulator(allow=…))
    "bad_type",       # node_id/model/hardware not a string, ok/probe not a bool
    "bad_latency",    # latency_us not a finite number in (0, max_latency_us]
    "bad_ts",         # ts not a finite number >= 0
    "future_ts",      # ts more than max_future_skew_s after now_s
    "bad_tokens",     # input_tokens/output_tokens not an integer in [0, 1e7]
    "bad_ttft",       # ttft_us not a number in [0, latency_us]
    "bad_batch",      # "samples" is not a list
    "empty_batch",    # "samples" is []
    "bad_sample",     # a sample is not a list of 2 or 5 numbers
    "bad_binary",     # starts like a binary batch (0xF5 'T' 'G') but its layout is broken
    "bad_histogram",  # a histogram event's bounds_s/counts/sum_s/requests/failed break the form
    "bad_metric",     # a histogram event's metric is not e2e, ttft or itl
    "bad_interval",   # a histogram event's interval_s is not a number in (0, 86400]
)

_INF: Final = math.inf
_NAN: Final = math.nan


def _std_loads() -> Callable[[bytes | str], Any]:
    import json

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    def loads(raw: bytes | str) -> Any:
        return json.loads(raw, parse_constant=reject_constant)

    return loads


def _fast_loads() -> Callable[[bytes | str], Any]:
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a declared dependency
        return _std_loads()
    return orjson.loads


json_loads: Callable[[bytes | str], Any] = _fast_loads()


FAST_DECODER: FastDecoder | None = events_fast.build(MAX_NAME_CHARS, MAX_TOKENS, MAX_BATCH_SAMPLES)
_MAGIC: Final = binary.MAGIC


@dataclass(frozen=True, slots=True, eq=False)
class SampleBatch:
    """Requests of one (node_id, model) in arrival order.

    Arrays have one entry per kept sample. ``input_tokens``/``output_tokens``/
    ``ttft_us`` are NaN where a sample lacks the field and ``None`` when no
    sample has it. ``rejected`` counts the samples of the message dropped as
    invalid (batch form only).
    """

    node_id: str
    model: str
    hardware: str | None
    ts: FloatArray
    latency_us: FloatArray
    ok: BoolArray
    probe: BoolArray
    input_tokens: FloatArray | None = None
    output_tokens: FloatArray | None = None
    ttft_us: FloatArray | None = None
    rejected: int = 0
    instance: str | None = None
    #: Sample counts of the messages this batch joins, in order (empty: one message). A
    #: window store counts signs of life per message (``WindowStore.observe``).
    parts: tuple[int, ...] = ()

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def key(self) -> tuple[str, str]:
        return (self.node_id, self.model)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A node announcing that it serves ``model`` and is alive at ``ts``."""

    node_id: str
    model: str
    hardware: str | None
    ts: float
    instance: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.node_id, self.model)


Event: TypeAlias = SampleBatch | Heartbeat | HistogramBatch




def future_limit(now_s: float | None, settings: DetectorSettings) -> float:
    return MAX_TS_S if now_s is None else min(MAX_TS_S, now_s + settings.max_future_skew_s)


def single_row(d: Mapping[str, Any], fut_limit: float, max_lat: float,
            now_s: float | None, rule: IdRule) -> tuple[Group, Row]:
    node = d.get("node_id")
    if type(node) is not str or not rule.ok(node):
        node = name_field(d, "node_id", rule)
    model = d.get("model")
    if type(model) is not str or not rule.ok(model):
        model = name_field(d, "model", rule)
    lat = d.get("latency_us")
    if (type(lat) is not float and type(lat) is not int) or not 0 < lat <= max_lat:
        raise latency_error(lat, max_lat)
    ts = d.get("ts")
    if (type(ts) is not float and type(ts) is not int) or not 0 <= ts <= fut_limit or ts == _INF:
        raise ts_error(ts, fut_limit, now_s)
    hw = d.get("hardware")
    if hw is not None and (type(hw) is not str or len(hw) > MAX_NAME_CHARS):
        hw = text_field(d)
    inst = d.get("instance")
    if inst is not None and (type(inst) is not str or len(inst) > MAX_NAME_CHARS):
        inst = text_field(d, "instance")
    ok = d.get("ok", True)
    if type(ok) is not bool:
        ok = flag_field(d, "ok", True)
    probe = d.get("probe", False)
    if type(probe) is not bool:
        probe = flag_field(d, "probe", False)
    inp = d.get("input_tokens")
    out = d.get("output_tokens")
    ttft = d.get("ttft_us")
    if inp is None and out is None and ttft is None:
        return (node, model, hw, inst), (float(ts), float(lat), ok, probe, _NAN, _NAN, _NAN)
    if inp is None:
        inp = _NAN
    elif type(inp) is int and 0 <= inp <= MAX_TOKENS:
        inp = float(inp)
    else:
        inp = tokens_field(d, "input_tokens")
    if out is None:
        out = _NAN
    elif type(out) is int and 0 <= out <= MAX_TOKENS:
        out = float(out)
    else:
        out = tokens_field(d, "output_tokens")
    if ttft is None:
        ttft = _NAN
    elif (type(ttft) is not float and type(ttft) is not int) or not 0 <= ttft <= lat:
        raise BadEvent("bad_ttft", f"ttft_us must be a number in [0, latency_us={lat!r}],"
                       f" got {ttft!r:.40}", field="ttft_us")
    return (node, model, hw, inst), (float(ts), float(lat), ok, probe, inp, out, float(ttft))


# ---------------------------------------------------------------- batches

_NONE3: Final = [None, None, None]


def _batch(d: Mapping[str, Any], fut_limit: float, max_lat: float,
           now_s: float | None, rule: IdRule) -> SampleBatch:
    node = name_field(d, "node_id", rule)
    model = name_field(d, "model", rule)
    hw = text_field(d)
    ok = flag_field(d, "ok", True)
    probe = flag_field(d, "probe", False)
    samples = d.get("samples")
    if type(samples) is not list:
        raise BadEvent("bad_batch", f"samples must be a list of [ts, latency_us] lists, got"
                       f" {type(samples).__name__}", field="samples")
    if not samples:
        raise BadEvent("empty_batch", "samples is empty; send a heartbeat instead",
                       field="samples")
    if len(samples) > MAX_BATCH_SAMPLES:
        raise BadEvent("too_long", f"samples has {len(samples)} entries; at most"
                       f" {MAX_BATCH_SAMPLES} per message", field="samples")
    rows: list[list[Any]] = []
    sized = False
    first: BadEvent | None = None
    for i, s in enumerate(samples):
        if type(s) is list:
            n = len(s)
            if n == 2:
                if is_num(s[0]) and is_num(s[1]):
                    rows.append(s + _NONE3)
                    continue
            elif n == 5 and is_num(s[0]) and is_num(s[1]) \
                    and all(v is None or is_num(v) for v in s[2:]):
                rows.append(s)
                sized = True
                continue
        if first is None:
            first = BadEvent("bad_sample", f"samples[{i}] must be [ts, latency_us] or [ts,"
                             f" latency_us, input_tokens, output_tokens, ttft_us] of numbers,"
                             f" got {s!r:.60}", field="samples")
    arr = _to_array(rows)
    cols = (arr[:, 2], arr[:, 3], arr[:, 4]) if sized else None
    batch = _checked(node, model, hw, ok, probe, arr[:, 0], arr[:, 1], cols, len(samples), first,
                     rows.__getitem__, fut_limit, max_lat, now_s)
    inst = text_field(d, "instance")           # checked after the samples, as it always was
    return batch if inst is None else dataclasses.replace(batch, instance=inst)


def _checked(node: str, model: str, hw: str | None, ok: bool, probe: bool, ts: FloatArray,
             lat: FloatArray, sizes: tuple[FloatArray, FloatArray, FloatArray] | None,
             n_total: int, first: BadEvent | None, row_at: Callable[[int], Sequence[Any]],
             fut_limit: float, max_lat: float, now_s: float | None,
             instance: str | None = None) -> SampleBatch:
    """The batch policy over validated headers and float columns (module docstring).

    ``sizes``: input_tokens, output_tokens, ttft_us (NaN = absent), or None when
    no sample carries them; ``n_total`` counts the message's samples including
    those already refused (``first``: the first refusal); ``row_at(j)`` gives
    sample ``j``'s five values for the error message of a batch with no good sample.
    """
    if sizes is None and first is None and n_total == ts.shape[0] and ts.shape[0] \
            and lat.min() > 0 and lat.max() <= max_lat and ts.min() >= 0 \
            and (ts_hi := ts.max()) <= fut_limit and ts_hi < _INF:
        # Every sample good (NaN fails a comparison): no masks needed.
        n = ts.shape[0]
        return SampleBatch(node, model, hw, np.ascontiguousarray(ts), np.ascontiguousarray(lat),
                           np.full(n, ok, dtype=bool), np.full(n, probe, dtype=bool),
                           instance=instance)
    with np.errstate(invalid="ignore"):
        good = (lat > 0) & (lat <= max_lat)
        ts_ok = (ts >= 0) & (ts <= fut_limit) & (ts < _INF)
        keep = good & ts_ok
        tok_ok = ttft_ok = None
        if sizes is not None:
            inp, out, ttft = sizes
            tok_ok = np.ones(ts.shape[0], dtype=bool)
            for col in (inp, out):
                tok_ok &= np.isnan(col) | ((col >= 0) & (col <= MAX_TOKENS) & (col == np.floor(col)))
            ttft_ok = np.isnan(ttft) | ((ttft >= 0) & (ttft <= lat))
            keep &= tok_ok & ttft_ok
    n_keep = int(np.count_nonzero(keep))
    rejected = n_total - n_keep
    if n_keep == 0:
        if first is not None:
            raise first
        j = int(np.argmin(keep))
        raise sample_error(row_at(j), j, bool(good[j]), bool(ts_ok[j]),
                            True if tok_ok is None else bool(tok_ok[j]),
                            fut_limit, max_lat, now_s)
    if n_keep < ts.shape[0]:
        ts, lat = ts[keep], lat[keep]
        if sizes is not None:
            sizes = (sizes[0][keep], sizes[1][keep], sizes[2][keep])
    return SampleBatch(node, model, hw, np.ascontiguousarray(ts), np.ascontiguousarray(lat),
                       np.full(n_keep, ok, dtype=bool), np.full(n_keep, probe, dtype=bool),
                       None if sizes is None else size_column(sizes[0]),
                       None if sizes is None else size_column(sizes[1]),
                       None if sizes is None else size_column(sizes[2]),
                       rejected=rejected, instance=instance)


def _typed_batch(fast: FastDecoder, raw: bytes, fut_limit: float, max_lat: float,
                 now_s: float | None, rule: IdRule) -> SampleBatch | None:
    """A JSON batch by msgspec (module docstring); None when the general path must decide."""
    got = fast.batch(raw)
    if got is None:
        return None
    b, arr = got
    if not (rule.ok(b.node_id) and rule.ok(b.model)):
        return None
    try:
        return _checked(b.node_id, b.model, b.hardware, b.ok, b.probe, arr[0], arr[1],
                        (arr[2], arr[3], arr[4]) if arr.shape[0] == 5 else None,
                        len(b.samples), None, b.samples.__getitem__, fut_limit, max_lat, now_s,
                        b.instance)
    except BadEvent:    # no good sample: the general path words the error from the JSON
        return None


def _binary_batch(raw: bytes, fut_limit: float, max_lat: float,
                  now_s: float | None, rule: IdRule) -> SampleBatch:
    b = binary.parse(raw)
    for key, v in (("node_id", b.node_id), ("model", b.model)):
        if not rule.ok(v):
            name_field({key: v}, key, rule)
    for key, opt in (("hardware", b.hardware), ("instance", b.instance)):
        if opt is not None and len(opt) > MAX_NAME_CHARS:
            text_field({key: opt}, key)
    n = int(b.ts.shape[0])
    if n == 0:
        raise BadEvent("empty_batch", "the binary batch has no samples; send a heartbeat instead",
                       field="samples")
    if n > MAX_BATCH_SAMPLES:
        raise BadEvent("too_long", f"the binary batch has {n} samples; at most"
                       f" {MAX_BATCH_SAMPLES} per message", field="samples")
    sizes = None
    if b.input_tokens is not None and b.output_tokens is not None and b.ttft_us is not None:
        sizes = (b.input_tokens, b.output_tokens, b.ttft_us)
    cols = [b.ts, b.latency_us, *(sizes or ())]

    def row_at(j: int) -> list[float | None]:
        vals: list[float | None] = [float(c[j]) for c in cols]
        return [*vals, None, None, None][:5]

    return _checked(b.node_id, b.model, b.hardware, b.ok, b.probe, b.ts, b.latency_us, sizes, n,
                    None, row_at, fut_limit, max_lat, now_s, b.instance)


def size_column(col: FloatArray) -> FloatArray | None:
    if np.isnan(col).all():
        return None
    return np.ascontiguousarray(col)


def _to_array(rows: list[list[Any]]) -> FloatArray:
    try:
        return np.array(rows, dtype=np.float64).reshape(len(rows), 5)
    except OverflowError:
        def safe(v: Any) -> float:
            try:
                return _NAN if v is None else float(v)
            except OverflowError:
                return _INF
        return np.array([[safe(v) for v in r] for r in rows], dtype=np.float64).reshape(-1, 5)


def _heartbeat(d: Mapping[str, Any], fut_limit: float, now_s: float | None,
               rule: IdRule) -> Heartbeat:
    node = name_field(d, "node_id", rule)
    model = name_field(d, "model", rule)
    hw = text_field(d)
    ts: Any = d.get("ts")
    if not is_num(ts) or not 0 <= ts <= fut_limit or ts == _INF:
        raise ts_error(ts, fut_limit, now_s)
    return Heartbeat(node, model, hw, float(ts), text_field(d, "instance"))


def _histogram(d: Mapping[str, Any], fut_limit: float, now_s: float | None,
               rule: IdRule) -> HistogramBatch:
    hb = _heartbeat(d, fut_limit, now_s, rule)      # the fields every form shares
    return parse_histogram(d, hb.node_id, hb.model, hb.hardware, hb.ts, hb.instance)


# ---------------------------------------------------------------- public API

def batch_of_row(row: Row, group: Group) -> SampleBatch:
    node, model, hw, inst = group
    ts, lat, ok, probe, inp, out, ttft = row
    return SampleBatch(
        node, model, hw, np.array([ts]), np.array([lat]), np.array([ok]), np.array([probe]),
        None if inp != inp else np.array([inp]),
        None if out != out else np.array([out]),
        None if ttft != ttft else np.array([ttft]),
        instance=inst,
    )


def parse_event(obj: Any, *, now_s: float | None = None,
                settings: DetectorSettings = DEFAULT_SETTINGS) -> Event:
    """Validate one decoded JSON value; see the module docstring for the rules."""
    if not isinstance(obj, Mapping):
        raise BadEvent("not_object", f"an event must be a JSON object, got {type(obj).__name__}")
    fut_limit = future_limit(now_s, settings)
    rule = ids.rule(settings.id_pattern)
    if "samples" in obj:
        return _batch(obj, fut_limit, settings.max_latency_us, now_s, rule)
    kind = obj.get("type")
    if kind is None or kind == "single":
        group, row = single_row(obj, fut_limit, settings.max_latency_us, now_s, rule)
        return batch_of_row(row, group)
    if kind == "heartbeat":
        return _heartbeat(obj, fut_limit, now_s, rule)
    if kind == "histogram":
        return _histogram(obj, fut_limit, now_s, rule)
    if kind == "batch":
        raise BadEvent("missing_field", "a batch needs samples: [[ts, latency_us], …]",
                       field="samples")
    raise BadEvent("unknown_form", f"unknown event type {kind!r:.40}; expected none or"
                   " \"single\" (a latency event), \"batch\", \"heartbeat\" or \"histogram\"", field="type")


def loads(raw: bytes | str) -> Any:
    """Decode JSON text; raise BadEvent("bad_json") on anything that is not JSON."""
    try:
        return json_loads(raw)
    except (ValueError, RecursionError, TypeError) as e:
        raise BadEvent("bad_json", f"not valid JSON: {e}"[:200]) from None


def decode(raw: bytes | str, *, now_s: float | None = None,
           settings: DetectorSettings = DEFAULT_SETTINGS) -> Event:
    """Decode and validate one message (any of the three JSON forms, or a binary batch)."""
    if type(raw) is bytes:
        ev = bytes_batch(raw, future_limit(now_s, settings), settings.max_latency_us, now_s,
                          ids.rule(settings.id_pattern))
        if ev is not None:
            return ev
    return parse_event(loads(raw), now_s=now_s, settings=settings)


def bytes_batch(raw: bytes, fut_limit: float, max_lat: float,
                 now_s: float | None, rule: IdRule) -> SampleBatch | None:
    """A binary batch, or a JSON batch by the typed fast path; None for the general path."""
    if raw[:3] == _MAGIC:
        return _binary_batch(raw, fut_limit, max_lat, now_s, rule)
    if FAST_DECODER is not None and b'"samples"' in raw:
        return _typed_batch(FAST_DECODER, raw, fut_limit, max_lat, now_s, rule)
    return None
