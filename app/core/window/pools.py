"""Cluster-wide latency pools: an even thinning of every ring of the window store, per model.

Owns :class:`ModelPool`, :func:`build_pools` (``WindowStore.model_pools`` calls it with the
store's slabs; :mod:`tailguard.core.window.rings` says what a slab's kept bounds prove) and
:class:`PoolCapture`: the pool slots of stage 1's fast rings, taken while its pass has them in
cache, which ``build_pools`` uses instead of reading those rings again.

Guarantees:

* A model's pool holds every series' judged samples (``ok``, non-probe, event time in
  ``(now_s - max_sample_age_s, now_s]``) at one slot stride in every ring, so each
  judged sample is kept at the same rate; models without a kept sample are left out.
  With a capture, the same multiset per model (only the order of ``values`` may differ).
* Every pool is a view into one buffer (filled in one pass, or the capture's); with ``qs``
  every pool's exact quantiles (``numpy.quantile``, linear) are selected at once
  (:func:`tailguard.core.window.quantiles.segment_quantiles`) and :meth:`ModelPool.quantiles`
  answers them without selecting again.
* :meth:`ModelPool.digest_dict` is a mergeable t-digest of the pool (same dict format
  as the ``tdigest`` package), for workers that each hold part of a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from tailguard.core.window import ts_codes as tc
from tailguard.core.window.quantiles import digest_dict_of_sorted, exact_quantiles, segment_quantiles

if TYPE_CHECKING:
    from tailguard.core.window.rings import Slab

F32: TypeAlias = npt.NDArray[np.float32]
I64: TypeAlias = npt.NDArray[np.int64]
Bools: TypeAlias = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class ModelPool:
    """One model's cluster-wide latency pool (``WindowStore.model_pools``).

    ``values``: raw latency in µs, float32, unsorted, not empty (a view into one buffer
    shared by the call's pools; ``model_pools(qs=...)`` reorders it when selecting);
    ``nodes``: the series that gave samples; ``qs``/``at_qs``: quantiles computed with
    the pool (``model_pools(qs=...)``), which :meth:`quantiles` answers without selecting.
    """

    values: F32
    nodes: int
    qs: tuple[float, ...] = ()
    at_qs: tuple[float, ...] = ()

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Exact ``numpy.quantile`` of the pool at ``qs`` (selection, no sort)."""
        if self.qs and tuple(qs) == self.qs:
            return list(self.at_qs)
        q = exact_quantiles(self.values, qs)
        assert q is not None                    # a pool is never empty
        return q

    def digest_dict(self) -> dict[str, Any]:
        """The pool's t-digest as a dict (``digest_dict_of_sorted``), plus ``"nodes"``."""
        d = digest_dict_of_sorted(np.sort(self.values))
        d["nodes"] = self.nodes
        return d


# A piece of a pool: (model index, number of values, the values: a view or a small copy).
_Piece: TypeAlias = tuple[int, int, F32]
class Taken(NamedTuple):
    """What a capture holds for a tick (:meth:`PoolCapture.taken`): its rings (slab, rows) and,
    per run of rings of one width, their slots ``[rings, width]`` and model indices."""

    rings: list[tuple[Slab, I64]]
    runs: list[tuple[F32, I64]]


_NOTHING = Taken([], [])


class PoolCapture:
    """The pool slots (``lat[ring, ::stride]``) of the rings stage 1's fast pass reads
    (:func:`tailguard.core.window.passes.fast_stats`: full rings, every slot judged, so the
    pool keeps every one of those slots), copied while they are in cache.

    The store clears it before its summary pass and stamps it after (``seal``: the tick and
    the store's write version); :meth:`taken` gives the rings only for that tick, stride and
    version. One buffer (1/stride of the fast rings' latency), reused from tick to tick
    unless the pools became a view of it (:meth:`handed`).
    """

    __slots__ = ("_at", "_buf", "_runs", "rings", "stamp", "stride")

    def __init__(self, stride: int) -> None:
        self.stride = stride
        self._buf: F32 = np.empty(0, dtype=np.float32)
        self._at = 0
        self.rings: list[tuple[Slab, I64]] = []
        self._runs: list[tuple[int, int, list[I64]]] = []     # (width, first value, model indices)
        self.stamp: tuple[float, object] | None = None

    def width(self, cap: int) -> int:
        """Pool slots of a ring of ``cap`` slots."""
        return -(-cap // self.stride)

    def clear(self) -> None:
        self.stamp, self.rings, self._runs, self._at = None, [], [], 0

    def start(self, n: int) -> None:
        """Cleared, with room for ``n`` values (the buffer kept unless too small or 2x too big)."""
        self.clear()
        if n > self._buf.size or self._buf.size > 2 * n:
            self._buf = np.empty(n + n // 8, dtype=np.float32)

    def put(self, ch: Slab, rows: I64, lat: F32) -> None:
        """Take the pool slots of ``ch``'s rings ``rows`` (``lat``: their latency rows)."""
        w = self.width(ch.cap)
        n = rows.size * w
        np.copyto(self._buf[self._at:self._at + n].reshape(rows.size, w), lat[:, ::self.stride])
        if not self._runs or self._runs[-1][0] != w:
            self._runs.append((w, self._at, []))
        self._runs[-1][2].append(ch.midx[rows])
        self.rings.append((ch, rows))
        self._at += n

    def seal(self, now_s: float, version: object) -> None:
        self.stamp = (now_s, version)

    def handed(self, pools: dict[str, ModelPool]) -> None:
        """After ``build_pools`` took :meth:`taken`: when its pools are a view of the buffer
        (:func:`_whole_capture`), the buffer is theirs; the capture lets it go and is spent."""
        first = next(iter(pools.values()), None)
        if first is not None and np.may_share_memory(first.values, self._buf):
            self.clear()
            self._buf = np.empty(0, dtype=np.float32)

    def taken(self, now_s: float, stride: int, version: object) -> Taken:
        """The captured rings and their slots if taken at tick ``now_s`` and ``stride`` with
        the store at ``version`` still, else none."""
        if not self.rings or self.stamp != (now_s, version) or stride != self.stride:
            return _NOTHING
        ends = [at for _, at, _ in self._runs[1:]] + [self._at]
        return Taken(self.rings, [(self._buf[at:end].reshape(-1, w), np.concatenate(m))
                                  for (w, at, m), end in zip(self._runs, ends, strict=True)])


def _pool_pieces(chunks: list[Slab], want: Bools, stride: int, age_lo: float,
                 now_s: float, taken: Taken) -> tuple[list[_Piece], I64]:
    """The kept pool samples of ``chunks`` (:func:`build_pools`) as pieces
    (``_Piece``), not yet in the pool, and the model index of every series that gave
    samples. The rings in ``taken`` give their captured slots; only the others are read.

    The rings of all slabs are checked in one pass. A ring whose kept bounds prove every
    slot judged (see ``Slab``) needs no mask, and a run of such rings of one model side
    by side in a slab is one piece: a view of their strided slots, copied once, straight
    into the pool. Slabs whose proven rings lie scattered (runs of < 16 rings on average)
    and the other rings are gathered per slab, grouped by model and, when masked, compacted
    at once (``np.compress`` while the slab's copy is in cache).
    """
    cat = np.concatenate
    sizes = [ch.rows for ch in chunks]
    slab = np.repeat(np.arange(len(chunks)), sizes)
    local = np.arange(slab.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    midx = cat([ch.midx for ch in chunks])
    sel = want[midx]
    pieces: list[_Piece] = []
    gave: list[I64] = []
    if taken.rings:
        first = dict(zip(map(id, chunks), (np.cumsum(sizes) - sizes).tolist(), strict=True))
        for ch, rows in taken.rings:
            sel[first[id(ch)] + rows] = False
        _taken_pieces(taken.runs, want, pieces, gave)
    proven = (sel & (cat([ch.fill for ch in chunks]) == np.repeat([ch.cap for ch in chunks], sizes))
              & (cat([ch.ts_lo for ch in chunks]) > age_lo)
              & (cat([ch.ts_hi for ch in chunks]) <= now_s) & (cat([ch.lat_lo for ch in chunks]) > 0))
    lats = [ch.lat[:, ::stride] for ch in chunks]     # stride first: copy 1/stride
    for rows, masked in ((np.flatnonzero(proven), False), (np.flatnonzero(sel & ~proven), True)):
        if rows.size == 0:
            continue
        m, where = midx[rows], slab[rows]
        per_slab = np.bincount(where, minlength=len(chunks))
        scattered = per_slab > 0
        if not masked:
            # Runs of adjacent rings of one model in one slab: key steps by exactly 1 inside
            # a run (by 2 from one slab's last row to the next slab's first).
            key = m * (2 * slab.size + 2) + rows + where
            head = cat(([0], np.flatnonzero(key[1:] - key[:-1] != 1) + 1))
            scattered &= np.bincount(where[head], minlength=len(chunks)) * 16 >= per_slab
            run_slab = where[head].tolist()
            spread = scattered.tolist()
            for s, r, mi, n in zip(run_slab, local[rows[head]].tolist(), m[head].tolist(),
                                   np.diff(np.append(head, rows.size)).tolist(), strict=True):
                if not spread[s]:
                    pieces.append((mi, n * lats[s].shape[1], lats[s][r:r + n]))
            gave.append(m)
        ends = np.cumsum(per_slab)
        for s in np.flatnonzero(scattered).tolist():
            lo, hi = int(ends[s] - per_slab[s]), int(ends[s])
            given = _slab_pieces(chunks[s], lats[s], stride, local[rows[lo:hi]], m[lo:hi],
                                 age_lo, now_s, masked, pieces)
            if masked:
                gave.append(given)
    return pieces, (cat(gave) if gave else np.zeros(0, dtype=np.int64))


def _slab_pieces(ch: Slab, lat: F32, stride: int, rows: I64, midx: I64, age_lo: float,
                 now_s: float, masked: bool, pieces: list[_Piece]) -> I64:
    """Append the kept samples of slab ``ch``'s rings ``rows`` (``lat``: its strided
    slots), one piece per model; ``masked``: keep only judged slots, else all. Returns
    the model index of each ring that gave samples."""
    whole = rows.size == ch.rows                    # every row (rows are ascending)
    if rows.size > 1 and bool((midx[1:] < midx[:-1]).any()):
        by_model = np.argsort(midx, kind="stable")
        rows, midx, whole = rows[by_model], midx[by_model], False
    sub = np.ascontiguousarray(lat) if whole else lat[rows]
    kept: Bools | None = None
    if masked:
        # Judged: ok (lat > 0), in time. An empty slot (ts code 0, NaN) fails every test; a test the
        # rings' kept bounds pass for every row is left out (see Slab).
        tsv = ch.ts_code[:, ::stride]
        ts = tsv if whole else tsv[rows]
        base = ch.base_us[rows]
        with np.errstate(invalid="ignore"):
            kept = ts > tc.after(base, age_lo)[:, None]
            if bool((ch.ts_hi[rows] > now_s).any()):
                kept &= ts <= tc.after(base, now_s)[:, None]
            if not bool((ch.lat_lo[rows] > 0).all()):
                kept &= sub > 0
        n_kept = kept.sum(axis=1)
    else:
        n_kept = np.full(rows.size, sub.shape[1])
    flat = sub.reshape(-1) if kept is None else np.compress(kept.reshape(-1), sub.reshape(-1))
    _split_by_model(midx, n_kept, flat, pieces)
    given: I64 = midx[n_kept > 0]
    return given


def _split_by_model(midx: I64, n_kept: I64, flat: F32, pieces: list[_Piece]) -> None:
    """Append ``flat`` (``n_kept[i]`` values of row ``i`` after another) as one piece per
    run of rows of one model ``midx`` (per model when they are sorted by it)."""
    ends = np.cumsum(n_kept).tolist()
    lo = 0
    for i in [*np.flatnonzero(midx[1:] != midx[:-1]).tolist(), midx.size - 1]:
        hi = ends[i]
        if hi > lo:
            pieces.append((int(midx[i]), hi - lo, flat[lo:hi]))
        lo = hi


def _taken_pieces(runs: list[tuple[F32, I64]], want: Bools, pieces: list[_Piece],
                  gave: list[I64]) -> None:
    """Append the captured slots (``runs``: rings' slots and model indices) of the wanted
    models, one piece per run of rings of one model (regrouped by model when the runs are
    short: < 16 rings on average), and their model indices to ``gave``."""
    for vals, m in runs:
        keep = want[m]
        if not keep.all():
            m, vals = m[keep], vals[keep]
        if m.size == 0:
            continue
        if np.count_nonzero(m[1:] != m[:-1]) * 16 > m.size:
            by_model = np.argsort(m, kind="stable")
            m, vals = m[by_model], vals[by_model]
        _split_by_model(m, np.full(m.size, vals.shape[1]), vals.reshape(-1), pieces)
        gave.append(m)


def _whole_capture(chunks: list[Slab], want: Bools, taken: Taken) -> tuple[F32, I64] | None:
    """When every wanted ring of ``chunks`` was captured in one run (one ring width): its
    slots ``[rings, width]`` grouped by model (a view of the capture's buffer when its rings
    already are), and the model index of each ring; else None."""
    if len(taken.runs) != 1:
        return None
    vals, m = taken.runs[0]
    keep = want[m]
    n = int(np.count_nonzero(keep))
    if n != int(np.count_nonzero(want[np.concatenate([ch.midx for ch in chunks])])):
        return None                         # other rings give samples too
    if n < m.size:
        m, vals = m[keep], vals[keep]
    if m.size > 1 and bool((m[1:] < m[:-1]).any()):
        by_model = np.argsort(m, kind="stable")
        m, vals = m[by_model], vals[by_model]
    return vals, m


def build_pools(chunks: list[Slab], model_names: Sequence[str], want: Bools, stride: int,
                age_lo: float, now_s: float, qs: tuple[float, ...],
                taken: Taken | None = None) -> dict[str, ModelPool]:
    """Per model (by index into ``model_names``, kept where ``want``), the pool of the
    ``stride``-th slots of ``chunks``' judged samples; with ``qs``, their quantiles.
    ``taken``: rings of ``chunks`` whose slots were captured (:meth:`PoolCapture.taken`)."""
    nm = len(model_names)
    whole = _whole_capture(chunks, want, taken) if taken is not None and taken.rings else None
    if whole is not None:                   # the pool is the captured slots, grouped by model
        slots, gave = whole
        totals = np.bincount(gave, minlength=nm) * slots.shape[1]
        pool = slots.reshape(-1)
        sizes = totals.tolist()
    else:
        pieces, gave = (_pool_pieces(chunks, want, stride, age_lo, now_s, taken or _NOTHING) if chunks
                        else ([], np.zeros(0, dtype=np.int64)))
        sizes = [0] * nm
        for m, n, _ in pieces:
            sizes[m] += n
        totals = np.array(sizes, dtype=np.int64)
        pool = np.empty(int(totals.sum()), dtype=np.float32)
        at = (np.cumsum(totals) - totals).tolist()
        for m, n, values in pieces:
            lo = at[m]
            at[m] = lo + n
            pool[lo:lo + n].reshape(values.shape)[...] = values
    nodes = np.bincount(gave, minlength=nm)
    starts = np.cumsum(totals) - totals
    at_qs = segment_quantiles(pool, totals, qs).tolist() if qs else [()] * nm
    return {model_names[i]: ModelPool(pool[lo:lo + n], int(nodes[i]), qs, tuple(at_qs[i]))
            for i, (lo, n) in enumerate(zip(starts.tolist(), sizes, strict=True)) if n}
