"""Cluster-wide latency pools: an even thinning of every ring of the window store, per model.

Owns :class:`ModelPool` and :func:`build_pools`, which ``WindowStore.model_pools`` calls
with the store's slabs (:mod:`tailguard.core.window.rings` owns the ring layout and says what a
slab's kept bounds prove).

Guarantees:

* A model's pool holds every series' judged samples (``ok``, non-probe, event time in
  ``(now_s - max_sample_age_s, now_s]``) at one slot stride in every ring, so each
  judged sample is kept at the same rate; models without a kept sample are left out.
* Every pool is a view into one buffer filled in one pass over the slabs; with ``qs``
  every pool's exact quantiles (``numpy.quantile``, linear) are selected at once
  (:func:`tailguard.core.window.quantiles.segment_quantiles`) and :meth:`ModelPool.quantiles`
  answers them without selecting again.
* :meth:`ModelPool.digest_dict` is a mergeable t-digest of the pool (same dict format
  as the ``tdigest`` package), for workers that each hold part of a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

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


def _pool_pieces(chunks: list[Slab], want: Bools, stride: int, age_lo: float,
                 now_s: float) -> tuple[list[_Piece], I64]:
    """The kept pool samples of ``chunks`` (:func:`build_pools`) as pieces
    (``_Piece``), not yet in the pool, and the model index of every series that gave
    samples.

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
    proven = (sel & (cat([ch.fill for ch in chunks]) == np.repeat([ch.cap for ch in chunks], sizes))
              & (cat([ch.ts_lo for ch in chunks]) > age_lo)
              & (cat([ch.ts_hi for ch in chunks]) <= now_s) & (cat([ch.lat_lo for ch in chunks]) > 0))
    lats = [ch.lat[:, ::stride] for ch in chunks]     # stride first: copy 1/stride
    pieces: list[_Piece] = []
    gave: list[I64] = []
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
    ends = np.cumsum(n_kept).tolist()
    flat = sub.reshape(-1) if kept is None else np.compress(kept.reshape(-1), sub.reshape(-1))
    lo = 0
    for i in [*np.flatnonzero(midx[1:] != midx[:-1]).tolist(), midx.size - 1]:
        hi = ends[i]
        if hi > lo:
            pieces.append((int(midx[i]), hi - lo, flat[lo:hi]))
        lo = hi
    given: I64 = midx[n_kept > 0]
    return given


def build_pools(chunks: list[Slab], model_names: Sequence[str], want: Bools, stride: int,
                age_lo: float, now_s: float, qs: tuple[float, ...]) -> dict[str, ModelPool]:
    """Per model (by index into ``model_names``, kept where ``want``), the pool of the
    ``stride``-th slots of ``chunks``' judged samples; with ``qs``, their quantiles."""
    nm = len(model_names)
    pieces, gave = (_pool_pieces(chunks, want, stride, age_lo, now_s) if chunks
                    else ([], np.zeros(0, dtype=np.int64)))
    nodes = np.bincount(gave, minlength=nm)
    sizes = [0] * nm
    for m, n, _ in pieces:
        sizes[m] += n
    totals = np.array(sizes, dtype=np.int64)
    pool = np.empty(int(totals.sum()), dtype=np.float32)
    starts = np.cumsum(totals) - totals
    at = starts.tolist()
    for m, n, values in pieces:
        lo = at[m]
        at[m] = lo + n
        pool[lo:lo + n].reshape(values.shape)[...] = values
    at_qs = segment_quantiles(pool, totals, qs).tolist() if qs else [()] * nm
    return {model_names[i]: ModelPool(pool[lo:lo + n], int(nodes[i]), qs, tuple(at_qs[i]))
            for i, (lo, n) in enumerate(zip(starts.tolist(), sizes, strict=True)) if n}
