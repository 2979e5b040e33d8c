"""The cluster pools taken from stage 1's capture equal the pools read from the rings.

``WindowStore.summaries`` copies the pool slots of its fast rings while its pass has them in
cache (:class:`tailguard.core.window.pools.PoolCapture`); ``model_pools`` at the same tick
takes those rings' slots from the capture when no ring was written since. Over random stores
(models of adjacent or interleaved rings, full rings of every tier, partial, stale, future,
probe-holding, sized and ``judge_since`` rings, several slabs and fast blocks) the pools, their
quantiles and digests must be the ones read from the rings (the capture cleared) and the
reference of every ring's judged slots; after a write between the two calls (a sample, a new
series, forget, compact, a tier move, restore) the capture must not be used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.window import passes
from tailguard.core.window.quantiles import exact_quantiles
from tailguard.core.window.window import POOL_SAMPLES_PER_SERIES, WindowStore

S = DetectorSettings()
T0 = 1_764_680_010.0
NOW = T0 + 120.0
QS = (0.5, 0.99)
STRIDE = -(-S.window_size // POOL_SAMPLES_PER_SERIES)


def _batch(node: str, model: str, lat: np.ndarray, t_lo: float, t_hi: float, probe: bool = False,
           sized: bool = False) -> SampleBatch:
    n = lat.size
    tok = np.full(n, 100.0) if sized else None
    return SampleBatch(node, model, "A100", np.linspace(t_lo, t_hi, n), lat, np.ones(n, bool),
                       np.full(n, probe), tok, tok, None if tok is None else tok * 10)


def _store(rng: np.random.Generator, dirty: bool = True) -> WindowStore:
    """Models of 1..40 series, rings adjacent or interleaved by model; most rings full and
    clean (fast: 16, 128 or 1000 samples), the others (``dirty``) partial, stale, ahead, with
    probes or sized."""
    store = WindowStore(S)
    plan = [(f"m{m}", i) for m in range(int(rng.integers(1, 5))) for i in range(int(rng.integers(1, 41)))]
    if rng.random() < 0.5:
        plan.sort(key=lambda p: (p[1], p[0]))
    kinds = ["full", "full", "full", "tier", "partial", "stale", "ahead", "probe", "sized"] if dirty else ["full"]
    for model, i in plan:
        kind = rng.choice(kinds)
        n = {"tier": int(rng.choice([16, 128])), "partial": int(rng.integers(1, 1000))}.get(str(kind), 1000)
        lat = 1e5 * np.exp(rng.normal(0, 0.4, n))
        lo, hi = {"stale": (T0 - 2 * S.max_sample_age_s, NOW), "ahead": (NOW - 50, NOW + 50)}.get(
            str(kind), (NOW - 100, NOW))
        store.observe(_batch(f"n{i}", model, lat, lo, hi, sized=kind == "sized"))
        if kind == "probe":
            store.observe(_batch(f"n{i}", model, np.full(5, 9e6), NOW - 1, NOW, probe=True))
    return store


def _reference(store: WindowStore, per_series: int, models: list[str] | None) -> dict[str, list[float]]:
    """Every ring's slots ``[::stride]`` that hold judged samples, pooled per model, sorted."""
    stride = -(-S.window_size // per_series)
    pooled: dict[str, list[np.ndarray]] = {}
    for key in sorted(store.keys()):
        s = store._series[key]
        if s.chunk is None or (models is not None and key[1] not in models):
            continue
        lat, ts = s.chunk.lat[s.row, ::stride], s.chunk.ts[s.row, ::stride]
        with np.errstate(invalid="ignore"):
            kept = lat[(lat > 0) & (ts > NOW - S.max_sample_age_s) & (ts <= NOW)]
        if kept.size:
            pooled.setdefault(key[1], []).append(kept)
    return {m: np.sort(np.concatenate(v)).tolist() for m, v in pooled.items()}


def _some_series(store: WindowStore, rng: np.random.Generator) -> tuple[str, str]:
    keys = sorted(store.keys())
    return keys[int(rng.integers(len(keys)))]


def _write(store: WindowStore, kind: str, rng: np.random.Generator) -> None:
    """One write between the summaries and the pools."""
    node, model = _some_series(store, rng)
    if kind == "sample":        # 16 new slots: at least two of every ring's pool slots
        store.observe(_batch(node, model, np.full(16, 7e6), NOW - 2, NOW - 1))
    elif kind == "grow":        # a small ring moves up a tier, or a full one takes more
        store.observe(_batch(node, model, np.full(200, 6e6), NOW - 3, NOW - 1))
    elif kind == "new":
        store.observe(_batch("fresh-node", model, np.full(1000, 5e6), NOW - 90, NOW))
    elif kind == "forget":
        store.forget(node, model)
    elif kind == "compact":
        for key in sorted(store.keys())[::2]:
            store.forget(*key)
        store.compact()
    elif kind == "restore":
        snap = store.snapshot()
        store.restore(snap)
    elif kind == "heartbeat":   # writes no ring: the capture stays valid
        store.observe_heartbeat(Heartbeat(node, model, "A100", NOW))


WRITES = ("none", "heartbeat", "sample", "grow", "new", "forget", "compact", "restore")


@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize("seed", range(10))
def test_pools_from_the_capture_equal_the_rings(seed: int, write: str) -> None:
    """Seeds 8, 9: every ring full and fast (the pools can be the capture's own buffer)."""
    rng = np.random.default_rng([seed, WRITES.index(write)])
    store = _store(rng, dirty=seed < 8)
    keys = sorted(store.keys())
    since = {keys[i]: NOW - 50.0 for i in rng.choice(len(keys), size=min(3, len(keys)), replace=False)}
    with pytest.MonkeyPatch.context() as mp:     # several fast blocks, each of a few sort blocks
        mp.setattr(passes, "_FAST_BLOCK_BYTES", int(rng.integers(1, 12)) * 4 * S.window_size)
        mp.setattr(passes, "_SORT_BLOCK_BYTES", int(rng.integers(1, 4)) * 4 * S.window_size)
        store.summaries(NOW, since if rng.random() < 0.5 else None)
    captured = len(store._capture.taken(NOW, STRIDE, store._version())[0])
    _write(store, write, rng)
    standing = len(store._capture.taken(NOW, STRIDE, store._version())[0])
    assert standing == (captured if write in ("none", "heartbeat") else 0)
    names = store.models()
    asks: list[tuple[int, list[str] | None]] = [
        (POOL_SAMPLES_PER_SERIES, None),
        (POOL_SAMPLES_PER_SERIES, [names[0], "no-such-model"]),
        (int(rng.choice([1, 7, 100, 1000])), None)]
    for per_series, models in asks:
        got = store.model_pools(NOW, per_series=per_series, models=models, qs=QS)
        digests = store.model_digests(NOW, per_series=per_series, models=models)
        ask = {"per_series": per_series, "models": models}
        plain = _from_the_rings(store, store.model_pools, ask, qs=QS)
        want = _reference(store, per_series, models)
        assert {m: np.sort(p.values).tolist() for m, p in got.items()} == want
        assert {m: np.sort(p.values).tolist() for m, p in plain.items()} == want
        assert {m: p.nodes for m, p in got.items()} == {m: p.nodes for m, p in plain.items()}
        for m, pool in got.items():
            assert pool.at_qs == plain[m].at_qs == tuple(exact_quantiles(np.array(want[m]), QS) or ())
        assert digests == _from_the_rings(store, store.model_digests, ask)


def _from_the_rings(store: WindowStore, call: Callable[..., Any], ask: dict[str, Any], **more: Any) -> Any:
    """``call(NOW, **ask, **more)`` with the capture put aside (every ring read), the capture
    restored after it."""
    stamp = store._capture.stamp
    store._capture.stamp = None
    try:
        return call(NOW, **ask, **more)
    finally:
        store._capture.stamp = stamp


def test_capture_is_taken_and_only_at_its_tick() -> None:
    """A store of fast rings only: every ring captured; another tick reads the rings."""
    rng = np.random.default_rng(5)
    store = WindowStore(S)
    for i in range(30):
        store.observe(_batch(f"n{i}", f"m{i % 3}", 1e5 * np.exp(rng.normal(0, 0.3, 1000)), NOW - 100, NOW))
    store.summaries(NOW)
    rings, runs = store._capture.taken(NOW, STRIDE, store._version())
    assert sum(r.size for _, r in rings) == 30 and sum(v.shape[0] for v, _ in runs) == 30
    assert not store._capture.taken(NOW + 1.0, STRIDE, store._version())[0]
    assert not store._capture.taken(NOW, STRIDE + 1, store._version())[0]
    later = store.model_pools(NOW + 1.0, qs=QS)
    assert {m: p.nodes for m, p in later.items()} == {"m0": 10, "m1": 10, "m2": 10}


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_pools_that_are_the_capture_keep_their_values(interleave: bool, partial: bool) -> None:
    """Every ring fast: the pools are the captured slots, as a view of the capture's buffer
    when the rings lie grouped by model (the capture then gives its buffer up: the next
    tick's pass must not write into the pools handed out), else regrouped (a copy). With a
    ring that is not full (``partial``, same width), the other rings are read too."""
    rng = np.random.default_rng(7)
    store = WindowStore(S)
    plan = [(i, f"m{i % 3}" if interleave else f"m{i // 10}") for i in range(30)]
    for i, model in plan:
        store.observe(_batch(f"n{i}", model, 1e5 * np.exp(rng.normal(0, 0.3, 1000)), NOW - 100, NOW))
    if partial:
        store.observe(_batch("p", "m1", np.full(500, 8e6), NOW - 100, NOW))
    store.summaries(NOW)
    assert sum(r.size for _, r in store._capture.taken(NOW, STRIDE, store._version())[0]) == 30
    want = _reference(store, POOL_SAMPLES_PER_SERIES, None)
    pools = store.model_pools(NOW, qs=QS)
    assert {m: np.sort(p.values).tolist() for m, p in pools.items()} == want
    assert {m: p.nodes for m, p in pools.items()} == {"m0": 10, "m1": 10 + partial, "m2": 10}
    spent = not store._capture.taken(NOW, STRIDE, store._version())[0]
    assert spent == (not interleave and not partial)
    again = store.model_pools(NOW, qs=QS)          # the rings, or the capture once more
    assert {m: np.sort(p.values).tolist() for m, p in again.items()} == want
    for i in range(30):                            # the next tick rewrites every ring
        store.observe(_batch(f"n{i}", f"m{i % 3}" if interleave else f"m{i // 10}",
                             np.full(1000, 3e6), NOW, NOW + 30))
    store.summaries(NOW + 30)
    assert store.model_pools(NOW + 30)["m0"].values.max() == np.float32(3e6)
    assert {m: np.sort(p.values).tolist() for m, p in pools.items()} == want
    assert {m: p.at_qs for m, p in pools.items()} == {m: tuple(exact_quantiles(np.array(v), QS) or ())
                                                      for m, v in want.items()}
