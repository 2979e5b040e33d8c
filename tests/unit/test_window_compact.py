"""WindowStore compaction: a flood's forgotten series give their slab memory back."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.window.window import WindowStore

S = DetectorSettings(window_size=100, min_samples=10, max_sample_age_s=600.0)
NOW = 10_000.0


def mk(node: str, ts: float, lat: list[float], model: str = "m") -> SampleBatch:
    n = len(lat)
    t = np.linspace(ts - 1.0, ts, n) if n > 1 else np.array([ts])
    return SampleBatch(node, model, None, t, np.asarray(lat, dtype=np.float64),
                       np.ones(n, dtype=bool), np.zeros(n, dtype=bool), None, None, None)


def flooded(n_flood: int, survivors: list[int]) -> WindowStore:
    """6 real series (full windows) and ``n_flood`` one-sample ids, of which the indices in
    ``survivors`` keep reporting after the flood."""
    store = WindowStore(S)
    for i in range(6):
        store.observe(mk(f"real-{i}", NOW - 1, [1000.0 + i] * 150))
    for i in range(n_flood):
        store.observe(mk(f"flood-{i:06d}", NOW - 300, [500.0 + i % 7]))
    for i in survivors:
        store.observe(mk(f"flood-{i:06d}", NOW - 2, [700.0, 800.0]))
    return store


def test_forgetting_a_flood_compacts_slabs_and_keeps_the_survivors_windows() -> None:
    survivors = [0, 4_999, 9_999]            # spread over the first and last slabs
    store = flooded(10_000, survivors)
    peak = store.nbytes()
    keep = [f"real-{i}" for i in range(6)] + [f"flood-{i:06d}" for i in survivors]
    before = {k: store.window(k, "m") for k in keep}
    sums_before = [s for s in store.summaries(NOW) if s.node_id in keep]

    gone = store.forget_silent(NOW - 100)

    assert len(gone) == 10_000 - len(survivors)
    assert store.series_count() == len(keep) and all((k, "m") in store for k in keep)
    # Only a few small slabs are left: the 3 survivors' 16-slot rings and the 6 real rings.
    assert store.nbytes() < peak / 20
    assert store.nbytes() <= (4 * 4 * 16 + 2 * 6 * 100) * 12
    for k, w in before.items():
        after = store.window(k, "m")
        assert w is not None and after is not None
        for col in w:
            np.testing.assert_array_equal(after[col], w[col])
    assert store.summaries(NOW) == sums_before


def test_a_compacted_store_keeps_working() -> None:
    store = flooded(3_000, [7, 2_500])
    store.forget_silent(NOW - 100)
    # The survivors grow out of their tier, new series come in, old ones are forgotten.
    store.observe(mk("flood-000007", NOW, [900.0] * 40))
    for i in range(50):
        store.observe(mk(f"new-{i}", NOW, [600.0] * 3))
    assert store.forget("flood-002500", "m")
    by = {s.node_id: s for s in store.summaries(NOW)}
    assert by["flood-000007"].samples == 1 + 2 + 40 and by["flood-000007"].p50 == 900.0
    assert by["new-49"].samples == 3 and by["new-49"].p50 == 600.0
    assert by["real-5"].p50 == 1005.0
    assert len(by) == 6 + 1 + 50


def test_compact_is_a_no_op_without_much_to_give_back() -> None:
    store = flooded(20, [3])
    peak = store.nbytes()
    assert store.compact() == 0
    assert store.nbytes() == peak


def test_compact_after_forget_one_by_one() -> None:
    store = flooded(5_000, [])
    for i in range(4_999):                  # the last one lives in the largest slab
        store.forget(f"flood-{i:06d}", "m")
    big = store.nbytes()
    assert store.compact() > 0
    assert store.nbytes() < big / 20
    assert store.window("flood-004999", "m") is not None
    (s,) = [s for s in store.summaries(NOW) if s.node_id == "flood-004999"]
    assert s.samples == 1 and s.p50 == 500.0 + 4_999 % 7


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 130)), min_size=1, max_size=60),
       st.sets(st.integers(0, 300)))
def test_compact_changes_no_window_and_no_summary(obs: list[tuple[int, int]],
                                                  forget: set[int]) -> None:
    store = WindowStore(S)
    for k, (node, n) in enumerate(obs):
        store.observe(mk(f"n{node}", NOW - 60 + k, [float(100 + node + j) for j in range(n)]))
    for node in forget:
        store.forget(f"n{node}", "m")
    keys = sorted(store.keys())
    windows = {k: store.window(*k) for k in keys}
    sums = store.summaries(NOW)
    store.compact()
    assert store.summaries(NOW) == sums
    for k, w in windows.items():
        after = store.window(*k)
        assert w is not None and after is not None
        for col in w:
            np.testing.assert_array_equal(after[col], w[col])
    store.observe(mk("late", NOW, [5.0] * 20))      # and it keeps taking samples
    assert {s.node_id for s in store.summaries(NOW)} == {k[0] for k in keys} | {"late"}
