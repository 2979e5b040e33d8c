"""Stage 1's per-tick pass: every series' window → one :class:`~tailguard.core.contract.types.WindowSummary`.

Owns :func:`summarize` (``WindowStore.summaries`` delegates to it): each model's signal and
fleet fit, the passes over the slabs (:mod:`tailguard.core.window.passes`), and the summaries
built from their columns, one tuple per series.

Guarantees, at tick ``now_s``:

* Judged samples: ``ok``, non-probe, event time in ``(now_s − max_sample_age_s, now_s]``; for
  a series in ``judge_since``, every ``ok`` sample with ``since_ts <= ts <= now_s``. The
  ``normalized`` fit uses every series' judged samples except those in ``out_of_fit``.
* One signal per model (stage 2's ``choices``, else :mod:`tailguard.core.window.signals`'
  own; ``evidence`` adds what stage 2 chooses from): ``p50``/``p99``/``samples`` over the judged
  samples with a value of it, ``latency_p50_us``/``latency_p99_us`` over their raw latency;
  exact quantiles (as ``numpy.quantile``). A series with fewer than ``min_samples`` values of
  its model's signal but as many judged samples is summarised in ``latency`` (no fresh figures).
* ``fresh_samples``/``fresh_p50``: the last tick's judged samples, their exact P50 (``None``
  below :func:`fresh_min_samples`); ``fresh_over`` is counted against ``tail_refs`` for at
  most ``FRESH_TAIL_MAX_SAMPLES`` of them; ``failed``, ``probe_*``: in the age bound.
* Pure: the slabs only get their kept bounds tightened. Output sorted by (model, node_id).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window import signals as sig
from tailguard.core.window.passes import (
    Bools,
    ModelPlan,
    Pass1,
    Stats,
    chunk_stats,
    fast_stats,
    pass1,
)
from tailguard.core.window.pools import PoolCapture
from tailguard.core.window.quantiles import (
    digest_of,
    digest_to_dict,
)
from tailguard.core.window.rings import F64, SeriesKey, SeriesRecord, Slab

_SIG_CODE: Final = {sig.LATENCY: 0, sig.TPOT: 1, sig.NORMALIZED: 2}
_FIT_SLOTS: Final = 256
_NONE2: Final[tuple[None, None]] = (None, None)
# A fresh P50 needs this share of min_samples fresh samples (why: docs/rules.md, few fresh samples).
FRESH_MIN_SHARE: Final = 0.25


def fresh_min_samples(settings: DetectorSettings) -> int:
    """Fresh samples a series needs for a fresh P50 (stage 2 takes its peers' reference only
    from fresh P50s of ``min_samples``)."""
    return max(1, int(settings.min_samples * FRESH_MIN_SHARE))













_summary_order: Final = operator.attrgetter("model", "node_id")


class KeptFields(NamedTuple):
    """The summary fields a series' record holds and seldom changes: ``node_id`` and ``model``
    never, the others only where the store calls :meth:`SummaryOrder.stale`."""

    node_id: list[str]
    model: list[str]
    hardware: list[str | None]
    first_seen_ts: list[float | None]
    instance_ts: list[float | None]
    resumed_ts: list[float | None]


def kept_fields(ser: list[SeriesRecord]) -> KeptFields:
    return KeptFields([sr.node_id for sr in ser], [sr.model for sr in ser], [sr.hardware for sr in ser],
                      [sr.first_seen_ts for sr in ser], [sr.instance_ts for sr in ser],
                      [sr.resumed_ts for sr in ser])


class SummaryOrder:
    """What one store's rows are, kept from one summary pass to the next while the rings'
    layout stands (``layout``: :attr:`RingTiers.layout
    <tailguard.core.window.tiers.RingTiers.layout>`): the rows then hold the same series in the
    same order. Kept: their (model, node_id) order, which the pass takes instead of sorting its
    summaries, and the fields their records seldom change (:class:`KeptFields`) until the
    store calls :meth:`stale`. Costs and sizes: docs/performance.md."""

    __slots__ = ("fields", "fields_layout", "layout", "perm")

    def __init__(self) -> None:
        self.layout = -1
        self.perm: npt.NDArray[np.signedinteger[Any]] | None = None
        self.fields_layout = -1
        self.fields = KeptFields([], [], [], [], [], [])

    def stale(self) -> None:
        """A record's kept field changed (the store calls it where it writes one)."""
        self.fields_layout = -1

    def fields_of(self, ser: list[SeriesRecord], layout: int) -> KeptFields:
        """The kept fields of ``ser`` (the used rows' records, in row order)."""
        if self.fields_layout != layout or len(self.fields.node_id) != len(ser):
            self.fields = kept_fields(ser)
            self.fields_layout = layout
        return self.fields

    def sorted(self, built: list[WindowSummary], layout: int) -> list[WindowSummary]:
        """``built`` (one summary per used row, in row order) sorted by (model, node_id)."""
        n = len(built)
        if n < 2:
            return built
        perm = self.perm
        if perm is None or self.layout != layout or perm.size != n:
            keys = list(map(_summary_order, built))
            perm = self.perm = np.array(sorted(range(n), key=keys.__getitem__),
                                        dtype=np.int16 if n <= 1 << 15 else np.int32)
            self.layout = layout
        return list(operator.itemgetter(*perm.tolist())(built))


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What stage 2 needs of this store for its choice of each model's signal: per chunk,
    the used rows' sized counts (``[used, 3]``) and every row's fit votes (``[rows, 4]``),
    and the models (by index) whose signal this store chose alone."""

    counts: Mapping[int, npt.NDArray[Any]]
    votes: Mapping[int, F64]
    local: Collection[int]


def _add_evidence(extra: Callable[[int], dict[str, Any]], parts: Sequence[tuple[Slab, Pass1, Stats]],
                  used: list[npt.NDArray[Any]], at: list[int], ser: list[SeriesRecord],
                  ev: _Evidence) -> None:
    """``signal_counts``, ``fit_vote`` and ``signal_local`` (:mod:`~tailguard.core.window.signals`)."""
    for (ch, _, _), u, first in zip(parts, used, at[:-1], strict=True):
        c = ev.counts.get(id(ch))
        if c is not None:
            for i in np.flatnonzero(c[:, 1] > 0).tolist():
                extra(first + i)[sig.COUNTS_KEY] = c[i].tolist()
        v = ev.votes.get(id(ch))
        if v is not None:
            vu = v[u]
            for i in np.flatnonzero(~np.isnan(vu).all(axis=1)).tolist():
                extra(first + i)[sig.VOTE_KEY] = [None if x != x else x for x in vu[i].tolist()]
    if ev.local:
        for i, sr in enumerate(ser):
            if sr.midx in ev.local:
                extra(i)[sig.LOCAL_KEY] = True


def _extras(parts: Sequence[tuple[Slab, Pass1, Stats]], used: list[npt.NDArray[Any]], at: list[int],
            ser: list[SeriesRecord], plans: list[ModelPlan], raw_fb: Bools, n_judged: npt.NDArray[Any],
            n_sig: npt.NDArray[Any], digests: bool, since: F64 | None,
            ev: _Evidence | None = None) -> list[dict[str, Any]]:
    """Each series' ``extra``: judged_since, judged_samples, fleet_fit, digest, the signal
    evidence (``ev``), where it has them."""
    none: dict[str, Any] = {}
    extras: list[dict[str, Any]] = [none] * len(ser)

    def extra(i: int) -> dict[str, Any]:
        d = extras[i]
        if d is none:
            d = extras[i] = {}
        return d

    if ev is not None:
        _add_evidence(extra, parts, used, at, ser, ev)

    if since is not None:
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
    return extras


def _probe_quantiles(parts: Sequence[tuple[Slab, Pass1, Stats]], used: list[npt.NDArray[Any]], at: list[int],
                     n: int) -> tuple[Iterable[float | None], Iterable[float | None]]:
    """The probe P50 and P99 columns (endless ``None`` when no series has probes)."""
    if not any(cs.probe_q for _, _, cs in parts):
        return repeat(None), repeat(None)
    pq: list[tuple[float | None, float | None]] = [_NONE2] * n
    for (_, _, cs), u, first in zip(parts, used, at[:-1], strict=True):
        for r, q in cs.probe_q.items():
            pq[first + int(np.searchsorted(u, r))] = (q[0], q[1])
    return [q[0] for q in pq], [q[1] for q in pq]


def _optional(values: npt.NDArray[Any], none: Bools) -> list[Any]:
    """``values`` as Python numbers, ``None`` where ``none``."""
    if not none.any():
        plain: list[Any] = values.tolist()
        return plain
    if none.all():
        return [None] * none.size
    out = values.astype(object)
    out[none] = None
    return list(out.tolist())


def summarize(slabs: Sequence[Slab], records: Mapping[SeriesKey, SeriesRecord], model_names: Sequence[str],
              settings: DetectorSettings, now_s: float, *,
              judge_since: Mapping[SeriesKey, float] | None = None,
              out_of_fit: Collection[SeriesKey] = (),
              digests: bool = False,
              tail_refs: Mapping[str, float] | None = None,
              choices: Mapping[str, sig.ModelChoice] | None = None,
              evidence: bool = False,
              pause: Callable[[], AbstractContextManager[object]] = nullcontext,
              order: tuple[SummaryOrder, int] | None = None, capture: PoolCapture | None = None) -> list[WindowSummary]:
    """One summary per series of ``records`` at event time ``now_s`` (module docstring).

    ``slabs``: every slab holding a used ring; ``model_names``: by model index (``midx``). The
    keyword arguments are :meth:`~tailguard.core.window.window.WindowStore.summaries`' (its docstring);
    ``pause``: entered while one tuple per series is made (the caller's choice, e.g.
    :func:`tailguard.collector.collector_paused`; the core calls no ``gc``); ``order``: the store's
    kept order of its rows and the rings' layout now (:class:`SummaryOrder`); ``capture``: takes
    the fast rings' cluster-pool slots (:func:`~tailguard.core.window.passes.fast_stats`)."""
    age_lo = now_s - settings.max_sample_age_s
    fresh_lo, min_fresh = now_s - settings.tick_interval_s, fresh_min_samples(settings)
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
    states: list[Pass1] = []
    counts: dict[int, npt.NDArray[Any]] = {}     # evidence: per chunk, its used rows' counts
    for ch in chunks:
        st = pass1(ch, now_s, age_lo, since_by_chunk.get(id(ch)))
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
            n_inout = j_inout[used].sum(axis=1)
            tpot_m += np.bincount(m, n_tpot, minlength=nm)
            out_m += np.bincount(m, n_out, minlength=nm)
            inout_m += np.bincount(m, n_inout, minlength=nm)
            if evidence:
                counts[id(ch)] = np.stack([n_tpot, n_out, n_inout], axis=1)
            tpot_gap[m[ready & (n_tpot < need)]] = True
            out_gap[m[ready & (n_out < need)]] = True
        else:
            tpot_gap[m[ready]] = out_gap[m[ready]] = True
    plans, votes = _plans(settings, model_names, chunks, states,
                          sig.ModelCounts(judged_m, tpot_m, out_m, inout_m, ~tpot_gap, ~out_gap),
                          unfit_by_chunk, choices or {}, evidence)
    ev = _Evidence(counts, votes, {i for i, m in enumerate(model_names)
                                   if m not in (choices or {})}) if evidence else None
    refs = np.full(max(1, nm), np.nan)
    index = {m: i for i, m in enumerate(model_names)} if tail_refs else {}
    for name, ref in (tail_refs or {}).items():
        i = index.get(name)
        if i is not None:
            refs[i] = ref
    codes = np.array([p.code for p in plans], dtype=np.int64)
    stats = [chunk_stats(ch, st, plans, codes, fresh_lo, refs, min_fresh)
             for ch, st in zip(chunks, states, strict=True)]
    fast_stats(list(zip(chunks, stats, strict=True)), fresh_lo, refs, min_fresh, capture)
    with pause():
        results = _build(list(zip(chunks, states, stats, strict=True)), plans,
                         now_s, age_lo, digests, settings.min_samples, min_fresh, ev, order)
        if order is not None and len(results) == len(records):     # every series has a ring
            return order[0].sorted(results, order[1])
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
           states: list[Pass1], mc: sig.ModelCounts, unfit_by_chunk: Mapping[int, list[int]],
           choices: Mapping[str, sig.ModelChoice],
           evidence: bool) -> tuple[list[ModelPlan], dict[int, F64]]:
    """Each model's plan (stage 2's choice where ``choices`` has one, else this store's own)
    and, with ``evidence``, each chunk's fit votes (``[rows, 4]``: a, b, c, mean_us; NaN
    where a row has none) of the models fitted here."""
    local = [sig.choose_model(settings.signal_for(name), mc, i) for i, name in enumerate(model_names)]
    hinted = [choices.get(name) for name in model_names]
    signals = [h.signal if h is not None else c[0] for h, c in zip(hinted, local, strict=True)]
    use_input = [h.use_input if h is not None else c[1] for h, c in zip(hinted, local, strict=True)]
    need_fit = {i for i, (s, h) in enumerate(zip(signals, hinted, strict=True))
                if s == sig.NORMALIZED and (h is None or h.fit is None)}
    # Votes for stage 2's fit: of the models this store would fit, or stage 2 judges normalized.
    need_votes = need_fit | ({i for i, s in enumerate(signals) if s == sig.NORMALIZED}
                             | {i for i, c in enumerate(local) if c[0] == sig.NORMALIZED}
                             if evidence else set())
    coefs: dict[int, list[F64]] = {i: [] for i in need_fit}
    means: dict[int, list[F64]] = {i: [] for i in need_fit}
    votes: dict[int, F64] = {}
    for ch, st in zip(chunks, states, strict=True):
        if not need_votes or not ch.sized:
            continue
        assert ch.out is not None and ch.inp is not None
        voters = np.isin(ch.midx, list(need_votes))
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
            if m in need_fit:
                coefs[m].append(np.stack([f.a[f.valid], f.b[f.valid], f.c[f.valid]], axis=1))
                means[m].append(f.mean_us[f.n > 0])
            if evidence:
                v = votes.get(id(ch))
                if v is None:
                    v = votes[id(ch)] = np.full((ch.midx.size, 4), np.nan)
                v[r, :3] = np.where(f.valid[:, None], np.stack([f.a, f.b, f.c], axis=1), np.nan)
                v[r, 3] = np.where(f.n > 0, f.mean_us, np.nan)
    plans: list[ModelPlan] = []
    for i, s in enumerate(signals):
        h = hinted[i]
        fit = h.fit if h is not None and s == sig.NORMALIZED else None
        if i in need_fit:
            cf = np.concatenate(coefs[i]) if coefs[i] else np.zeros((0, 3))
            mu = np.concatenate(means[i]) if means[i] else np.zeros(0)
            fit = sig.fleet_fit(cf[:, 0], cf[:, 1], cf[:, 2], mu)
        plans.append(ModelPlan(s, _SIG_CODE[s], use_input[i], fit))
    return plans, votes






def _build(parts: Sequence[tuple[Slab, Pass1, Stats]], plans: list[ModelPlan],
           now_s: float, age_lo: float, digests: bool, min_samples: int, min_fresh: int,
           ev: _Evidence | None = None, order: tuple[SummaryOrder, int] | None = None) -> list[WindowSummary]:
    """The summaries of every used row of ``parts``' chunks, in chunk order (``order``: the
    store's kept rows, :class:`SummaryOrder`, and the rings' layout now).

    Built by field name, one column per field for all chunks at once, then one tuple per
    series: cheaper than a keyword call of WindowSummary's fields, and the numeric
    columns need no per-series Python loop (``_optional``)."""
    if not parts:
        return []
    used = [np.flatnonzero(ch.midx >= 0) for ch, _, _ in parts]
    at = np.cumsum([0] + [u.size for u in used]).tolist()     # each chunk's first index

    def cat(arrs: Iterable[npt.NDArray[Any]]) -> npt.NDArray[Any]:
        return np.concatenate([x if u.size == x.shape[0] else x[u] for x, u in zip(arrs, used, strict=True)])

    rows_ser: list[SeriesRecord | None] = []
    for (ch, _, _), u in zip(parts, used, strict=True):
        series = ch.series      # a used row's (midx >= 0) series, None on a free row
        rows_ser.extend(series if u.size == len(series) else [series[r] for r in u.tolist()])
    assert len(rows_ser) == at[-1]
    ser = cast(list[SeriesRecord], rows_ser)
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
    raw_fb = (codes[midx] != 0) & (n_sig < min_samples) & (n_judged >= min_samples)
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
    extras = _extras(parts, used, at, ser, plans, raw_fb, n_judged, n_sig, digests,
                     cat(st.since_row for _, st, _ in parts) if any(st.has_since for _, st, _ in parts) else None,
                     ev)
    probe_p50, probe_p99 = _probe_quantiles(parts, used, at, len(ser))
    signal_of = np.array([p.signal for p in plans], dtype=object)
    signals = signal_of[midx]
    signals[raw_fb] = sig.LATENCY
    p50, p99 = _optional(q_sig[:, 0], no_sig), _optional(q_sig[:, 1], no_sig)
    # Windows judged on raw latency (most) have the same numbers twice: the same objects then.
    same = np.array_equal(no_sig, no_lat) and np.array_equal(q_sig, q_lat, equal_nan=True)
    kept = order[0].fields_of(ser, order[1]) if order is not None else kept_fields(ser)
    cols: dict[str, Iterable[Any]] = {
        "node_id": kept.node_id,
        "model": kept.model,
        "tick_ts": repeat(now_s),
        "signal": signals.tolist(),
        "samples": n_sig.tolist(),
        "p50": p50,
        "p99": p99,
        "latency_p50_us": p50 if same else _optional(q_lat[:, 0], no_lat),
        "latency_p99_us": p99 if same else _optional(q_lat[:, 1], no_lat),
        "failed": [_failed_in(sr.failed, age_lo, now_s) if sr.failed else 0 for sr in ser],
        "hardware": kept.hardware,
        "first_seen_ts": kept.first_seen_ts,
        "last_seen_ts": [sr.last_seen_ts for sr in ser],
        "probe_samples": cat(cs.n_probe for _, _, cs in parts).tolist(),
        "probe_p50": probe_p50,
        "probe_p99": probe_p99,
        "extra": extras,
        "fresh_samples": n_fresh.tolist(),
        "fresh_p50": _optional(q_fresh, np.isnan(q_fresh)),
        "requests_total": [sr.requests for sr in ser],
        "failed_total": [sr.failures for sr in ser],
        "instance_ts": kept.instance_ts,
        "resumed_ts": kept.resumed_ts,
        "fresh_over": _optional(n_over, n_over < 0),
    }
    # repeat() columns are endless; every list column has one entry per series. tuple.__new__
    # of each row makes a WindowSummary with no Python frame (WindowSummary._make has one).
    return list(map(tuple.__new__, repeat(WindowSummary),
                    zip(*(cols[f] for f in WindowSummary._fields), strict=False)))


def _failed_in(failed: dict[int, int], age_lo: float, now_s: float) -> int:
    return sum(c for b, c in failed.items() if age_lo < b <= now_s)
