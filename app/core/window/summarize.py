"""Stage 1's per-tick pass: every series' window → one :class:`~tailguard.core.contract.types.WindowSummary`.

Owns :func:`summarize` (``WindowStore.summaries`` delegates to it) and the vectorised passes
only it uses: judged and probe masks per slab, each model's signal and fleet fit, quantiles of
the rows that need masks, and, a tier's rows together, of the steady-state rows (one sort per
ring for both the window and its fresh samples).

Guarantees, at tick ``now_s``:

* Judged samples: ``ok``, non-probe, event time in ``(now_s − max_sample_age_s, now_s]`` (a
  quiet node is not judged on old samples); for a series in ``judge_since``, every ``ok``
  sample, probe or not, with ``since_ts <= ts <= now_s``. The fleet-wide ``normalized`` fit is
  made from every series' judged samples except those of the series in ``out_of_fit``.
* One signal per model (:mod:`tailguard.core.window.signals`): ``p50``/``p99``/``samples`` over the judged
  samples with a value of it, ``latency_p50_us``/``latency_p99_us`` over their raw latency;
  exact quantiles (linear, as ``numpy.quantile``) at any window_size. A series with fewer
  than ``min_samples`` values of its model's signal but as many judged samples is
  summarised in ``latency`` (no fresh figures).
* ``fresh_samples``/``fresh_p50``: the judged samples in ``(now_s − tick_interval_s, now_s]`` and
  their exact P50 (``None`` below ``min_samples``); ``fresh_over`` is counted against
  ``tail_refs`` for at most ``FRESH_TAIL_MAX_SAMPLES`` of them; ``failed``, ``probe_*``: in the age bound.
* Pure: the slabs only get their kept bounds tightened. Output is sorted by (model, node_id).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window import signals as sig
from tailguard.core.window.quantiles import (
    RUN_FLAG,
    U32,
    count_at_most,
    digest_of,
    digest_to_dict,
    exact_quantiles,
    prefix_quantiles,
    row_quantiles,
    to_run_keys,
    two_run_quantiles,
)
from tailguard.core.window.rings import F32, F64, I64, MIN_SLAB_ROWS, SeriesKey, SeriesRecord, Slab

Bools: TypeAlias = npt.NDArray[np.bool_]

_QS: Final = (0.5, 0.99)
# Fresh samples above the model's tail threshold are counted for series with at most this many
# fresh samples in a tick (low rates; faster series have the window rules in time).
FRESH_TAIL_MAX_SAMPLES: Final = 600
_Q50: Final = (0.5,)
_SIG_CODE: Final = {sig.LATENCY: 0, sig.TPOT: 1, sig.NORMALIZED: 2}
_FIT_SLOTS: Final = 256
# Sort keys of a tier's fast rows are built and sorted in blocks of at most this many bytes.
_FAST_BLOCK_BYTES: Final = 4 << 20
_NONE2: Final[tuple[None, None]] = (None, None)

@dataclass(frozen=True, slots=True)
class _ModelPlan:
    signal: str
    code: int
    use_input: bool
    fit: sig.FleetFit | None


class _Pass1:
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


def _pass1(ch: Slab, now_s: float, age_lo: float,
           since: list[tuple[int, float]] | None) -> _Pass1:
    ts, lat = ch.ts, ch.lat
    used = ch.midx >= 0
    since_row = np.full(ch.rows, np.nan)
    if since:
        since_row[[r for r, _ in since]] = [v for _, v in since]
    with np.errstate(invalid="ignore"):
        full = used & (ch.fill == ch.cap) & np.isnan(since_row)
        # A full ring is clean when every sample is judged: all in the age bound, no probe.
        # The kept bounds prove it for most rings; the others get exact bounds first.
        unproven = np.flatnonzero(full & ~((ch.ts_lo > age_lo) & (ch.ts_hi <= now_s) & (ch.lat_lo > 0)))
        if unproven.size:
            sub = _rows(ts, unproven)
            ch.ts_lo[unproven], ch.ts_hi[unproven] = sub.min(axis=1), sub.max(axis=1)
            ch.lat_lo[unproven] = _rows(lat, unproven).min(axis=1)
        clean = full & (ch.ts_lo > age_lo) & (ch.ts_hi <= now_s) & (ch.lat_lo > 0)
        dirty = np.flatnonzero(used & ~clean)
        sub_ts, sub_lat = _rows(ts, dirty), _rows(lat, dirty)
        intime = (sub_ts <= now_s) & (sub_ts > age_lo)
        judged_d = intime & (sub_lat > 0)
        probe_d = intime & (sub_lat < 0)
        sub_since = since_row[dirty]
        q = ~np.isnan(sub_since)
        if q.any():
            judged_d[q] = (sub_ts[q] >= sub_since[q, None]) & (sub_ts[q] <= now_s)
    n_judged = np.where(clean, ch.cap, 0)
    n_judged[dirty] = judged_d.sum(axis=1)
    return _Pass1(ch, clean, dirty, judged_d, probe_d, n_judged, since_row, bool(since))


def _rows(arr: npt.NDArray[Any], rows: I64) -> npt.NDArray[Any]:
    """``arr[rows]`` for sorted unique ``rows``; the array itself (no copy) when
    they are all of its rows. Callers only read the result."""
    return arr if rows.size == arr.shape[0] else arr[rows]


class _Stats:
    """One chunk's per-row results at one tick (``q_*`` ``[rows, 2]`` P50/P99, NaN = none;
    ``n_over`` -1 = not counted), and its fast rows (:func:`_fast_stats`)."""

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


def _fast_block(items: Sequence[tuple[Slab, _Stats]], n: int, cap: int, fresh_lo: float,
                refs: F64, min_fresh: int) -> None:
    """:func:`_fast_stats` for the fast rows of ``items`` (``n`` rows of ``cap`` slots,
    every slot judged) as one matrix of sort keys."""
    keys: U32 = np.empty((n, cap), dtype=np.uint32)
    o = 0
    for ch, cs in items:
        f = cs.fast
        part = keys[o:o + f.size]
        if (ch.ts_lo[f] > fresh_lo).all():      # the kept bound proves every sample fresh
            part[...] = 0
        else:
            np.less_equal(_rows(ch.ts, f), fresh_lo, out=part)      # 1: not fresh
        to_run_keys(part, _rows(ch.lat, f))
        o += f.size
    keys.sort(axis=1)
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


_summary_order: Final = operator.attrgetter("model", "node_id")
_make_summary: Final = WindowSummary._make
_node_id_of: Final = operator.attrgetter("node_id")
_model_of: Final = operator.attrgetter("model")
_hardware_of: Final = operator.attrgetter("hardware")
_first_seen_of: Final = operator.attrgetter("first_seen_ts")
_last_seen_of: Final = operator.attrgetter("last_seen_ts")
_requests_of: Final = operator.attrgetter("requests")
_failures_of: Final = operator.attrgetter("failures")
_instance_ts_of: Final = operator.attrgetter("instance_ts")
_resumed_ts_of: Final = operator.attrgetter("resumed_ts")


def _optional(values: npt.NDArray[Any], none: Bools) -> list[Any]:
    """``values`` as Python numbers, ``None`` where ``none``."""
    out = values.astype(object)
    out[none] = None
    return list(out.tolist())


def summarize(slabs: Sequence[Slab], records: Mapping[SeriesKey, SeriesRecord], model_names: Sequence[str],
              settings: DetectorSettings, now_s: float, *,
              judge_since: Mapping[SeriesKey, float] | None = None,
              out_of_fit: Collection[SeriesKey] = (),
              digests: bool = False,
              tail_refs: Mapping[str, float] | None = None,
              pause: Callable[[], AbstractContextManager[object]] = nullcontext) -> list[WindowSummary]:
    """One summary per series of ``records`` at event time ``now_s`` (module docstring).

    ``slabs``: every slab holding a used ring; ``model_names``: by model index (``midx``). The
    keyword arguments are :meth:`~tailguard.core.window.window.WindowStore.summaries`' (its docstring);
    ``pause``: entered while one tuple per series is made (the caller's choice, e.g.
    :func:`tailguard.collector.collector_paused`; the core calls no ``gc``).
    """
    age_lo = now_s - settings.max_sample_age_s
    fresh_lo = now_s - settings.tick_interval_s
    since_by_chunk: dict[int, list[tuple[int, float]]] = {}
    for key, since in (judge_since or {}).items():
        s = records.get(key)
        if s is not None and s.chunk is not None:
            since_by_chunk.setdefault(id(s.chunk), []).append((s.row, float(since)))
    unfit_by_chunk: dict[int, list[int]] = {}
    for key in out_of_fit:
        s = records.get(key)
        if s is not None and s.chunk is not None:
            unfit_by_chunk.setdefault(id(s.chunk), []).append(s.row)
    chunks = list(slabs)
    nm = len(model_names)
    judged_m = np.zeros(nm)
    tpot_m = np.zeros(nm)
    out_m = np.zeros(nm)
    inout_m = np.zeros(nm)
    # Models with a judgeable series (min_samples judged) short of TPOT / output-token values.
    tpot_gap = np.zeros(nm, dtype=bool)
    out_gap = np.zeros(nm, dtype=bool)
    need = settings.min_samples
    states: list[_Pass1] = []
    for ch in chunks:
        st = _pass1(ch, now_s, age_lo, since_by_chunk.get(id(ch)))
        states.append(st)
        used = ch.midx >= 0
        m = ch.midx[used]
        n_judged = st.n_judged[used]
        judged_m += np.bincount(m, n_judged, minlength=nm)
        ready = n_judged >= need
        if ch.sized:
            assert ch.out is not None and ch.ttft is not None and ch.inp is not None
            judged = st.judged_mask()
            j_out = judged & ~np.isnan(ch.out)
            j_tpot = j_out & (ch.out >= 2) & ~np.isnan(ch.ttft)
            j_inout = j_out & ~np.isnan(ch.inp)
            n_tpot, n_out = j_tpot[used].sum(axis=1), j_out[used].sum(axis=1)
            tpot_m += np.bincount(m, n_tpot, minlength=nm)
            out_m += np.bincount(m, n_out, minlength=nm)
            inout_m += np.bincount(m, j_inout[used].sum(axis=1), minlength=nm)
            tpot_gap[m[ready & (n_tpot < need)]] = True
            out_gap[m[ready & (n_out < need)]] = True
        else:
            tpot_gap[m[ready]] = out_gap[m[ready]] = True
    plans = _plans(settings, model_names, chunks, states, judged_m, tpot_m, out_m, inout_m,
                   ~tpot_gap, ~out_gap, unfit_by_chunk)
    results: list[WindowSummary] = []
    refs = np.full(max(1, nm), np.nan)
    index = {m: i for i, m in enumerate(model_names)} if tail_refs else {}
    for name, ref in (tail_refs or {}).items():
        i = index.get(name)
        if i is not None:
            refs[i] = ref
    stats = [_chunk_stats(ch, st, plans, fresh_lo, refs, settings.min_samples)
             for ch, st in zip(chunks, states, strict=True)]
    _fast_stats(list(zip(chunks, stats, strict=True)), fresh_lo, refs, settings.min_samples)
    with pause():
        results.extend(_build(list(zip(chunks, states, stats, strict=True)), plans,
                              now_s, age_lo, digests, settings.min_samples))
        for s in records.values():
            if s.chunk is None:
                results.append(WindowSummary(
                    node_id=s.node_id, model=s.model, tick_ts=now_s,
                    signal=plans[s.midx].signal, samples=0, p50=None, p99=None,
                    latency_p50_us=None, latency_p99_us=None,
                    failed=_failed_in(s.failed, age_lo, now_s) if s.failed else 0,
                    hardware=s.hardware, first_seen_ts=s.first_seen_ts,
                    last_seen_ts=s.last_seen_ts, extra={}, requests_total=s.requests,
                    failed_total=s.failures, instance_ts=s.instance_ts,
                    resumed_ts=s.resumed_ts))
        results.sort(key=_summary_order)
    return results


def _plans(settings: DetectorSettings, model_names: Sequence[str], chunks: list[Slab],
           states: list[_Pass1], judged_m: F64, tpot_m: F64, out_m: F64, inout_m: F64,
           tpot_all: Bools, out_all: Bools, unfit_by_chunk: Mapping[int, list[int]]) -> list[_ModelPlan]:
    signals = [sig.choose_signal(settings.signal_for(name), int(judged_m[i]),
                                 int(tpot_m[i]), int(out_m[i]), tpot_everywhere=bool(tpot_all[i]),
                                 output_everywhere=bool(out_all[i]))
               for i, name in enumerate(model_names)]
    use_input = [out_m[i] > 0 and inout_m[i] >= sig.INPUT_COVERAGE * out_m[i]
                 for i in range(len(signals))]
    need_fit = {i for i, s in enumerate(signals) if s == sig.NORMALIZED}
    coefs: dict[int, list[F64]] = {i: [] for i in need_fit}
    means: dict[int, list[F64]] = {i: [] for i in need_fit}
    for ch, st in zip(chunks, states, strict=True):
        if not need_fit or not ch.sized:
            continue
        assert ch.out is not None and ch.inp is not None
        voters = np.isin(ch.midx, list(need_fit))
        unfit = unfit_by_chunk.get(id(ch))
        if unfit:
            voters[unfit] = False
        rows = np.flatnonzero(voters)
        if rows.size == 0:
            continue
        judged = st.judged_mask()
        # A node's coefficients only vote in a median: a fixed subset of its slots
        # (every stride-th) fits them as well as the whole window, at a fraction of the cost.
        cols = slice(None, None, max(1, ch.cap // _FIT_SLOTS))
        for m in np.unique(ch.midx[rows]).tolist():
            r = rows[ch.midx[rows] == m]
            out = ch.out[r, cols]
            inp = ch.inp[r, cols] if use_input[m] else None
            mask = judged[r, cols] & ~np.isnan(out)
            if inp is not None:
                mask &= ~np.isnan(inp)
            f = sig.row_fits(np.abs(ch.lat[r, cols]), out, inp, mask)
            coefs[m].append(np.stack([f.a[f.valid], f.b[f.valid], f.c[f.valid]], axis=1))
            means[m].append(f.mean_us[f.n > 0])
    plans: list[_ModelPlan] = []
    for i, s in enumerate(signals):
        fit = None
        if i in need_fit:
            cf = np.concatenate(coefs[i]) if coefs[i] else np.zeros((0, 3))
            mu = np.concatenate(means[i]) if means[i] else np.zeros(0)
            fit = sig.fleet_fit(cf[:, 0], cf[:, 1], cf[:, 2], mu)
        plans.append(_ModelPlan(s, _SIG_CODE[s], use_input[i], fit))
    return plans


def _values(ch: Slab, rows: I64, codes: I64, plans: list[_ModelPlan]) -> F32:
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


def _chunk_stats(ch: Slab, st: _Pass1, plans: list[_ModelPlan], fresh_lo: float, refs: F64,
                 min_fresh: int) -> _Stats:
    """Quantiles and counts of ``ch``'s rows that need masks (the slow path); the fast
    rows (clean, raw latency, not sized) are only listed, for :func:`_fast_stats`."""
    cs = _Stats(ch.rows)
    used_mask = ch.midx >= 0
    codes = np.array([p.code for p in plans], dtype=np.int64)
    rows_code = np.where(used_mask, codes[np.maximum(ch.midx, 0)], 0)
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
        fresh_mask = sig_mask & (_rows(ch.ts, slow) > fresh_lo)
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


def _fast_stats(work: Sequence[tuple[Slab, _Stats]], fresh_lo: float, refs: F64,
                min_fresh: int) -> None:
    """Fill in the fast rows (clean: every slot judged, raw latency, no probe) of every
    chunk, a tier's rows together in blocks of up to ``_FAST_BLOCK_BYTES`` of keys.

    One sort per row serves both the window and its fresh samples: the keys are the
    latency bits with the run flag on the samples that are not fresh
    (:func:`~tailguard.core.window.quantiles.to_run_keys`), so a sorted row is ``[fresh ascending |
    older ascending]``. The fresh count is where the runs meet, the
    window's P50/P99 selected across both runs
    (:func:`~tailguard.core.window.quantiles.select_two_runs`), the fresh P50 read by index and
    ``fresh_over`` counted by a binary search of the fresh run.
    """
    by_cap: dict[int, list[tuple[Slab, _Stats]]] = {}
    for ch, cs in work:
        if cs.fast.size:
            by_cap.setdefault(ch.cap, []).append((ch, cs))
    for cap, items in by_cap.items():
        block_rows = max(MIN_SLAB_ROWS, _FAST_BLOCK_BYTES // (4 * cap))
        while items:
            n = 0
            take = 0
            while take < len(items) and (take == 0 or n + items[take][1].fast.size <= block_rows):
                n += items[take][1].fast.size
                take += 1
            _fast_block(items[:take], n, cap, fresh_lo, refs, min_fresh)
            items = items[take:]


def _build(parts: Sequence[tuple[Slab, _Pass1, _Stats]], plans: list[_ModelPlan],
           now_s: float, age_lo: float, digests: bool, min_fresh: int) -> list[WindowSummary]:
    """The summaries of every used row of ``parts``' chunks, in chunk order.

    Built by field name, one column per field for all chunks at once, then one tuple per
    series: cheaper than a keyword call of WindowSummary's fields, and the numeric
    columns need no per-series Python loop (``_optional``)."""
    if not parts:
        return []
    used = [np.flatnonzero(ch.midx >= 0) for ch, _, _ in parts]
    at = np.cumsum([0] + [u.size for u in used]).tolist()     # each chunk's first index

    def cat(arrs: Iterable[npt.NDArray[Any]]) -> npt.NDArray[Any]:
        return np.concatenate([x[u] for x, u in zip(arrs, used, strict=True)])

    ser: list[SeriesRecord] = []
    for (ch, _, _), u in zip(parts, used, strict=True):
        ser.extend(sr for r in u.tolist() if (sr := ch.series[r]) is not None)
    assert len(ser) == at[-1]
    n_sig = cat(cs.n_sig for _, _, cs in parts)
    n_judged = cat(st.n_judged for _, st, _ in parts)
    q_sig = cat(cs.q_sig for _, _, cs in parts)
    q_lat = cat(cs.q_lat for _, _, cs in parts)
    n_fresh = cat(cs.n_fresh for _, _, cs in parts)
    q_fresh = cat(cs.q_fresh for _, _, cs in parts)
    n_over = cat(cs.n_over for _, _, cs in parts)
    # A window whose judged samples are all fresh has its own P50 as the fresh P50.
    whole = (n_fresh == n_sig) & (n_sig >= min_fresh)
    q_fresh[whole] = q_sig[whole, 0]
    midx = cat(ch.midx for ch, _, _ in parts)
    codes = np.array([p.code for p in plans], dtype=np.int64)
    # A series with too few values of its model's signal but enough judged samples (a node
    # whose events carry no token counts on a model judged per token) is summarised in raw
    # latency, as a stage-1 worker holding only such series would: stage 2 never compares
    # it with peers in other units, and it is not left unjudged (never admitted).
    raw_fb = (codes[midx] != 0) & (n_sig < min_fresh) & (n_judged >= min_fresh)
    if raw_fb.any():
        n_sig, q_sig = n_sig.copy(), q_sig.copy()
        n_sig[raw_fb] = n_judged[raw_fb]
        q_sig[raw_fb] = q_lat[raw_fb]
        n_fresh[raw_fb] = 0
        q_fresh[raw_fb] = np.nan
        n_over[raw_fb] = -1
    no_sig, no_lat = n_sig == 0, n_judged == 0
    # The series without extras share one empty dict (``extra`` is a read-only Mapping):
    # one allocation per series fewer, and fewer collections of the garbage collector.
    none: dict[str, Any] = {}
    extras: list[dict[str, Any]] = [none] * len(ser)

    def extra(i: int) -> dict[str, Any]:
        d = extras[i]
        if d is none:
            d = extras[i] = {}
        return d

    if any(st.has_since for _, st, _ in parts):
        since = cat(st.since_row for _, st, _ in parts)
        for i in np.flatnonzero(~np.isnan(since)).tolist():
            extra(i)["judged_since"] = float(since[i])
    for i, nj in zip(np.flatnonzero(n_judged != n_sig).tolist(),
                     n_judged[n_judged != n_sig].tolist(), strict=True):
        extra(i)["judged_samples"] = nj
    fit_extra = {i: p.fit.to_dict() for i, p in enumerate(plans) if p.fit is not None}
    if fit_extra:
        for i, sr in enumerate(ser):
            fx = fit_extra.get(sr.midx)
            if fx is not None and not raw_fb[i]:
                extra(i)["fleet_fit"] = fx
    if digests:
        for (ch, st, _), u, first in zip(parts, used, at[:-1], strict=True):
            judged = st.judged_mask()
            for i, r in enumerate(u.tolist(), start=first):
                if judged[r].any():
                    extra(i)["digest"] = digest_to_dict(digest_of(np.abs(ch.lat[r][judged[r]])))
    probe_p50: Iterable[float | None] = repeat(None)
    probe_p99: Iterable[float | None] = repeat(None)
    if any(cs.probe_q for _, _, cs in parts):
        pq: list[tuple[float | None, float | None]] = [_NONE2] * len(ser)
        for (_, _, cs), u, first in zip(parts, used, at[:-1], strict=True):
            for r, q in cs.probe_q.items():
                pq[first + int(np.searchsorted(u, r))] = (q[0], q[1])
        probe_p50, probe_p99 = [q[0] for q in pq], [q[1] for q in pq]
    signal_of = np.array([p.signal for p in plans], dtype=object)
    signals = signal_of[midx]
    signals[raw_fb] = sig.LATENCY
    cols: dict[str, Iterable[Any]] = {
        "node_id": list(map(_node_id_of, ser)),
        "model": list(map(_model_of, ser)),
        "tick_ts": repeat(now_s),
        "signal": signals.tolist(),
        "samples": n_sig.tolist(),
        "p50": _optional(q_sig[:, 0], no_sig),
        "p99": _optional(q_sig[:, 1], no_sig),
        "latency_p50_us": _optional(q_lat[:, 0], no_lat),
        "latency_p99_us": _optional(q_lat[:, 1], no_lat),
        "failed": [_failed_in(sr.failed, age_lo, now_s) if sr.failed else 0 for sr in ser],
        "hardware": list(map(_hardware_of, ser)),
        "first_seen_ts": list(map(_first_seen_of, ser)),
        "last_seen_ts": list(map(_last_seen_of, ser)),
        "probe_samples": cat(cs.n_probe for _, _, cs in parts).tolist(),
        "probe_p50": probe_p50,
        "probe_p99": probe_p99,
        "extra": extras,
        "fresh_samples": n_fresh.tolist(),
        "fresh_p50": _optional(q_fresh, np.isnan(q_fresh)),
        "requests_total": list(map(_requests_of, ser)),
        "failed_total": list(map(_failures_of, ser)),
        "instance_ts": list(map(_instance_ts_of, ser)),
        "resumed_ts": list(map(_resumed_ts_of, ser)),
        "fresh_over": _optional(n_over, n_over < 0),
    }
    # repeat() columns are endless; every list column has one entry per series.
    return list(map(_make_summary,
                    zip(*(cols[f] for f in WindowSummary._fields), strict=False)))


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


def _failed_in(failed: dict[int, int], age_lo: float, now_s: float) -> int:
    return sum(c for b, c in failed.items() if age_lo < b <= now_s)
