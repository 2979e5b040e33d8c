"""The summary pass's kept order (:class:`tailguard.core.window.summarize.SummaryOrder`): while
the rings' layout stands (``RingTiers.layout``) a pass takes its rows in the order it kept
instead of sorting its summaries. Whatever the store went through between two passes (new
series in any order, series with no ring yet, rings outgrowing their tier, series forgotten,
the store compacted or restored), its summaries equal the old pass's: every summary, sorted
by (model, node_id), as a pass with no kept order gives them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window import summarize as summarize_module
from tailguard.core.window.window import WindowStore

CFG = DetectorSettings(window_size=64, min_samples=5, max_sample_age_s=600.0, tick_interval_s=30.0)
T0 = 1_764_680_000.0
OPS = st.lists(st.tuples(st.sampled_from(["samples", "many", "heartbeat", "forget", "compact",
                                          "restore", "tick"]),
                         st.integers(0, 11), st.integers(0, 2)), min_size=1, max_size=40)


def _unordered(store: WindowStore, now_s: float) -> list[WindowSummary]:
    """The summaries as a pass with no kept order makes them (a full sort)."""
    return summarize_module.summarize(store.tiers.used_slabs(), store._series, store._model_names,
                                      store.settings, now_s)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1))
def test_kept_order_gives_the_sorted_summaries(ops: list[tuple[str, int, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    store = WindowStore(CFG)
    now = T0
    passes = 0
    for op, node, model in ops:
        name, m = f"n{(node * 7) % 12:02}", f"model-{model}"
        now += 1.0
        if op in ("samples", "many"):
            n = 3 if op == "samples" else 40        # "many" moves a ring up a tier
            ts = now - rng.uniform(0.0, 50.0, n)
            store.observe(SampleBatch(name, m, "A100", ts, rng.lognormal(10, 0.4, n),
                                      np.ones(n, bool), np.zeros(n, bool)))
        elif op == "heartbeat":                     # a series with no ring yet
            store.observe_heartbeat(Heartbeat(name, m, "A100", now))
        elif op == "forget":
            store.forget(name, m)
        elif op == "compact":
            store.compact()
        elif op == "restore":
            store.restore(store.snapshot())
        got = store.summaries(now)
        want = _unordered(store, now)
        assert got == want
        assert [(s.model, s.node_id) for s in got] == sorted((s.model, s.node_id) for s in got)
        passes += 1
    assert passes == len(ops)


def test_a_kept_order_is_dropped_when_the_layout_changes() -> None:
    """Two series swap places in the build order (one forgotten, a new one takes its row):
    the next pass sorts again instead of reusing the old order."""
    store = WindowStore(CFG)
    for name in ("b", "a", "c"):
        store.observe(SampleBatch(name, "m", None, np.array([T0]), np.array([1e5]),
                                  np.ones(1, bool), np.zeros(1, bool)))
    first = store.summaries(T0 + 1.0)
    assert [s.node_id for s in first] == ["a", "b", "c"]
    layout = store.tiers.layout
    store.forget("a", "m")
    store.observe(SampleBatch("0", "m", None, np.array([T0]), np.array([2e5]),
                              np.ones(1, bool), np.zeros(1, bool)))
    assert store.tiers.layout > layout
    assert [s.node_id for s in store.summaries(T0 + 2.0)] == ["0", "b", "c"]
