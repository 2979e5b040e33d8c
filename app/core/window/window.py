"""Stage 1: per-(node, model) sliding windows and their per-tick summaries.

:class:`WindowStore` owns, for every (node_id, model) it has seen, a ring of the most recent
``window_size`` successful samples (probes included, flagged) with event time, latency and,
when the series carries them, the request-size fields (slabs of :mod:`tailguard.core.window.rings`).
:meth:`WindowStore.summaries` turns them into one ``WindowSummary`` per series per tick
(:mod:`tailguard.core.window.summarize` says which samples each field is over);
:meth:`WindowStore.model_pools` gives the cluster-wide pools per model (:mod:`tailguard.core.window.pools`),
from the slots the tick's summary pass captured while no ring was written since, else the rings.

Guarantees:

* Window content is exactly the last ``window_size`` ``ok`` samples observed for the series,
  in arrival order (the property tests check it). Failed (``ok: false``) samples are only
  counted, per second of event time, never part of a quantile.
* ``requests_total``/``failed_total``: every request the store has taken for the series (ok
  or failed, probes included) and the failed ones — cumulative counters, kept by snapshots.
* ``restore(snapshot())`` gives identical future summaries and pools; snapshots are plain JSON-able data.
* A series moves up a tier when it outgrows its ring (:mod:`tailguard.core.window.tiers`); sparse
  tiers left by a flood of forgotten series are repacked (:meth:`WindowStore.compact`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window.hist_window import HistWindows
from tailguard.core.window.passes import FRESH_TAIL_MAX_SAMPLES
from tailguard.core.window.pools import ModelPool, PoolCapture, build_pools
from tailguard.core.window.rings import F64, RESTART_CONFIRM_SIGNS, SeriesKey, SeriesRecord
from tailguard.core.window.signals import ModelChoice
from tailguard.core.window.summarize import SummaryOrder, summarize
from tailguard.core.window.tiers import RingTiers

__all__ = ["FRESH_TAIL_MAX_SAMPLES", "POOL_SAMPLES_PER_SERIES", "RESTART_CONFIRM_SIGNS", "SNAPSHOT_VERSION",
           "SeriesKey", "WindowStore"]

SNAPSHOT_VERSION: Final = 1
#: Samples per series in a cluster pool or digest (``model_pools``' thinning).
POOL_SAMPLES_PER_SERIES: Final = 128


class WindowStore:
    """Sliding windows of every (node_id, model); see the module docstring."""

    def __init__(self, settings: DetectorSettings, *,
                 pause_collector: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        self.settings = settings
        self.pause_collector = pause_collector   # summarize()'s pause: the caller's gc choice
        self._window = settings.window_size
        self.tiers = RingTiers(self._window)     # where each ring sits (tailguard.core.window.tiers)
        self._series: dict[SeriesKey, SeriesRecord] = {}
        self._models: dict[str, int] = {}
        self._model_names: list[str] = []
        self._hists = HistWindows(settings)     # histogram pairs' intervals (tailguard.core.window.hist_window)
        self._order = SummaryOrder()            # the rows' order and seldom-changed fields, kept
        # At most every series' last_seen_ts (which only grows); -inf when not known.
        self._seen_floor = -math.inf
        # Ring writes (observe); with tiers.layout (rows taken, freed, moved) the version of
        # the slabs' content: while it stands, no ring changed.
        self._writes = 0
        # The pool slots of the fast rings, taken by the last summary pass (model_pools).
        self._capture = PoolCapture(-(-self._window // POOL_SAMPLES_PER_SERIES))

    # ------------------------------------------------------------ bookkeeping

    def series_count(self) -> int:
        return len(self._series)

    def nbytes(self) -> int:
        """Bytes held by the window slabs (every row, used or free)."""
        return self.tiers.nbytes()

    def keys(self) -> Iterator[SeriesKey]:
        return iter(self._series)

    def models(self) -> list[str]:
        return sorted({s.model for s in self._series.values()})

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def _get(self, node_id: str, model: str) -> SeriesRecord:
        s = self._series.get((node_id, model))
        if s is None:
            midx = self._models.get(model)
            if midx is None:
                midx = self._models[model] = len(self._model_names)
                self._model_names.append(model)
            s = self._series[(node_id, model)] = SeriesRecord(node_id, model, midx)
            self._seen_floor = -math.inf
        return s

    def forget(self, node_id: str, model: str) -> bool:
        """Drop a series and its window; ``False`` if it was unknown."""
        s = self._series.pop((node_id, model), None)
        self._hists.forget((node_id, model))
        if s is None:
            return False
        if s.chunk is not None:
            self.tiers.release(s.chunk, s.row)
        return True

    def forget_silent(self, before_s: float) -> list[SeriesKey]:
        """Drop every series whose last sample or heartbeat (event time) is before ``before_s``.

        Bounds the store when node ids churn (replaced hosts, autoscaled pods): a series
        that came back would start over as new. When at least as many series were dropped
        as are left (a flood's ids forgotten), the store is compacted (:meth:`compact`).
        Returns the forgotten keys (sorted).
        """
        if before_s <= self._seen_floor:        # no series last seen before it (most ticks)
            return []
        gone: list[SeriesKey] = []
        floor = math.inf
        for k, s in self._series.items():
            t = s.last_seen_ts
            if t is None:
                floor = -math.inf
            elif t < before_s:
                gone.append(k)
            elif t < floor:
                floor = t
        self._seen_floor = floor
        gone.sort()
        for node, model in gone:
            self.forget(node, model)
        if gone and len(gone) >= len(self._series):
            self.compact()
        return gone

    def compact(self) -> int:
        """Give back the memory of forgotten series; returns how many ring rows were freed.

        Sparse tiers are repacked (:meth:`RingTiers.compact
        <tailguard.core.window.tiers.RingTiers.compact>`) and the series map is rebuilt (a dict
        keeps its largest table). Windows, and so summaries, are unchanged; nothing is done
        when there is nothing to give back.
        """
        freed = self.tiers.compact()
        self._series = dict(self._series)
        self._capture.clear()                   # it holds the old slabs (taken() refuses them anyway)
        return freed

    # ------------------------------------------------------------ observe

    def observe_heartbeat(self, hb: Heartbeat) -> None:
        """Make the series known (first/last seen, hardware) without samples."""
        s = self._get(hb.node_id, hb.model)
        if hb.hardware is not None and hb.hardware != s.hardware:
            s.hardware = hb.hardware
            self._order.stale()                 # a field the summary pass keeps
        if s.seen(hb.ts, hb.ts, hb.instance, self.settings.restart_gap_s):
            self._order.stale()

    def observe_histogram(self, ev: HistogramBatch) -> None:
        """Add one interval of a histogram pair: a sign of life, its requests (counted from the
        e2e histogram, the one whose observations are requests) and its bucket counts."""
        s = self._get(ev.node_id, ev.model)
        if ev.hardware is not None and ev.hardware != s.hardware:
            s.hardware = ev.hardware
            self._order.stale()                 # a field the summary pass keeps
        before = s.instance_ts
        if s.seen(ev.ts, ev.ts, ev.instance, self.settings.restart_gap_s):
            self._order.stale()
        if s.instance_ts != before and s.instance_ts is not None:
            self._hists.restarted(ev.key, s.instance_ts - ev.interval_s)
        if ev.metric == "e2e":
            n = ev.observations if ev.requests is None else max(ev.requests, ev.observations)
            s.requests += n
            if ev.failed:
                s.failures += ev.failed
                b = int(ev.ts)
                failed = s.failures_by_s()
                failed[b] = failed.get(b, 0) + ev.failed
        self._hists.observe(ev)

    def observe(self, batch: SampleBatch) -> None:
        """Add a batch's samples (vectorized; arrival order = array order)."""
        self._writes += 1
        s = self._get(batch.node_id, batch.model)
        if batch.hardware is not None and batch.hardware != s.hardware:
            s.hardware = batch.hardware
            self._order.stale()                 # a field the summary pass keeps
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
                if s.seen(p_lo, p_hi, batch.instance, self.settings.restart_gap_s, k, part):
                    self._order.stale()
                lo += k
        elif s.seen(t_lo, t_hi, batch.instance, self.settings.restart_gap_s, n, ts):
            self._order.stale()
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
            if ts.shape[0] == 0:
                return
            n, t_lo, t_hi = int(ts.shape[0]), float(ts.min()), float(ts.max())
        signed = np.where(batch.probe if ok.all() else batch.probe[ok], -lat, lat)
        sized = inp is not None or out is not None or ttft is not None
        ch = s.chunk
        fill = 0 if ch is None else int(ch.fill[s.row])
        if ch is None or (sized and not ch.sized) or (ch.cap < self._window and fill + n > ch.cap):
            self.tiers.place(s, fill + n, sized)
            ch = s.chunk
            assert ch is not None
        row, cap = s.row, ch.cap
        if n >= cap:                            # the ring is replaced: its bounds are the batch's
            kept = ts[n - cap:]
            codes = ch.put_times(row, kept, float(kept.min()), float(kept.max()), True)
            ch.lat_lo[row] = float(signed[n - cap:].min())
        else:
            codes = ch.put_times(row, ts, t_lo, t_hi, False)     # and ts_lo/ts_hi
            ch.lat_lo[row] = min(float(ch.lat_lo[row]), float(signed.min()))
        cols: list[tuple[npt.NDArray[Any], npt.NDArray[Any] | None]] = [
            (ch.ts_code, codes), (ch.lat, signed)]
        if ch.sized:
            cols += [(ch.inp, inp), (ch.out, out), (ch.ttft, ttft)]  # type: ignore[list-item]
        if n >= cap:
            for dst, src in cols:
                dst[row] = np.nan if src is None else src[src.shape[0] - cap:]   # codes: the kept ones
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

    def _count_failed(self, s: SeriesRecord, fts: F64) -> None:
        buckets, counts = np.unique(np.floor(fts).astype(np.int64), return_counts=True)
        failed = s.failures_by_s()
        for b, c in zip(buckets.tolist(), counts.tolist(), strict=True):
            failed[b] = failed.get(b, 0) + c
        if s.last_seen_ts is not None and len(failed) > 64:
            horizon = int(s.last_seen_ts - self.settings.max_sample_age_s) - 1
            for b in [b for b in failed if b < horizon]:
                del failed[b]

    # ------------------------------------------------------------ summaries

    def summaries(self, now_s: float,
                  judge_since: Mapping[SeriesKey, float] | None = None,
                  *, out_of_fit: Collection[SeriesKey] = (), digests: bool = False,
                  tail_refs: Mapping[str, float] | None = None,
                  choices: Mapping[str, ModelChoice] | None = None, evidence: bool = False) -> list[WindowSummary]:
        """One summary per known series at event time ``now_s`` (see :mod:`tailguard.core.window.summarize`).

        ``judge_since``: ``{key: since_ts}`` cut-offs of judged samples; ``out_of_fit``: series
        left out of the fleet-wide ``normalized`` fit. ``digests=True`` adds ``extra["digest"]``: a
        t-digest dict of the judged raw latency, mergeable across nodes (opt-in: it costs more).
        ``tail_refs``: ``{model: threshold}`` in the model's signal units; series with at most
        ``FRESH_TAIL_MAX_SAMPLES`` fresh samples get ``fresh_over`` counted against it. ``choices``,
        ``evidence``: stage 2's signal per model and what it makes them from (``summarize``).
        """
        capture = self._capture
        capture.clear()
        out = summarize(self.tiers.used_slabs(), self._series, self._model_names, self.settings, now_s,
                        judge_since=judge_since, out_of_fit=out_of_fit, digests=digests, tail_refs=tail_refs,
                        choices=choices, evidence=evidence, pause=self.pause_collector,
                        order=(self._order, self.tiers.layout), capture=capture)
        capture.seal(now_s, self._version())
        hists = self._hists
        for i, sm in enumerate(out if hists.keys() else ()):     # no look per series without them
            key = (sm.node_id, sm.model)
            if key in hists:
                fields = hists.summary_fields(key, now_s, (judge_since or {}).get(key))
                if fields is not None:
                    out[i] = sm._replace(**fields)
        return out

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
        (:func:`tailguard.core.window.pools.build_pools`); the rings whose slots the last
        :meth:`summaries` captured (at this ``now_s``, with no ring written since, at the
        default ``per_series``) are not read again.
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
        taken = self._capture.taken(now_s, stride, self._version())
        pools = build_pools(self.tiers.used_slabs(), self._model_names, want, stride, age_lo, now_s, tuple(qs),
                            taken)
        if taken.rings:
            self._capture.handed(pools)
        return pools

    def _version(self) -> tuple[int, int]:
        """Changes whenever a ring's content or place may have (heartbeats and histogram
        intervals write no ring)."""
        return self._writes, self.tiers.layout

    def model_digests(self, now_s: float, *, per_series: int = POOL_SAMPLES_PER_SERIES,
                      models: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
        """Per model, one t-digest (as its dict) of :meth:`model_pools`' pool.

        Built offline from the sorted pool (``digest_dict_of_sorted``). Each dict also
        holds ``"nodes"``: the series that gave samples (``digest_from_dict`` ignores it).
        Merge workers' dicts with ``merge_digests``.
        """
        return {m: pool.digest_dict()
                for m, pool in self.model_pools(now_s, per_series=per_series, models=models).items()}

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
        out = {"ts": ch.times(row, order), "latency_us": np.abs(lat),
               "probe": (lat < 0).astype(np.float64)}
        if ch.sized:
            assert ch.inp is not None and ch.out is not None and ch.ttft is not None
            out["input_tokens"] = ch.inp[row, order].astype(np.float64)
            out["output_tokens"] = ch.out[row, order].astype(np.float64)
            out["ttft_us"] = ch.ttft[row, order].astype(np.float64)
        return out

    def snapshot(self) -> dict[str, Any]:
        """Everything the store holds, as JSON-able data (NaN written as null, and so the time of
        a sample stored as too old: -inf)."""
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
                "signs": s.signs, "gap_s": s.gap_s, "resume_ts": s.resume_ts, "resume_signs": s.resume_signs,
                "ts": [None if v == -math.inf else v for v in w["ts"].tolist()],   # None: too old
                "latency_us": w["latency_us"].tolist(), "probe": np.flatnonzero(w["probe"]).tolist(),
            }
            if s.chunk is not None:             # the codes' base; where the ring sits in its slots
                ch = s.chunk
                item.update(base_us=int(ch.base_us[s.row]), head=int(ch.head[s.row]), cap=ch.cap)
            for k in ("input_tokens", "output_tokens", "ttft_us"):
                if k in w:
                    item[k] = [None if v != v else v for v in w[k].tolist()]
            hist = self._hists.snapshot_of((node, model))
            if hist is not None:
                item["hist"] = hist
            series.append(item)
        return {"version": SNAPSHOT_VERSION, "window_size": self._window, "series": series}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the store's content with a :meth:`snapshot` (any window_size:
        a larger snapshot window keeps only each series' newest samples)."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"window snapshot version {data.get('version')!r} is not"
                             f" {SNAPSHOT_VERSION}; cannot restore")
        self.tiers.clear()
        self._series.clear()
        self._models.clear()
        self._model_names.clear()
        self._hists = HistWindows(self.settings)
        for item in data["series"]:
            s = self._get(item["node_id"], item["model"])
            if item.get("hist") is not None:
                self._hists.restore_of((s.node_id, s.model), item["hist"])
            s.hardware = item.get("hardware")
            s.first_seen_ts = item.get("first_seen_ts")
            s.last_seen_ts = item.get("last_seen_ts")
            s.failed = {int(b): int(c) for b, c in item.get("failed", [])}
            counts = int(item.get("requests", 0)), int(item.get("failures", 0))
            life = (item.get("instance"), item.get("instance_ts"), item.get("resumed_ts"),
                    int(item.get("signs", 0)), float(item.get("gap_s", 0.0)),
                    item.get("resume_ts"), int(item.get("resume_signs", 0)))   # a restart not yet confirmed
            ts = np.array([-math.inf if v is None else v for v in item["ts"]], dtype=np.float64)
            if ts.size == 0:
                s.requests, s.failures = counts
                s.instance, s.instance_ts, s.resumed_ts, s.signs, s.gap_s, s.resume_ts, s.resume_signs = life
                continue
            lat = np.asarray(item["latency_us"], dtype=np.float64)
            probe = np.zeros(ts.size, dtype=bool)
            probe[np.asarray(item.get("probe", []), dtype=np.int64)] = True
            first, last = s.first_seen_ts, s.last_seen_ts
            self.observe(SampleBatch(s.node_id, s.model, s.hardware, np.where(np.isfinite(ts), ts, 0.0), lat,
                                     np.ones(ts.size, dtype=bool), probe, _column(item, "input_tokens"),
                                     _column(item, "output_tokens"), _column(item, "ttft_us")))
            assert s.chunk is not None
            s.chunk.as_original(s.row, ts, item.get("base_us"),     # the times' codes and slots
                                item.get("head") if item.get("cap") == s.chunk.cap else None)
            s.first_seen_ts, s.last_seen_ts = first, last
            s.requests, s.failures = counts
            s.instance, s.instance_ts, s.resumed_ts, s.signs, s.gap_s, s.resume_ts, s.resume_signs = life
        self._seen_floor = -math.inf
        self._order.stale()


def _column(item: Mapping[str, Any], key: str) -> F64 | None:
    v = item.get(key)
    return None if v is None else np.array(v, dtype=np.float64)

