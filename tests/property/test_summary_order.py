"""The summary pass's kept rows (:class:`tailguard.core.window.summarize.SummaryOrder`): while
the rings' layout stands (``RingTiers.layout``) a pass takes its rows in the order it kept
instead of sorting its summaries, and the fields their records seldom change as it kept them
until the store marks them stale. Whatever the store went through between two passes (new
series in any order, series with no ring yet, rings outgrowing their tier, series forgotten,
the store compacted or restored, restarts, a new hardware, an earlier first sign of life), its
summaries equal the old pass's: every summary, sorted by (model, node_id), as a pass with no
kept rows gives them."""

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
                                          "restore", "tick", "restart", "hardware", "early", "resume"]),
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
        elif op in ("restart", "hardware", "early"):   # instance_ts, hardware, first_seen_ts
            store.observe_heartbeat(Heartbeat(name, m, "H100" if op == "hardware" else "A100",
                                              now - 1e6 if op == "early" else now,
                                              instance=f"i{now}" if op == "restart" else None))
        elif op == "resume":                        # signs of life after a gap: resumed_ts
            now += 1000.0
            ts = now + np.arange(12.0)
            store.observe(SampleBatch(name, m, "A100", ts, rng.lognormal(10, 0.4, 12),
                                      np.ones(12, bool), np.zeros(12, bool)))
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


def test_kept_fields_follow_every_writer() -> None:
    """Each write of a field the pass keeps (a new hardware from a heartbeat or a batch, a
    restart, an earlier first sign of life, signs of life resuming after a gap, a restore) shows
    in the next pass, the layout standing where it does (so the kept fields were dropped)."""
    store = WindowStore(CFG)
    now = T0

    def batch(name: str, ts: np.ndarray, hardware: str = "A100", instance: str | None = None) -> None:
        store.observe(SampleBatch(name, "m", hardware, ts, np.full(ts.size, 1e5), np.ones(ts.size, bool),
                                  np.zeros(ts.size, bool), instance=instance))

    for name in ("a", "b"):
        batch(name, now - np.arange(3.0), instance="i0")
    writes = [lambda: store.observe_heartbeat(Heartbeat("a", "m", "H100", now)),
              lambda: batch("b", np.array([now]), hardware="L4"),
              lambda: batch("a", np.array([now]), hardware="H100", instance="i1"),
              lambda: store.observe_heartbeat(Heartbeat("b", "m", "L4", now - 1e5)),
              lambda: batch("a", now + 1000.0 + np.arange(12.0), hardware="H100"),
              lambda: store.restore(store.snapshot())]
    for write in writes:
        store.summaries(now)
        layout = store.tiers.layout
        write()
        now += 10.0
        assert store.summaries(now) == _unordered(store, now)
        assert store.tiers.layout == layout or write is writes[-1]
