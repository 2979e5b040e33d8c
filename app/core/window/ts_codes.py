"""Event times in a ring as 4-byte codes: µs after the ring's base, compared exactly.

Owns how :class:`~tailguard.core.window.rings.Slab` stores a sample's event time: a uint32
code, the whole µs after its ring's ``base`` (int64 µs), 0 for an empty slot or a sample
stored as too old. :func:`encode_into` codes new samples and moves a ring to a new base (on
a 67-s grid: rings that move together share it) when they need one, :func:`codes_against`
against a given base; :func:`decode` gives the times back; :func:`after`, :func:`since` and
:func:`flag_thresholds` turn a tick's bounds into per-ring code thresholds;
:func:`flag_at_most` marks the codes at or below one (stage 1's sort keys). Guarantees:

* A time is stored as its nearest whole µs: one with at most 6 decimals before 2106 decodes
  (``v / 1e6``, float64) to exactly the same float64; others move by at most 0.5 µs.
* Comparisons are those of the decoded times: ``code > after(A)`` exactly when
  ``decoded > A`` (and ``<=`` when ``<=``), for any ``A``. A cut-off is a time like a
  sample's: ``code > since(S)`` exactly when ``decoded >= S`` stored as a sample would be
  (its nearest whole µs), so a cut-off set at a sample's own time counts that sample.
  Code 0 passes neither.
* A ring spans up to 2³² − 1 µs (71.6 min) of event time. A sample more than ~53.6 min
  older than its ring's newest may be stored as too old (code 0, decoded -inf): never
  judged, which it could only have been past ``max_sample_age_s`` + clock skew of that.
"""

from __future__ import annotations

import math
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

U32: TypeAlias = npt.NDArray[np.uint32]
I64: TypeAlias = npt.NDArray[np.int64]
F64: TypeAlias = npt.NDArray[np.float64]

MAX_CODE: Final = (1 << 32) - 1
# Room kept above a ring's newest sample when it gets a new base (18 minutes of later times).
HEADROOM: Final = 1 << 30
#: A new base is a multiple of this (67 s; HEADROOM is a multiple): rings that get one within
#: the same 67 s share it, and stage 1 then compares a block of them to one threshold.
GRID_US: Final = 1 << 26
_US: Final = 1e6


def floor_us(t: float) -> int:
    """The largest whole µs ``v`` with ``v / 1e6 <= t`` (``t`` finite)."""
    v = math.floor(t * _US)
    if (v + 1) / _US <= t:
        v += 1
    elif v / _US > t:
        v -= 1
    return v


def decode(codes: U32, base: int | I64) -> F64:
    """The times of ``codes`` against ``base`` (an int, or an array broadcast with
    ``codes``); -inf for code 0."""
    return np.where(codes > 0, (codes.astype(np.int64) + base) / _US, -np.inf)


def after(base: I64, t: float) -> U32:
    """Per ring of ``base``: the code threshold of time ``t`` (``code > it`` exactly when the
    decoded time is ``> t``, ``code <= it`` when ``<= t``, for codes above 0)."""
    if math.isinf(t):
        return np.full(base.shape, 0 if t < 0 else MAX_CODE, dtype=np.uint32)
    d = floor_us(t) - base
    np.maximum(d, 0, out=d)             # np.clip's, without its checks (called per slab)
    np.minimum(d, MAX_CODE, out=d)
    return d.astype(np.uint32)


#: How near ``t`` (s) every decoded time must be for :func:`flag_at_most`: a code's
#: difference from ``after(base, t) + 1`` then fits in 31 bits and a sign (2³¹ µs ≈ 2147 s).
FLAG_SPAN_S: Final = 2000.0
_FLAG: Final = np.uint32(1 << 31)


def flag_thresholds(base: I64, t: float) -> U32:
    """Per ring of ``base``: the threshold :func:`flag_at_most` subtracts to mark the codes
    whose decoded time is ``<= t`` (finite)."""
    thr1: U32 = ((after(base, t).astype(np.int64) + 1) & MAX_CODE).astype(np.uint32)
    return thr1


def flag_at_most(codes: U32, thr1: U32 | np.uint32, out: U32) -> None:
    """Into ``out`` (shaped as ``codes``, one row per ring): bit 31 set exactly where the
    code's decoded time is ``<= t``, every other bit 0; ``thr1``: the rings'
    :func:`flag_thresholds` of ``t``, one per row, or one for every row.

    For codes above 0 whose decoded times all lie within :data:`FLAG_SPAN_S` of ``t``
    (finite) — the caller proves it, e.g. by the rings' kept bounds. Then ``code − thr − 1``
    lies in [−2³¹, 2³¹) also where ``after`` clips ``thr`` to 0 or ``MAX_CODE``, and its sign
    bit in uint32 arithmetic (mod 2³²) is the comparison."""
    np.subtract(codes, thr1 if isinstance(thr1, np.uint32) else thr1[:, None], out=out)
    np.bitwise_and(out, _FLAG, out=out)


def since(base: I64, t: F64) -> U32:
    """Per ring of ``base`` and its cut-off ``t`` (finite): ``code > it`` exactly when the
    decoded time is at or after ``t`` stored as a sample (its nearest whole µs, as
    :func:`encode_into` codes it). A cut-off is often a sample's own time (a first sample,
    a restart), which a time with 7 decimals stores up to 0.5 µs earlier."""
    thr: U32 = np.clip(np.rint(t * _US).astype(np.int64) - 1 - base, 0, MAX_CODE).astype(np.uint32)
    return thr


def base_for(lo_us: int, top_us: int) -> int:
    """A new base for a ring whose times (whole µs) run from ``lo_us`` to ``top_us``: on the
    :data:`GRID_US` grid with ``HEADROOM`` to ``HEADROOM - GRID_US`` above the newest, or,
    when the times span more, the oldest that fit them all."""
    new = _on_grid(top_us + HEADROOM - MAX_CODE)
    return new if new < lo_us else max(top_us - MAX_CODE, lo_us - 1)


def _on_grid(base_us: int) -> int:
    return base_us - base_us % GRID_US


def codes_against(ts: F64, base: int) -> U32:
    """The codes of ``ts`` against ``base``, each its nearest whole µs as :func:`encode_into`
    stores it; code 0 (too old) for a time that is not finite or not above the base. For
    times the base can hold otherwise (at most ``MAX_CODE`` µs above it)."""
    fin = np.isfinite(ts)
    rel = np.rint(np.where(fin, ts, 0.0) * _US) - base
    codes: U32 = np.where(fin & (rel >= 1), rel, 0).astype(np.uint32)
    return codes


def encode_into(codes_of: U32, row: int, base: int, ts: F64, lo_s: float, hi_s: float,
                filled: bool) -> tuple[U32, int, bool, int, int]:
    """The codes of ``ts`` (``lo_s``/``hi_s`` their least and greatest) for the ring
    ``codes_of[row]`` holding codes against ``base`` (``filled``: it holds samples); the
    ring's base after them, whether a stored sample became too old, and the codes of
    ``lo_s`` and ``hi_s``.

    The ring keeps its base while the new times fit; otherwise it gets one on the grid with
    about ``HEADROOM`` above the newest time it must hold (:func:`base_for`) and its codes
    are moved in place. A new time below what the base allows is stored as too old.
    """
    lo, hi = round(lo_s * _US), round(hi_s * _US)
    lost = False
    if not filled:
        base = _on_grid(hi + HEADROOM - MAX_CODE)
    elif lo - base < 1 or hi - base > MAX_CODE:
        ring = codes_of[row]
        top = hi
        old_max = int(ring.max())
        if old_max > 0:
            top = max(top, base + old_max)
        new = base_for(lo, top)
        shift = new - base
        codes = ring.astype(np.int64)
        if shift > 0:
            lost = bool(((codes > 0) & (codes <= shift)).any())
            ring[...] = np.where(codes > shift, codes - shift, 0)
        elif shift < 0:
            ring[...] = np.where(codes > 0, codes - shift, 0)
        base = new
    # The code: the time's nearest whole µs (of ts * 1e6, ties to even: whatever the base, as
    # since() rounds a cut-off) less the base.
    c_lo, c_hi = max(lo - base, 0), hi - base
    if ts.shape[0] == 1:
        return np.array([max(c_hi, 0)], dtype=np.uint32), base, lost, c_lo, c_hi
    rel = np.rint(ts * _US) - base
    if c_lo < 1:
        np.maximum(rel, 0.0, out=rel)
    return rel.astype(np.uint32), base, lost, c_lo, c_hi
