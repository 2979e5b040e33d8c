"""Stage 1: per-(node, model) sliding windows and their per-tick summaries.

:class:`WindowStore` owns, for every (node_id, model) it has seen, a ring of
the most recent ``window_size`` successful samples (probe samples included,
flagged), with event time, latency and — when the series carries them — the
request-size fields. It turns them into one
:class:`~app.core.types.WindowSummary` per series per tick. Its length is one concept's:
the ring layout (tiers of chunked numpy rows) and the vectorised passes over it are only
correct together, and splitting them would put the layout's invariants in two places.

Guarantees:

* Window content is exactly the last ``window_size`` ``ok`` samples observed
  for the series, in arrival order (the property tests check it). Failed
  (``ok: false``) samples are only counted, never part of a quantile.
* Judged samples at tick ``now_s``: ``ok``, non-probe, event time in
  ``(now_s − max_sample_age_s, now_s]`` — a quiet node is not judged on
  minutes-old samples (seed defect 4), and a sample from after the tick is
  not judged yet. For a series in ``judge_since`` (stage 2 passes the start
  of the current probe round of quarantined nodes, the end of warm-up, the
  probe round that re-admitted a node) judged samples are instead *all*
  ``ok`` samples, probe or not, with ``since_ts <= ts <= now_s``: after
  ejection probe traffic is the only traffic.
* The fleet-wide fit of the ``normalized`` signal is made from every
  series' judged samples (a cut-off applies to the fit as to the quantiles),
  except the series in ``out_of_fit`` (stage 2 passes the nodes out of
  routing: a slow node must not vote in its own reference).
* One signal per model per tick (``WindowSummary.signal``, see
  :mod:`app.core.signals`); ``p50``/``p99``/``samples`` are over the judged
  samples that have a value of that signal; ``latency_p50_us``/
  ``latency_p99_us`` over all judged samples' raw latency. Quantiles are
  exact (numpy selection, linear interpolation like ``numpy.quantile``) at
  any ``window_size``, also above 100,000 samples: the store keeps every
  sample anyway, and selecting ranks in a stored row (a sort, or
  ``np.partition``) costs less CPU than building a t-digest of it, so a
  sketch there would only lose accuracy. t-digests are used where a *mergeable* summary is
  needed: :meth:`WindowStore.model_digests` (cluster-wide P50/P99 per
  model) and ``summaries(digests=True)``.
* ``fresh_samples``/``fresh_p50``: the judged samples (with a value of the
  signal) whose event time is in ``(now_s − tick_interval_s, now_s]`` — the
  samples since the previous tick — and their exact P50, ``None`` below
  ``min_samples`` of them; when they are all the judged samples, the
  window's own P50. Time is ``now_s`` and the settings, so replay and the
  streaming stage 1 compute the same value.
* ``failed`` = failed requests with event time in the same age bound
  (bucketed to whole seconds); ``probe_*`` = probe samples within the age
  bound, in the model's signal. ``requests_total``/``failed_total``: every
  request the store has taken for the series (ok or failed, probes
  included) and the failed ones — cumulative counters, kept by snapshots.
* ``summaries()`` is pure: calling it does not change what the store holds
  (it only tightens cached per-ring bounds, see ``_Chunk``). Output is
  sorted by (model, node_id). ``restore(snapshot())`` gives identical future
  summaries; snapshots are plain JSON-able data.
* Memory: timestamps float64, latency float32 (probe = negative), size
  fields float32 only for series that carry them: 12 bytes per sample, i.e.
  ~12 KB per latency-only series at window_size 1000. Rings live in slabs of
  tiers of growing capacity (16, 128, 1024, … capped at window_size), so a
  10-sample series holds a 16-slot ring; a series moves up a tier when it
  outgrows its ring. Summaries compute over whole slabs at once, and over the
  steady-state rings of a whole tier (full, every sample judged, raw latency)
  together, one sort per ring for both the window and its fresh samples. After many
  series are forgotten (:meth:`WindowStore.forget_silent` of a flood's ids,
  :meth:`WindowStore.compact`), tiers whose slabs hold more than 4× the rings
  in use are repacked into slabs sized for what is left and the series map is
  rebuilt, so the memory is given back rather than kept as empty rows.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from app.core import signals as sig
from app.core.config import DetectorSettings
from app.core.events import Heartbeat, SampleBatch
from app.core.pools import ModelPool, build_pools
from app.core.quantiles import (
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
from app.core.types import WindowSummary

SeriesKey: TypeAlias = tuple[str, str]
F64: TypeAlias = npt.NDArray[np.float64]
F32: TypeAlias = npt.NDArray[np.float32]
I64: TypeAlias = npt.NDArray[np.int64]
Bools: TypeAlias = npt.NDArray[np.bool_]

SNAPSHOT_VERSION: Final = 1
_QS: Final = (0.5, 0.99)
#: Samples per series in a cluster pool or digest (``model_pools``' thinning).
POOL_SAMPLES_PER_SERIES: Final = 128
# Fresh samples above the model's tail threshold are counted for series with at most this many
# fresh samples in a tick (low rates; faster series have the window rules in time).
FRESH_TAIL_MAX_SAMPLES: Final = 600
# Signs of life (samples, heartbeats) within restart_gap_s after a gap that confirm a restart.
RESTART_CONFIRM_SIGNS: Final = 10
_Q50: Final = (0.5,)
_TIER_BASE: Final = 16
_TIER_GROWTH: Final = 8
_CHUNK_BYTES: Final = 4 << 20
_MIN_CHUNK_ROWS: Final = 4
_SIG_CODE: Final = {sig.LATENCY: 0, sig.TPOT: 1, sig.NORMALIZED: 2}
_FIT_SLOTS: Final = 256
# Sort keys of a tier's fast rows are built and sorted in blocks of at most this many bytes.
_FAST_BLOCK_BYTES: Final = 4 << 20
_NONE2: Final[tuple[None, None]] = (None, None)


class _Chunk:
    """A slab of ``rows`` rings of ``cap`` slots. Empty slots have NaN ts and latency.

    Per ring, ``ts_lo <= min(ts)``, ``ts_hi >= max(ts)`` and ``lat_lo <= min(lat)`` over
    the ring's filled slots: bounds kept on insert (a slot that leaves the ring can only
    loosen them) and tightened to the exact values when a tick needs them
    (:func:`_pass1`), so most full rings are proven "clean" without a pass over them.
    """

    __slots__ = ("cap", "fill", "free", "head", "inp", "lat", "lat_lo", "midx", "out", "rows",
                 "series", "sized", "ts", "ts_hi", "ts_lo", "ttft", "used")

    def __init__(self, cap: int, rows: int, sized: bool) -> None:
        self.cap, self.rows, self.sized = cap, rows, sized
        self.ts: F64 = np.full((rows, cap), np.nan)
        self.lat: F32 = np.full((rows, cap), np.nan, dtype=np.float32)
        self.inp: F32 | None = None
        self.out: F32 | None = None
        self.ttft: F32 | None = None
        if sized:
            self.inp = np.full((rows, cap), np.nan, dtype=np.float32)
            self.out = np.full((rows, cap), np.nan, dtype=np.float32)
            self.ttft = np.full((rows, cap), np.nan, dtype=np.float32)
        self.head: I64 = np.zeros(rows, dtype=np.int64)
        self.fill: I64 = np.zeros(rows, dtype=np.int64)
        self.midx: I64 = np.full(rows, -1, dtype=np.int64)
        self.ts_lo: F64 = np.full(rows, np.inf)
        self.ts_hi: F64 = np.full(rows, -np.inf)
        self.lat_lo: F64 = np.full(rows, np.inf)
        self.series: list[_Series | None] = [None] * rows
        self.free: list[int] = list(range(rows - 1, -1, -1))
        self.used = 0

    def columns(self) -> list[npt.NDArray[Any]]:
        cols: list[npt.NDArray[Any]] = [self.ts, self.lat]
        if self.sized:
            cols += [self.inp, self.out, self.ttft]  # type: ignore[list-item]
        return cols

    def order(self, row: int) -> I64:
        """Slot indices of ``row`` from oldest to newest."""
        fill, head = int(self.fill[row]), int(self.head[row])
        return (head - fill + np.arange(fill, dtype=np.int64)) % self.cap

    def release(self, row: int) -> None:
        for col in self.columns():
            col[row] = np.nan
        self.fill[row] = self.head[row] = 0
        self.midx[row] = -1
        self.ts_lo[row], self.ts_hi[row], self.lat_lo[row] = np.inf, -np.inf, np.inf
        self.series[row] = None
        self.free.append(row)
        self.used -= 1

    def take_rows(self, src: _Chunk, rows: I64, at: int) -> None:
        """Move ``src``'s rings ``rows`` (same tier) to this slab's rows ``at``, ``at + 1``, …,
        which must be unused; ``src`` is left as it was (the caller drops it)."""
        to = slice(at, at + rows.size)
        for dst_col, src_col in zip(self.columns(), src.columns(), strict=True):
            dst_col[to] = src_col[rows]
        for name in ("head", "fill", "midx", "ts_lo", "ts_hi", "lat_lo"):
            getattr(self, name)[to] = getattr(src, name)[rows]
        for i, r in enumerate(rows.tolist(), start=at):
            s = src.series[r]
            assert s is not None
            self.series[i] = s
            s.chunk, s.row = self, i
        self.used += rows.size
        self.free = [r for r in self.free if not at <= r < at + rows.size]


class _Series:
    __slots__ = ("chunk", "failed", "failures", "first_seen_ts", "gap_s", "hardware", "instance",
                 "instance_ts", "last_seen_ts", "midx", "model", "node_id", "requests", "resume_signs",
                 "resume_ts", "resumed_ts", "row", "signs")

    def __init__(self, node_id: str, model: str, midx: int) -> None:
        self.node_id, self.model, self.midx = node_id, model, midx
        self.hardware: str | None = None
        self.first_seen_ts: float | None = None
        self.last_seen_ts: float | None = None
        self.failed: dict[int, int] = {}
        self.requests = self.failures = 0      # every request taken, and the failed ones
        self.chunk: _Chunk | None = None
        self.row = -1
        # Restarts: the reporting process (event "instance"), when a new one was first seen,
        # and when signs of life last resumed after a gap; signs = samples and heartbeats seen,
        # gap_s = an EWMA of the time between them (the scale a restart gap is measured on).
        self.instance: str | None = None
        self.instance_ts: float | None = None
        self.resumed_ts: float | None = None
        self.signs = 0
        self.gap_s = 0.0
        self.resume_ts: float | None = None     # a gap seen, its restart not yet confirmed
        self.resume_signs = 0

    def seen(self, lo: float, hi: float, instance: str | None = None, gap_s: float = 0.0,
             n: int = 1, ts: F64 | None = None) -> None:
        """``n`` signs of life from ``lo`` to ``hi`` (event time; ``ts`` each, or None for one)
        of process ``instance``.

        A new instance marks a restart at once (``instance_ts``). Signs that resume after a gap
        longer than ``gap_s`` and than 20 of the series' recent gaps (an EWMA) mark one
        (``resumed_ts``) once ``RESTART_CONFIRM_SIGNS`` signs follow within ``gap_s``: a node
        back at work, not a trickle after a traffic drop.
        """
        last = self.last_seen_ts
        if instance is not None:
            if self.instance is not None and instance != self.instance:
                self.instance_ts = lo
            self.instance = instance
        if last is not None and hi >= last:
            gap = lo - last
            if gap_s > 0 and gap > gap_s and self.signs >= 3 and gap > 20.0 * self.gap_s:
                self.resume_ts, self.resume_signs = lo, 0
            mean = (hi - last) / n
            self.gap_s = mean if self.signs == 1 else self.gap_s + 0.2 * (mean - self.gap_s)
        pending = self.resume_ts
        if pending is not None:
            until = pending + gap_s
            self.resume_signs += (n if hi <= until else int(np.count_nonzero(ts <= until)) if ts is not None
                                  else int(lo <= until))
            if self.resume_signs >= RESTART_CONFIRM_SIGNS:
                self.resumed_ts, self.resume_ts = pending, None
            elif lo > until:
                self.resume_ts = None
        self.signs += n
        if self.first_seen_ts is None or lo < self.first_seen_ts:
            self.first_seen_ts = lo
        if last is None or hi > last:
            self.last_seen_ts = hi


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

    def __init__(self, ch: _Chunk, clean: Bools, dirty: I64, judged_d: Bools, probe_d: Bools,
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


def _pass1(ch: _Chunk, now_s: float, age_lo: float,
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
    ``n_over`` -1 = not counted), and its fast rows (``WindowStore._fast_stats``)."""

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


def _fast_block(items: Sequence[tuple[_Chunk, _Stats]], n: int, cap: int, fresh_lo: float,
                refs: F64, min_fresh: int) -> None:
    """``WindowStore._fast_stats`` for the fast rows of ``items`` (``n`` rows of ``cap`` slots,
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


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while one tuple per series is made.

    Every allocation of a container counts towards the collector's next pass, and a
    tick makes tens of thousands (summaries and their sort keys, none of them in a
    cycle): paused, the collector runs once after the batch instead of many times
    during it, and its older generations, whose passes cost most, far less often.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _optional(values: npt.NDArray[Any], none: Bools) -> list[Any]:
    """``values`` as Python numbers, ``None`` where ``none``."""
    out = values.astype(object)
    out[none] = None
    return list(out.tolist())


class WindowStore:
    """Sliding windows of every (node_id, model); see the module docstring."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self._window = settings.window_size
        caps: list[int] = []
        c = _TIER_BASE
        while c < self._window:
            caps.append(c)
            c *= _TIER_GROWTH
        caps.append(self._window)
        self._caps: tuple[int, ...] = tuple(caps)
        self._tiers: dict[tuple[int, bool], list[_Chunk]] = {}
        self._series: dict[SeriesKey, _Series] = {}
        self._models: dict[str, int] = {}
        self._model_names: list[str] = []

    # ------------------------------------------------------------ bookkeeping

    def series_count(self) -> int:
        return len(self._series)

    def nbytes(self) -> int:
        """Bytes held by the window slabs (every row, used or free)."""
        return sum(col.nbytes for tier in self._tiers.values() for ch in tier
                   for col in ch.columns())

    def keys(self) -> Iterator[SeriesKey]:
        return iter(self._series)

    def models(self) -> list[str]:
        return sorted({s.model for s in self._series.values()})

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def _get(self, node_id: str, model: str) -> _Series:
        s = self._series.get((node_id, model))
        if s is None:
            midx = self._models.get(model)
            if midx is None:
                midx = self._models[model] = len(self._model_names)
                self._model_names.append(model)
            s = self._series[(node_id, model)] = _Series(node_id, model, midx)
        return s

    def forget(self, node_id: str, model: str) -> bool:
        """Drop a series and its window; ``False`` if it was unknown."""
        s = self._series.pop((node_id, model), None)
        if s is None:
            return False
        if s.chunk is not None:
            self._release(s.chunk, s.row)
        return True

    def forget_silent(self, before_s: float) -> list[SeriesKey]:
        """Drop every series whose last sample or heartbeat (event time) is before ``before_s``.

        Bounds the store when node ids churn (replaced hosts, autoscaled pods): a series
        that came back would start over as new. When at least as many series were dropped
        as are left (a flood's ids forgotten), the store is compacted (:meth:`compact`).
        Returns the forgotten keys (sorted).
        """
        gone = sorted(k for k, s in self._series.items()
                      if s.last_seen_ts is not None and s.last_seen_ts < before_s)
        for node, model in gone:
            self.forget(node, model)
        if gone and len(gone) >= len(self._series):
            self.compact()
        return gone

    def compact(self) -> int:
        """Give back the memory of forgotten series; returns how many ring rows were freed.

        Every tier whose slabs have more than 4× as many rows as rings in use is repacked
        into new slabs sized for the rings left (a flood leaves thousands of rows of a
        small tier behind, a few still used), and the series map is rebuilt (a dict keeps
        its largest table). Windows, and so summaries, are unchanged. Cost: one copy of
        the rings moved; nothing when there is nothing to give back.
        """
        freed = 0
        for key, chunks in self._tiers.items():
            used = sum(ch.used for ch in chunks)
            if sum(ch.rows for ch in chunks) <= 4 * max(used, _MIN_CHUNK_ROWS):
                continue
            cap, sized = key
            new: list[_Chunk] = []
            dst: _Chunk | None = None
            at = 0
            left = used
            for ch in chunks:
                rows = np.flatnonzero(ch.midx >= 0)
                while rows.size:
                    if dst is None or at == dst.rows:
                        dst = _Chunk(cap, min(self._max_rows(cap, sized),
                                              max(_MIN_CHUNK_ROWS, left)), sized)
                        new.append(dst)
                        at = 0
                    k = min(rows.size, dst.rows - at)
                    dst.take_rows(ch, rows[:k], at)
                    at, left, rows = at + k, left - k, rows[k:]
            freed += sum(ch.rows for ch in chunks) - sum(ch.rows for ch in new)
            self._tiers[key] = new
        self._series = dict(self._series)
        return freed

    @staticmethod
    def _max_rows(cap: int, sized: bool) -> int:
        slot_bytes = 8 + 4 + (12 if sized else 0)
        return max(_MIN_CHUNK_ROWS, _CHUNK_BYTES // (cap * slot_bytes))

    def _release(self, ch: _Chunk, row: int) -> None:
        ch.release(row)
        if ch.used == 0:  # series outgrow small tiers: give their slabs back
            self._tiers[(ch.cap, ch.sized)].remove(ch)

    def _alloc(self, cap: int, sized: bool, s: _Series) -> tuple[_Chunk, int]:
        chunks = self._tiers.setdefault((cap, sized), [])
        for ch in chunks:
            if ch.free:
                break
        else:
            max_rows = self._max_rows(cap, sized)
            rows = min(max_rows, max(_MIN_CHUNK_ROWS, 2 * (chunks[-1].rows if chunks else 2)))
            ch = _Chunk(cap, rows, sized)
            chunks.append(ch)
        row = ch.free.pop()
        ch.series[row] = s
        ch.midx[row] = s.midx
        ch.used += 1
        return ch, row

    def _place(self, s: _Series, need: int, sized: bool) -> None:
        """Make ``s`` own a ring that can take ``need`` samples without loss below
        window_size, in a sized slab if ``sized``; move its samples if needed."""
        old, orow = s.chunk, s.row
        cap = next((c for c in self._caps if c >= min(need, self._window)), self._window)
        if old is not None:
            sized = sized or old.sized
            if old.cap >= cap and old.sized == sized:
                return
            cap = max(cap, old.cap)
        ch, row = self._alloc(cap, sized, s)
        if old is not None:
            order = old.order(orow)
            n = order.size
            ch.ts[row, :n] = old.ts[orow, order]
            ch.lat[row, :n] = old.lat[orow, order]
            if old.sized:
                assert ch.inp is not None and ch.out is not None and ch.ttft is not None
                ch.inp[row, :n] = old.inp[orow, order]  # type: ignore[index]
                ch.out[row, :n] = old.out[orow, order]  # type: ignore[index]
                ch.ttft[row, :n] = old.ttft[orow, order]  # type: ignore[index]
            ch.fill[row] = n
            ch.head[row] = n % ch.cap
            ch.ts_lo[row], ch.ts_hi[row], ch.lat_lo[row] = old.ts_lo[orow], old.ts_hi[orow], old.lat_lo[orow]
            self._release(old, orow)
        s.chunk, s.row = ch, row

    # ------------------------------------------------------------ observe

    def observe_heartbeat(self, hb: Heartbeat) -> None:
        """Make the series known (first/last seen, hardware) without samples."""
        s = self._get(hb.node_id, hb.model)
        if hb.hardware is not None:
            s.hardware = hb.hardware
        s.seen(hb.ts, hb.ts, hb.instance, self.settings.restart_gap_s)

    def observe(self, batch: SampleBatch) -> None:
        """Add a batch's samples (vectorized; arrival order = array order)."""
        s = self._get(batch.node_id, batch.model)
        if batch.hardware is not None:
            s.hardware = batch.hardware
        n = len(batch)
        if n == 0:
            return
        ts = batch.ts
        if n == 1:
            t_lo = t_hi = float(ts[0])
        else:
            t_lo, t_hi = float(ts.min()), float(ts.max())
        if batch.parts:     # several messages: signs of life are counted per message
            lo = 0
            for k in batch.parts:
                part = ts[lo:lo + k]
                p_lo, p_hi = (float(part.min()), float(part.max())) if k > 1 else (
                    float(part[0]), float(part[0]))
                s.seen(p_lo, p_hi, batch.instance, self.settings.restart_gap_s, k, part)
                lo += k
        else:
            s.seen(t_lo, t_hi, batch.instance, self.settings.restart_gap_s, n, ts)
        s.requests += n
        ok = batch.ok
        lat = batch.latency_us
        inp, out, ttft = batch.input_tokens, batch.output_tokens, batch.ttft_us
        if not ok.all():
            s.failures += n - int(np.count_nonzero(ok))
            self._count_failed(s, ts[~ok])
            ts, lat = ts[ok], lat[ok]
            inp = None if inp is None else inp[ok]
            out = None if out is None else out[ok]
            ttft = None if ttft is None else ttft[ok]
            n = int(ts.shape[0])
            if n == 0:
                return
        signed = np.where(batch.probe if ok.all() else batch.probe[ok], -lat, lat)
        sized = inp is not None or out is not None or ttft is not None
        ch = s.chunk
        fill = 0 if ch is None else int(ch.fill[s.row])
        if ch is None or (sized and not ch.sized) or (ch.cap < self._window and fill + n > ch.cap):
            self._place(s, fill + n, sized)
            ch = s.chunk
            assert ch is not None
        row, cap = s.row, ch.cap
        lat_lo = float(signed.min())
        if n >= cap:                            # the ring is replaced: its bounds are the batch's
            kept_ts = ts[n - cap:]
            ch.ts_lo[row], ch.ts_hi[row] = float(kept_ts.min()), float(kept_ts.max())
            ch.lat_lo[row] = float(signed[n - cap:].min())
        else:
            ch.ts_lo[row] = min(float(ch.ts_lo[row]), t_lo)
            ch.ts_hi[row] = max(float(ch.ts_hi[row]), t_hi)
            ch.lat_lo[row] = min(float(ch.lat_lo[row]), lat_lo)
        cols: list[tuple[npt.NDArray[Any], npt.NDArray[Any] | None]] = [
            (ch.ts, ts), (ch.lat, signed)]
        if ch.sized:
            cols += [(ch.inp, inp), (ch.out, out), (ch.ttft, ttft)]  # type: ignore[list-item]
        if n >= cap:
            for dst, src in cols:
                dst[row] = np.nan if src is None else src[n - cap:]
            ch.head[row] = 0
            ch.fill[row] = cap
            return
        head = int(ch.head[row])
        first = min(n, cap - head)
        for dst, src in cols:
            if src is None:
                dst[row, head:head + first] = np.nan
                dst[row, :n - first] = np.nan
            else:
                dst[row, head:head + first] = src[:first]
                dst[row, :n - first] = src[first:]
        ch.head[row] = (head + n) % cap
        ch.fill[row] = min(cap, fill + n)

    def _count_failed(self, s: _Series, fts: F64) -> None:
        buckets, counts = np.unique(np.floor(fts).astype(np.int64), return_counts=True)
        failed = s.failed
        for b, c in zip(buckets.tolist(), counts.tolist(), strict=True):
            failed[b] = failed.get(b, 0) + c
        if s.last_seen_ts is not None and len(failed) > 64:
            horizon = int(s.last_seen_ts - self.settings.max_sample_age_s) - 1
            for b in [b for b in failed if b < horizon]:
                del failed[b]

    # ------------------------------------------------------------ summaries

    def summaries(self, now_s: float,
                  judge_since: Mapping[SeriesKey, float] | None = None,
                  *, out_of_fit: Collection[SeriesKey] = (),
                  digests: bool = False,
                  tail_refs: Mapping[str, float] | None = None) -> list[WindowSummary]:
        """One summary per known series at event time ``now_s`` (module docstring).

        ``judge_since``: ``{key: since_ts}`` cut-offs of judged samples;
        ``out_of_fit``: series left out of the fleet-wide ``normalized`` fit.

        ``digests=True`` adds ``extra["digest"]``: a t-digest dict of the judged
        raw latency, mergeable across nodes (opt-in: it costs more than the rest).
        ``tail_refs``: ``{model: threshold}`` in the model's signal units; series with at most
        ``FRESH_TAIL_MAX_SAMPLES`` fresh samples get ``fresh_over`` counted against it.
        """
        age_lo = now_s - self.settings.max_sample_age_s
        fresh_lo = now_s - self.settings.tick_interval_s
        since_by_chunk: dict[int, list[tuple[int, float]]] = {}
        for key, since in (judge_since or {}).items():
            s = self._series.get(key)
            if s is not None and s.chunk is not None:
                since_by_chunk.setdefault(id(s.chunk), []).append((s.row, float(since)))
        unfit_by_chunk: dict[int, list[int]] = {}
        for key in out_of_fit:
            s = self._series.get(key)
            if s is not None and s.chunk is not None:
                unfit_by_chunk.setdefault(id(s.chunk), []).append(s.row)
        chunks = [ch for tier in self._tiers.values() for ch in tier if ch.used]
        nm = len(self._model_names)
        judged_m = np.zeros(nm)
        tpot_m = np.zeros(nm)
        out_m = np.zeros(nm)
        inout_m = np.zeros(nm)
        states: list[_Pass1] = []
        for ch in chunks:
            st = _pass1(ch, now_s, age_lo, since_by_chunk.get(id(ch)))
            states.append(st)
            used = ch.midx >= 0
            m = ch.midx[used]
            judged_m += np.bincount(m, st.n_judged[used], minlength=nm)
            if ch.sized:
                assert ch.out is not None and ch.ttft is not None and ch.inp is not None
                judged = st.judged_mask()
                j_out = judged & ~np.isnan(ch.out)
                j_tpot = j_out & (ch.out >= 2) & ~np.isnan(ch.ttft)
                j_inout = j_out & ~np.isnan(ch.inp)
                tpot_m += np.bincount(m, j_tpot[used].sum(axis=1), minlength=nm)
                out_m += np.bincount(m, j_out[used].sum(axis=1), minlength=nm)
                inout_m += np.bincount(m, j_inout[used].sum(axis=1), minlength=nm)
        plans = self._plans(chunks, states, judged_m, tpot_m, out_m, inout_m, unfit_by_chunk)
        results: list[WindowSummary] = []
        refs = np.full(max(1, nm), np.nan)
        for name, ref in (tail_refs or {}).items():
            i = self._models.get(name)
            if i is not None:
                refs[i] = ref
        stats = [self._chunk_stats(ch, st, plans, fresh_lo, refs)
                 for ch, st in zip(chunks, states, strict=True)]
        self._fast_stats(list(zip(chunks, stats, strict=True)), fresh_lo, refs)
        with _collector_paused():
            results.extend(self._build(list(zip(chunks, states, stats, strict=True)), plans,
                                       now_s, age_lo, digests))
            for s in self._series.values():
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

    def model_pools(self, now_s: float, *, per_series: int = POOL_SAMPLES_PER_SERIES,
                    models: Collection[str] | None = None,
                    qs: Sequence[float] = ()) -> dict[str, ModelPool]:
        """Per model, the cluster-wide pool of raw latency at ``now_s`` (unsorted float32).

        The pool is every series' judged samples (``ok``, non-probe, event time in
        ``(now_s - max_sample_age_s, now_s]``; ``judge_since`` cut-offs do not apply),
        thinned by one slot stride ``ceil(window_size / per_series)`` in every ring: each
        judged sample is kept at the same rate, so the pool is an even thinning of the
        fleet's samples (a busy node weighs as its traffic, as in the exact pooled quantile)
        and a series gives at most ``per_series`` samples. Models without a kept sample are
        left out; ``models`` restricts the answer. ``qs``: also compute every pool's exact
        quantiles there (``ModelPool.at_qs``, all pools at once).
        Cost: one strided copy of every ring, straight into one buffer holding every pool
        (:func:`app.core.pools.build_pools`).
        """
        if per_series < 1:
            raise ValueError(f"per_series must be >= 1, got {per_series}")
        stride = -(-self._window // per_series)
        age_lo = now_s - self.settings.max_sample_age_s
        nm = len(self._model_names)
        want = np.ones(nm + 1, dtype=bool)
        if models is not None:
            want[:] = False
            want[[self._models[m] for m in models if m in self._models]] = True
        want[nm] = False                        # free rows have midx -1: they read want[-1]
        chunks = [ch for tier in self._tiers.values() for ch in tier if ch.used]
        return build_pools(chunks, self._model_names, want, stride, age_lo, now_s, tuple(qs))

    def model_digests(self, now_s: float, *, per_series: int = POOL_SAMPLES_PER_SERIES,
                      models: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
        """Per model, one t-digest (as its dict) of :meth:`model_pools`' pool.

        Built offline from the sorted pool (``digest_dict_of_sorted``). Each dict also
        holds ``"nodes"``: the series that gave samples (``digest_from_dict`` ignores it).
        Merge workers' dicts with ``merge_digests``.
        """
        return {m: pool.digest_dict()
                for m, pool in self.model_pools(now_s, per_series=per_series, models=models).items()}

    def _plans(self, chunks: list[_Chunk], states: list[_Pass1], judged_m: F64, tpot_m: F64,
               out_m: F64, inout_m: F64, unfit_by_chunk: Mapping[int, list[int]]) -> list[_ModelPlan]:
        signals = [sig.choose_signal(self.settings.signal_for(name), int(judged_m[i]),
                                     int(tpot_m[i]), int(out_m[i]))
                   for i, name in enumerate(self._model_names)]
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

    def _values(self, ch: _Chunk, rows: I64, codes: I64, plans: list[_ModelPlan]) -> F32:
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

    def _chunk_stats(self, ch: _Chunk, st: _Pass1, plans: list[_ModelPlan], fresh_lo: float,
                     refs: F64) -> _Stats:
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
        min_fresh = self.settings.min_samples
        judged = st.judged_rows(slow)
        code = rows_code[slow]
        vals = self._values(ch, slow, code, plans)
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
        self._fresh_p50s(slow, fresh_mask, vals, cs.n_sig, min_fresh, cs.n_fresh, cs.q_fresh)
        self._fresh_over(slow, fresh_mask, vals, refs[np.maximum(ch.midx, 0)], cs.n_fresh,
                         cs.n_over)
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

    def _fast_stats(self, work: Sequence[tuple[_Chunk, _Stats]], fresh_lo: float,
                    refs: F64) -> None:
        """Fill in the fast rows (clean: every slot judged, raw latency, no probe) of every
        chunk, a tier's rows together in blocks of up to ``_FAST_BLOCK_BYTES`` of keys.

        One sort per row serves both the window and its fresh samples: the keys are the
        latency bits with the run flag on the samples that are not fresh
        (:func:`~app.core.quantiles.to_run_keys`), so a sorted row is ``[fresh ascending |
        older ascending]``. The fresh count is where the runs meet, the
        window's P50/P99 selected across both runs
        (:func:`~app.core.quantiles.select_two_runs`), the fresh P50 read by index and
        ``fresh_over`` counted by a binary search of the fresh run.
        """
        by_cap: dict[int, list[tuple[_Chunk, _Stats]]] = {}
        for ch, cs in work:
            if cs.fast.size:
                by_cap.setdefault(ch.cap, []).append((ch, cs))
        min_fresh = self.settings.min_samples
        for cap, items in by_cap.items():
            block_rows = max(_MIN_CHUNK_ROWS, _FAST_BLOCK_BYTES // (4 * cap))
            while items:
                n = 0
                take = 0
                while take < len(items) and (take == 0 or n + items[take][1].fast.size <= block_rows):
                    n += items[take][1].fast.size
                    take += 1
                _fast_block(items[:take], n, cap, fresh_lo, refs, min_fresh)
                items = items[take:]

    def _build(self, parts: Sequence[tuple[_Chunk, _Pass1, _Stats]], plans: list[_ModelPlan],
               now_s: float, age_lo: float, digests: bool) -> list[WindowSummary]:
        """The summaries of every used row of ``parts``' chunks, in chunk order.

        Built by field name, one column per field for all chunks at once, then one tuple per
        series: cheaper than a keyword call of WindowSummary's fields, and the numeric
        columns need no per-series Python loop (``_optional``)."""
        if not parts:
            return []
        min_fresh = self.settings.min_samples
        used = [np.flatnonzero(ch.midx >= 0) for ch, _, _ in parts]
        at = np.cumsum([0] + [u.size for u in used]).tolist()     # each chunk's first index

        def cat(arrs: Iterable[npt.NDArray[Any]]) -> npt.NDArray[Any]:
            return np.concatenate([x[u] for x, u in zip(arrs, used, strict=True)])

        ser: list[_Series] = []
        for (ch, _, _), u in zip(parts, used, strict=True):
            ser.extend(sr for r in u.tolist() if (sr := ch.series[r]) is not None)
        assert len(ser) == at[-1]
        n_sig = cat(cs.n_sig for _, _, cs in parts)
        n_judged = cat(st.n_judged for _, st, _ in parts)
        q_sig = cat(cs.q_sig for _, _, cs in parts)
        q_lat = cat(cs.q_lat for _, _, cs in parts)
        n_fresh = cat(cs.n_fresh for _, _, cs in parts)
        q_fresh = cat(cs.q_fresh for _, _, cs in parts)
        # A window whose judged samples are all fresh has its own P50 as the fresh P50.
        whole = (n_fresh == n_sig) & (n_sig >= min_fresh)
        q_fresh[whole] = q_sig[whole, 0]
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
                if fx is not None:
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
        cols: dict[str, Iterable[Any]] = {
            "node_id": list(map(_node_id_of, ser)),
            "model": list(map(_model_of, ser)),
            "tick_ts": repeat(now_s),
            "signal": signal_of[cat(ch.midx for ch, _, _ in parts)].tolist(),
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
            "fresh_over": _optional(n_over := cat(cs.n_over for _, _, cs in parts), n_over < 0),
        }
        # repeat() columns are endless; every list column has one entry per series.
        return list(map(_make_summary,
                        zip(*(cols[f] for f in WindowSummary._fields), strict=False)))

    @staticmethod
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

    @staticmethod
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

    # ------------------------------------------------------------ snapshot

    def window(self, node_id: str, model: str) -> dict[str, F64] | None:
        """The series' ring, oldest first: ``ts``, ``latency_us``, ``probe`` (0/1)
        and, for sized series, ``input_tokens``/``output_tokens``/``ttft_us``."""
        s = self._series.get((node_id, model))
        if s is None:
            return None
        if s.chunk is None:
            return {"ts": np.zeros(0), "latency_us": np.zeros(0), "probe": np.zeros(0)}
        ch, row = s.chunk, s.row
        order = ch.order(row)
        lat = ch.lat[row, order].astype(np.float64)
        out = {"ts": ch.ts[row, order], "latency_us": np.abs(lat),
               "probe": (lat < 0).astype(np.float64)}
        if ch.sized:
            assert ch.inp is not None and ch.out is not None and ch.ttft is not None
            out["input_tokens"] = ch.inp[row, order].astype(np.float64)
            out["output_tokens"] = ch.out[row, order].astype(np.float64)
            out["ttft_us"] = ch.ttft[row, order].astype(np.float64)
        return out

    def snapshot(self) -> dict[str, Any]:
        """Everything the store holds, as JSON-able data (NaN written as null)."""
        series = []
        for (node, model), s in sorted(self._series.items()):
            w = self.window(node, model)
            assert w is not None
            item: dict[str, Any] = {
                "node_id": node, "model": model, "hardware": s.hardware,
                "first_seen_ts": s.first_seen_ts, "last_seen_ts": s.last_seen_ts,
                "failed": sorted([b, c] for b, c in s.failed.items()),
                "requests": s.requests, "failures": s.failures,
                "instance": s.instance, "instance_ts": s.instance_ts, "resumed_ts": s.resumed_ts,
                "signs": s.signs, "gap_s": s.gap_s,
                "ts": w["ts"].tolist(), "latency_us": w["latency_us"].tolist(),
                "probe": np.flatnonzero(w["probe"]).tolist(),
            }
            for k in ("input_tokens", "output_tokens", "ttft_us"):
                if k in w:
                    item[k] = [None if v != v else v for v in w[k].tolist()]
            series.append(item)
        return {"version": SNAPSHOT_VERSION, "window_size": self._window, "series": series}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the store's content with a :meth:`snapshot` (any window_size:
        a larger snapshot window keeps only each series' newest samples)."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"window snapshot version {data.get('version')!r} is not"
                             f" {SNAPSHOT_VERSION}; cannot restore")
        self._tiers.clear()
        self._series.clear()
        self._models.clear()
        self._model_names.clear()
        for item in data["series"]:
            s = self._get(item["node_id"], item["model"])
            s.hardware = item.get("hardware")
            s.first_seen_ts = item.get("first_seen_ts")
            s.last_seen_ts = item.get("last_seen_ts")
            s.failed = {int(b): int(c) for b, c in item.get("failed", [])}
            counts = int(item.get("requests", 0)), int(item.get("failures", 0))
            life = (item.get("instance"), item.get("instance_ts"), item.get("resumed_ts"),
                    int(item.get("signs", 0)), float(item.get("gap_s", 0.0)))
            ts = np.asarray(item["ts"], dtype=np.float64)
            if ts.size == 0:
                s.requests, s.failures = counts
                s.instance, s.instance_ts, s.resumed_ts, s.signs, s.gap_s = life
                continue
            lat = np.asarray(item["latency_us"], dtype=np.float64)
            probe = np.zeros(ts.size, dtype=bool)
            probe[np.asarray(item.get("probe", []), dtype=np.int64)] = True
            first, last = s.first_seen_ts, s.last_seen_ts
            self.observe(SampleBatch(s.node_id, s.model, s.hardware, ts, lat,
                                     np.ones(ts.size, dtype=bool), probe, _column(item, "input_tokens"),
                                     _column(item, "output_tokens"), _column(item, "ttft_us")))
            s.first_seen_ts, s.last_seen_ts = first, last
            s.requests, s.failures = counts
            s.instance, s.instance_ts, s.resumed_ts, s.signs, s.gap_s = life


def _column(item: Mapping[str, Any], key: str) -> F64 | None:
    v = item.get(key)
    return None if v is None else np.array(v, dtype=np.float64)


def _failed_in(failed: dict[int, int], age_lo: float, now_s: float) -> int:
    return sum(c for b, c in failed.items() if age_lo < b <= now_s)
