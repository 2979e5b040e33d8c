"""The vectorised passes of stage 1's summary (:mod:`tailguard.core.window.summarize`), per slab.

Owns what :func:`~tailguard.core.window.summarize.summarize` computes slab by slab before it
builds one summary per series: the judged and probe masks of a slab's rows (:class:`Pass1`,
:func:`pass1`), each model's plan (:class:`ModelPlan`: its signal, code and fleet fit), the
values of the model's signal per row, and the statistics of every used row (:class:`Stats`):
sample counts and exact quantiles of the signal, of the raw latency, of the fresh samples and
of the probes, the rows that need masks one by one (:func:`chunk_stats`) and a tier's
steady-state rows together (:func:`fast_stats`: one sort per ring for both the window and its
fresh samples); fresh samples over the model's tail threshold are counted for the series with
at most ``FRESH_TAIL_MAX_SAMPLES`` of them. The fast pass hands each few rings' latency, while
in cache, to the cluster pools' capture (:class:`~tailguard.core.window.pools.PoolCapture`).

Guarantees: pure; the quantiles are exact (linear, as ``numpy.quantile``) and the same for a
row whichever path computed it; the slabs are only read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tailguard.core.window import signals as sig
from tailguard.core.window import ts_codes as tc
from tailguard.core.window.pools import PoolCapture
from tailguard.core.window.quantiles import (
    RUN_FLAG,
    U32,
    count_at_most,
    exact_quantiles,
    prefix_quantiles,
    row_quantiles,
    to_run_keys,
    two_run_quantiles,
)
from tailguard.core.window.rings import F32, F64, I64, MIN_SLAB_ROWS, Slab

Bools: TypeAlias = npt.NDArray[np.bool_]

_QS: Final = (0.5, 0.99)
# Fresh samples above the model's tail threshold are counted for series with at most this many
# fresh samples in a tick (low rates; faster series have the window rules in time).
FRESH_TAIL_MAX_SAMPLES: Final = 600
_Q50: Final = (0.5,)
# Sort keys of a tier's fast rows are built and sorted in blocks of at most this many bytes.
_FAST_BLOCK_BYTES: Final = 8 << 20
# ... each built and sorted this many bytes at a time (a core's L2 cache holds them).
_SORT_BLOCK_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class ModelPlan:
    signal: str
    code: int
    use_input: bool
    fit: sig.FleetFit | None


class Pass1:
    """Per-chunk judged/probe masks at one tick.

    A row is *clean* when it is full, wholly inside the age bound, probe-free
    and not in ``judge_since``: every slot is judged and no mask is needed.
    Masks are computed for the other (*dirty*) rows only; :meth:`judged_mask`
    builds the whole chunk's mask on demand.
    """

    __slots__ = ("_full", "ch", "clean", "dirty", "has_since", "judged_d", "n_judged", "probe_d",
                 "since_row")

    def __init__(self, ch: Slab, clean: Bools, dirty: I64, judged_d: Bools, probe_d: Bools,
                 n_judged: I64, since_row: F64, has_since: bool) -> None:
        self.ch, self.clean, self.dirty = ch, clean, dirty
        self.judged_d, self.probe_d, self.n_judged = judged_d, probe_d, n_judged
        self.since_row, self.has_since = since_row, has_since
        self._full: Bools | None = None

    def judged_mask(self) -> Bools:
        if self._full is None:
            full = np.zeros((self.ch.rows, self.ch.cap), dtype=bool)
            full[self.clean] = True
            full[self.dirty] = self.judged_d
            self._full = full
        return self._full

    def judged_rows(self, rows: I64) -> Bools:
        if rows.size == self.dirty.size and np.array_equal(rows, self.dirty):
            return self.judged_d
        return self.judged_mask()[rows]

    def probe_rows(self, rows: I64) -> Bools:
        if rows.size == self.dirty.size and np.array_equal(rows, self.dirty):
            return self.probe_d
        full = np.zeros((self.ch.rows, self.ch.cap), dtype=bool)
        full[self.dirty] = self.probe_d
        return full[rows]


def pass1(ch: Slab, now_s: float, age_lo: float,
           since: list[tuple[int, float]] | None) -> Pass1:
    ts, lat = ch.ts_code, ch.lat
    used = ch.midx >= 0
    since_row = np.full(ch.rows, np.nan)
    full = used & (ch.fill == ch.cap)
    if since:
        since_row[[r for r, _ in since]] = [v for _, v in since]
        full &= np.isnan(since_row)
    with np.errstate(invalid="ignore"):
        # A full ring is clean when every sample is judged: all in the age bound, no probe.
        # The kept bounds prove it for most rings; the others get exact bounds first.
        clean = full & (ch.ts_lo > age_lo) & (ch.ts_hi <= now_s) & (ch.lat_lo > 0)
        unproven = np.flatnonzero(full & ~clean)
        if unproven.size:
            sub = _rows(ts, unproven)
            base = ch.base_us[unproven]
            ch.ts_lo[unproven] = tc.decode(sub.min(axis=1), base)
            ch.ts_hi[unproven] = tc.decode(sub.max(axis=1), base)
            ch.lat_lo[unproven] = _rows(lat, unproven).min(axis=1)
            clean[unproven] = ((ch.ts_lo[unproven] > age_lo) & (ch.ts_hi[unproven] <= now_s)
                               & (ch.lat_lo[unproven] > 0))
        dirty = np.flatnonzero(used & ~clean)
        if dirty.size == 0:                 # every used row clean (most slabs, most ticks)
            none = np.zeros((0, ch.cap), dtype=bool)
            return Pass1(ch, clean, dirty, none, none, np.where(clean, ch.cap, 0), since_row, bool(since))
        sub_ts, sub_lat = _rows(ts, dirty), _rows(lat, dirty)
        base_d = ch.base_us[dirty]
        to_now = tc.after(base_d, now_s)[:, None]
        intime = (sub_ts <= to_now) & (sub_ts > tc.after(base_d, age_lo)[:, None])
        judged_d = intime & (sub_lat > 0)
        probe_d = intime & (sub_lat < 0)
        sub_since = since_row[dirty]
        q = ~np.isnan(sub_since)
        if q.any():
            judged_d[q] = (sub_ts[q] > tc.since(base_d[q], sub_since[q])[:, None]) & (sub_ts[q] <= to_now[q])
    n_judged = np.where(clean, ch.cap, 0)
    n_judged[dirty] = judged_d.sum(axis=1)
    return Pass1(ch, clean, dirty, judged_d, probe_d, n_judged, since_row, bool(since))


def _rows(arr: npt.NDArray[Any], rows: I64) -> npt.NDArray[Any]:
    """``arr[rows]`` for ascending unique ``rows``; a view (no copy) when they are
    consecutive (all of its rows: the array itself). Callers only read the result."""
    if rows.size == arr.shape[0]:
        return arr
    if rows.size and int(rows[-1]) - int(rows[0]) == rows.size - 1:
        return arr[int(rows[0]):int(rows[-1]) + 1]
    return arr[rows]


class Stats:
    """One chunk's per-row results at one tick (``q_*`` ``[rows, 2]`` P50/P99, NaN = none;
    ``n_over`` -1 = not counted), and its fast rows (:func:`fast_stats`)."""

    __slots__ = ("fast", "n_fresh", "n_over", "n_probe", "n_sig", "probe_q", "q_fresh", "q_lat",
                 "q_sig")

    def __init__(self, rows: int) -> None:
        self.q_sig: F64 = np.full((rows, 2), np.nan)
        self.q_lat: F64 = np.full((rows, 2), np.nan)
        self.n_sig: I64 = np.zeros(rows, dtype=np.int64)
        self.n_probe: I64 = np.zeros(rows, dtype=np.int64)
        self.n_fresh: I64 = np.zeros(rows, dtype=np.int64)
        self.q_fresh: F64 = np.full(rows, np.nan)
        self.n_over: I64 = np.full(rows, -1, dtype=np.int64)
        self.probe_q: dict[int, list[float]] = {}
        self.fast: I64 = np.zeros(0, dtype=np.int64)


def _fast_block(items: Sequence[tuple[Slab, Stats]], n: int, cap: int, fresh_lo: float,
                refs: F64, min_fresh: int, buf: U32, capture: PoolCapture | None = None) -> None:
    """:func:`fast_stats` for the fast rows of ``items`` (``n`` rows of ``cap`` slots,
    every slot judged) as one matrix of sort keys, in the first ``n`` rows of ``buf``;
    ``capture`` takes the pool's slots of each few rings while they are in cache."""
    keys: U32 = buf[:n]
    step = max(1, _SORT_BLOCK_BYTES // (4 * cap))
    o = 0
    for ch, cs in items:
        f = cs.fast
        ts_lo, ts_hi = ch.ts_lo[f], ch.ts_hi[f]
        if (ts_lo > fresh_lo).all():            # the kept bounds prove every sample fresh
            how = 0
        elif (ts_hi <= fresh_lo).all():         # ... or none
            how = 1
        else:
            how = 2 if ((ts_lo >= fresh_lo - tc.FLAG_SPAN_S).all()
                        and (ts_hi <= fresh_lo + tc.FLAG_SPAN_S).all()) else 3
        if how == 2:
            thr1 = tc.flag_thresholds(ch.base_us[f], fresh_lo)
            # Rings of one base (most: see ts_codes.GRID_US) share their threshold: a scalar
            # subtract, not one broadcast row by row.
            starts = np.arange(0, f.size, step)
            shared = (np.minimum.reduceat(thr1, starts) == np.maximum.reduceat(thr1, starts)).tolist()
        elif how == 3:
            thr = tc.after(ch.base_us[f], fresh_lo)[:, None]
        # Built and sorted a few rings at a time: the keys are sorted while still in cache.
        for a in range(0, f.size, step):
            r = f[a:a + step]
            part = keys[o + a:o + a + r.size]
            lat = _rows(ch.lat, r)
            if how == 0:
                np.copyto(part, lat.view(np.uint32))
            elif how == 1:
                np.bitwise_or(lat.view(np.uint32), RUN_FLAG, out=part)
            elif how == 2:                      # RUN_FLAG: not fresh
                tc.flag_at_most(_rows(ch.ts_code, r),
                                thr1[a] if shared[a // step] else thr1[a:a + step], part)
                np.bitwise_or(part, lat.view(np.uint32), out=part)
            else:
                np.less_equal(_rows(ch.ts_code, r), thr[a:a + step], out=part)   # 1: not fresh
                to_run_keys(part, lat)
            if capture is not None:
                capture.put(ch, r, lat)
            part.sort(axis=1)
        o += f.size
    nf = count_at_most(keys, np.full(n, cap, dtype=np.int64), np.uint32(RUN_FLAG - 1))
    q = two_run_quantiles(keys, nf, _QS)
    q_f = prefix_quantiles(keys.view(np.float32), nf, 0.5)
    midx = np.concatenate([ch.midx[cs.fast] for ch, cs in items])
    t = refs[midx]
    tail = ~np.isnan(t) & (nf > 0) & (nf <= FRESH_TAIL_MAX_SAMPLES)
    over = np.where(tail, nf - count_at_most(keys.view(np.float32), np.where(tail, nf, 0), t), -1)
    f_ok = (nf >= min_fresh) & (nf < cap)
    o = 0
    for _, cs in items:
        f = cs.fast
        sl = slice(o, o + f.size)
        cs.q_sig[f] = cs.q_lat[f] = q[sl]
        cs.n_sig[f] = cap
        cs.n_fresh[f] = nf[sl]
        cs.q_fresh[f] = np.where(f_ok[sl], q_f[sl], np.nan)
        cs.n_over[f] = over[sl]
        o += f.size


def _values(ch: Slab, rows: I64, codes: I64, plans: list[ModelPlan]) -> F32:
    """The signal value of every slot of ``rows`` (NaN where the row's signal has none)."""
    absl: F32 = np.abs(_rows(ch.lat, rows))
    if not ch.sized:
        if not codes.any():
            return absl
        return np.where((codes == 0)[:, None], absl, np.float32(np.nan))
    assert ch.out is not None and ch.inp is not None and ch.ttft is not None
    vals = absl.copy()
    vals[codes > 0] = np.nan
    rt = np.flatnonzero(codes == 1)
    if rt.size:
        vals[rt] = sig.tpot_us(absl[rt], ch.ttft[rows[rt]], ch.out[rows[rt]])
    rn = np.flatnonzero(codes == 2)
    if rn.size:
        midx = ch.midx[rows]
        for m in np.unique(midx[rn]).tolist():
            plan = plans[m]
            assert plan.fit is not None
            r = rn[midx[rn] == m]
            inp = ch.inp[rows[r]] if plan.use_input else None
            vals[r] = sig.normalized(absl[r], ch.out[rows[r]], inp, plan.fit)
    return vals


def chunk_stats(ch: Slab, st: Pass1, plans: list[ModelPlan], codes: I64, fresh_lo: float,
                 refs: F64, min_fresh: int) -> Stats:
    """Quantiles and counts of ``ch``'s rows that need masks (the slow path); the fast
    rows (clean, raw latency, not sized) are only listed, for :func:`fast_stats`.
    ``codes``: each plan's signal code, by model index."""
    cs = Stats(ch.rows)
    used_mask = ch.midx >= 0
    rows_code = codes[np.maximum(ch.midx, 0)]      # read for used rows only
    fast_mask = st.clean & (rows_code == 0) & (not ch.sized)
    cs.fast = np.flatnonzero(fast_mask)
    slow = np.flatnonzero(used_mask & ~fast_mask)
    if slow.size == 0:
        return cs
    judged = st.judged_rows(slow)
    code = rows_code[slow]
    vals = _values(ch, slow, code, plans)
    raw = not ch.sized and not code.any()
    # Raw latency is NaN only in empty slots, which are never judged.
    valid = None if raw else ~np.isnan(vals)
    sig_mask = judged if valid is None else judged & valid
    ns = st.n_judged[slow] if raw else sig_mask.sum(axis=1)
    cs.n_sig[slow] = ns
    cs.q_sig[slow] = row_quantiles(np.where(sig_mask, vals, np.float32(np.inf)), ns, _QS)
    if raw:
        cs.q_lat[slow] = cs.q_sig[slow]
    else:
        cs.q_lat[slow] = row_quantiles(
            np.where(judged, np.abs(_rows(ch.lat, slow)), np.float32(np.inf)),
            st.n_judged[slow], _QS)
    with np.errstate(invalid="ignore"):
        fresh_mask = sig_mask & (_rows(ch.ts_code, slow) > tc.after(ch.base_us[slow], fresh_lo)[:, None])
    _fresh_p50s(slow, fresh_mask, vals, cs.n_sig, min_fresh, cs.n_fresh, cs.q_fresh)
    _fresh_over(slow, fresh_mask, vals, refs[np.maximum(ch.midx, 0)], cs.n_fresh, cs.n_over)
    probe_mask = st.probe_rows(slow)
    if valid is not None:
        probe_mask = probe_mask & valid
    npr = probe_mask.sum(axis=1)
    cs.n_probe[slow] = npr
    for i in np.flatnonzero(npr).tolist():
        pq = exact_quantiles(vals[i][probe_mask[i]], _QS)
        if pq is not None:
            cs.probe_q[int(slow[i])] = pq
    return cs


def fast_stats(work: Sequence[tuple[Slab, Stats]], fresh_lo: float, refs: F64,
                min_fresh: int, capture: PoolCapture | None = None) -> None:
    """Fill in the fast rows (clean: every slot judged, raw latency, no probe) of every
    chunk, a tier's rows together in blocks of up to ``_FAST_BLOCK_BYTES`` of keys.

    One sort per row serves both the window and its fresh samples: the keys are the
    latency bits with the run flag on the samples that are not fresh
    (:func:`~tailguard.core.window.quantiles.to_run_keys`), so a sorted row is ``[fresh ascending |
    older ascending]``. The fresh count is where the runs meet, the
    window's P50/P99 selected across both runs
    (:func:`~tailguard.core.window.quantiles.select_two_runs`), the fresh P50 read by index and
    ``fresh_over`` counted by a binary search of the fresh run. ``capture`` gets every fast
    row's cluster-pool slots (:class:`~tailguard.core.window.pools.PoolCapture`).
    """
    if capture is not None:
        capture.start(sum(cs.fast.size * capture.width(ch.cap) for ch, cs in work))
    by_cap: dict[int, list[tuple[Slab, Stats]]] = {}
    for ch, cs in work:
        if cs.fast.size:
            by_cap.setdefault(ch.cap, []).append((ch, cs))
    for cap, items in by_cap.items():
        block_rows = max(MIN_SLAB_ROWS, _FAST_BLOCK_BYTES // (4 * cap))
        # One buffer for every block of the tier: its pages are touched once, not per block.
        sizes = [cs.fast.size for _, cs in items]
        buf: U32 = np.empty((max(min(block_rows, sum(sizes)), max(sizes)), cap), dtype=np.uint32)
        while items:
            n = 0
            take = 0
            while take < len(items) and (take == 0 or n + items[take][1].fast.size <= block_rows):
                n += items[take][1].fast.size
                take += 1
            _fast_block(items[:take], n, cap, fresh_lo, refs, min_fresh, buf, capture)
            items = items[take:]


def _fresh_p50s(rows: I64, fresh: Bools, vals: npt.NDArray[Any], n_sig: I64, min_fresh: int,
                n_fresh: I64, q_fresh: F64) -> None:
    """Count the fresh samples of ``rows`` (mask ``fresh``, values ``vals``, both one row
    per entry of ``rows``) into ``n_fresh``; their P50 into ``q_fresh`` for the rows with
    at least ``min_fresh`` of them but not all their judged samples (the caller fills
    those in from the window's own P50)."""
    nf = np.count_nonzero(fresh, axis=1)
    n_fresh[rows] = nf
    sel = np.flatnonzero((nf >= min_fresh) & (nf < n_sig[rows]))
    if sel.size:
        # The rows with +inf over the samples that are not fresh, in one pass.
        inf_filled = np.where(_rows(fresh, sel), _rows(vals, sel), vals.dtype.type(np.inf))
        q_fresh[rows[sel]] = row_quantiles(inf_filled, nf[sel], _Q50)[:, 0]


def _fresh_over(rows: I64, fresh: Bools, vals: npt.NDArray[Any], thr: F64, n_fresh: I64,
                n_over: I64) -> None:
    """Into ``n_over``: how many fresh samples of ``rows`` lie above their model's
    threshold ``thr`` (by row), for rows with one and at most FRESH_TAIL_MAX_SAMPLES
    fresh samples (a low rate: the only rows the count is kept for, and cheap)."""
    t = thr[rows]
    nf = n_fresh[rows]
    sel = np.flatnonzero(~np.isnan(t) & (nf > 0) & (nf <= FRESH_TAIL_MAX_SAMPLES))
    if sel.size:
        with np.errstate(invalid="ignore"):
            above = _rows(fresh, sel) & (np.abs(_rows(vals, sel)) > t[sel, None])
        n_over[rows[sel]] = np.count_nonzero(above, axis=1)
