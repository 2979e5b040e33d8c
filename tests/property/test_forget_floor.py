"""``WindowStore.forget_silent`` skips its look at every series when no series can have been
last seen before the bound (a floor of every series' last sign of life, which only grows):
whatever the store went through (samples and heartbeats at any time, late ones included,
new series, restores), it forgets exactly the series a look at every one finds, in order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.window.window import WindowStore

CFG = DetectorSettings(window_size=32, min_samples=5)
T0 = 1_764_680_000.0
OPS = st.lists(st.tuples(st.sampled_from(["samples", "heartbeat", "forget_silent", "restore"]),
                         st.integers(0, 9), st.floats(-500.0, 500.0)), min_size=1, max_size=40)


@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_forget_silent_forgets_what_a_look_at_every_series_finds(ops: list[tuple[str, int, float]]) -> None:
    store = WindowStore(CFG)
    for op, node, dt in ops:
        name, at = f"n{node}", T0 + dt
        if op == "samples":
            store.observe(SampleBatch(name, "m", None, np.array([at, at - 1.0]), np.array([1e5, 2e5]),
                                      np.ones(2, bool), np.zeros(2, bool)))
        elif op == "heartbeat":
            store.observe_heartbeat(Heartbeat(name, "m", None, at))
        elif op == "restore":
            store.restore(store.snapshot())
        else:
            want = sorted(k for k, s in store._series.items()
                          if s.last_seen_ts is not None and s.last_seen_ts < at)
            assert store.forget_silent(at) == want
            assert all(k not in store for k in want)
