"""Field checks of the latency-event contract: one JSON field in, its value or a :class:`BadEvent`.

Owns the checks every decode path of :mod:`tailguard.core.contract.events` shares: node id
and model name against the id rule, optional strings (``hardware``, ``instance``, at most
``MAX_NAME_CHARS``), flags, token counts (integers in ``[0, MAX_TOKENS]``), and the errors for
a bad latency, a bad or future event time (``MAX_TS_S``: a larger ``ts`` is milliseconds, not
seconds) and a bad sample of a batch. Each error names the field and the bound it broke.

Guarantees: pure; a check either returns the value in the type the decoders store or raises
:class:`~tailguard.core.contract.errors.BadEvent` with a reason of ``events.REASONS``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.ids import MAX_NAME_CHARS, IdRule

MAX_TOKENS: Final = 10_000_000
# Event time is seconds since the epoch; 1e11 s is the year 5138. A larger ts is
# almost always milliseconds or microseconds, and would also break tick arithmetic
# ((k + 1) * interval == k * interval for huge k).
MAX_TS_S: Final = 1e11
_NAN: Final = math.nan


def name_field(d: Mapping[str, Any], key: str, rule: IdRule) -> str:
    v = d.get(key)
    if type(v) is str and rule.ok(v):
        return v
    if v is None:
        raise BadEvent("missing_field", f"{key} is required (a non-empty string)", field=key)
    if not isinstance(v, str):
        raise BadEvent("bad_type", f"{key} must be a string, got {type(v).__name__}", field=key)
    if not v:
        raise BadEvent("empty_field", f"{key} must be a non-empty string", field=key)
    raise rule.error(key, v)


def text_field(d: Mapping[str, Any], key: str = "hardware") -> str | None:
    """An optional string field (``hardware``, ``instance``): None, or at most 256 chars."""
    v = d.get(key)
    if v is None or (type(v) is str and len(v) <= MAX_NAME_CHARS):
        return v
    if not isinstance(v, str):
        raise BadEvent("bad_type", f"{key} must be a string, got {type(v).__name__}",
                       field=key)
    raise BadEvent("too_long", f"{key} has {len(v)} chars; at most {MAX_NAME_CHARS} allowed",
                   field=key)


def flag_field(d: Mapping[str, Any], key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if type(v) is bool:
        return v
    raise BadEvent("bad_type", f"{key} must be true or false, got {v!r:.40}", field=key)


def is_num(v: object) -> bool:
    t = type(v)
    return t is float or t is int


def latency_error(v: object, max_latency_us: float) -> BadEvent:
    if v is None:
        return BadEvent("missing_field", "latency_us is required (a number > 0)", field="latency_us")
    return BadEvent("bad_latency", f"latency_us must be a finite number in (0, {max_latency_us:g}]"
                    f" µs, got {v!r:.40}", field="latency_us")


def ts_error(v: object, fut_limit: float, now_s: float | None) -> BadEvent:
    if v is None:
        return BadEvent("missing_field", "ts is required (event time, seconds since the epoch)",
                        field="ts")
    if is_num(v) and math.isfinite(v) and v > MAX_TS_S:  # type: ignore[arg-type,operator]
        return BadEvent("bad_ts", f"ts={v!r} is not seconds since the epoch (milliseconds?): "
                        f"ts must be Unix seconds, at most {MAX_TS_S:g}", field="ts")
    if is_num(v) and math.isfinite(v) and v >= 0:  # type: ignore[arg-type,operator]
        return BadEvent("future_ts", f"ts={v!r} is more than {fut_limit - (now_s or 0.0):g} s"
                        f" after now ({now_s!r}); check the emitter's clock", field="ts")
    return BadEvent("bad_ts", f"ts must be a finite number of seconds >= 0, got {v!r:.40}",
                    field="ts")


def tokens_field(d: Mapping[str, Any], key: str) -> float:
    v = d.get(key)
    if v is None:
        return _NAN
    if is_num(v) and 0 <= v <= MAX_TOKENS and v == int(v):
        return float(v)
    raise BadEvent("bad_tokens", f"{key} must be an integer in [0, {MAX_TOKENS}], got {v!r:.40}",
                   field=key)


def sample_error(row: Sequence[Any], i: int, lat_ok: bool, ts_ok: bool, tok_ok: bool,
                  fut_limit: float, max_lat: float, now_s: float | None) -> BadEvent:
    where = f"samples[{i}]: "
    if not lat_ok:
        e = latency_error(row[1], max_lat)
    elif not ts_ok:
        e = ts_error(row[0], fut_limit, now_s)
    elif not tok_ok:
        e = BadEvent("bad_tokens", f"token counts must be integers in [0, {MAX_TOKENS}],"
                     f" got {row[2]!r}, {row[3]!r}")
    else:
        e = BadEvent("bad_ttft", f"ttft_us must be in [0, latency_us], got {row[4]!r}")
    return BadEvent(e.reason, where + str(e), field="samples")
