"""Snapshot → JSON → restore round trips over histories with long gaps and clock jumps.

Guards ``WindowStore.snapshot``/``restore`` and ``Detector.snapshot``/``restore`` where
event time spans hours and jumps back and forth by more than a ring's span (2³² µs ≈
71.6 min: rebases, samples stored as too old): the snapshot is JSON without NaN or
infinities, the restore takes it, and the restored store (detector) gives the same
summaries and cluster pools (tick results, statuses, routing) as the original at every later
tick, also after both are fed the same new events: what a ring keeps (its time base, its
place in its slots, its samples stored as too old) and a restart awaiting confirmation
survive the round trip. Also probes, failed requests, token columns, heartbeats with new
instances and histogram intervals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Event, Heartbeat, SampleBatch
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.replay.detector import Detector
from tailguard.core.window.window import WindowStore

T0 = 1_000_000.0
NODES = ("a", "b", "c")
HIST_NODE = "h"                    # a node that sends histograms (of MODELS[0])
ALL_NODES = (*NODES, HIST_NODE)
MODELS = ("m1", "m2")
SIZED = {("a", "m1"), ("c", "m2")}     # series whose samples carry token columns
# Clock jumps, back and forth, below and above a ring's span (4295 s) and the span a ring
# keeps below a new base (3221 s).
JUMPS = (-9000.0, -5000.0, -4400.0, -3500.0, -700.0, 60.0, 300.0, 3500.0, 4400.0, 9000.0)


@dataclass(frozen=True)
class Batch:
    node: str
    model: str
    offsets: tuple[float, ...]      # s after the series' clock, in arrival order
    lat: tuple[float, ...]
    ok: tuple[bool, ...]
    probe: tuple[bool, ...]


@dataclass(frozen=True)
class Beat:
    node: str
    model: str
    instance: str | None            # a new one marks a restart


@dataclass(frozen=True)
class Hist:
    """One scrape interval of node ``HIST_NODE``'s e2e histogram."""

    counts: tuple[int, int, int, int]
    failed: int
    instance: str | None


@dataclass(frozen=True)
class Jump:
    node: str
    by_s: float


@dataclass(frozen=True)
class Tick:
    at_node: str                    # the tick's time is this node's clock, plus:
    plus_s: float


Op = Batch | Beat | Hist | Jump | Tick


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    n = draw(st.integers(1, 12))
    if draw(st.booleans()):             # steady traffic
        steps = [draw(st.sampled_from([0.0, 0.5, 1.0, 7.25, 30.0]))] * n
    else:                               # with jumps inside the batch
        steps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 30.0, -40.0, 4000.0, -4000.0]),
                              min_size=n, max_size=n))
    lat = draw(st.lists(st.sampled_from([900.0, 1000.0, 1100.0, 1300.0, 5000.0]), min_size=n, max_size=n))
    ok = draw(st.lists(st.sampled_from([True, True, True, False]), min_size=n, max_size=n))
    probe = draw(st.lists(st.sampled_from([False, False, False, True]), min_size=n, max_size=n))
    return Batch(draw(st.sampled_from(NODES)), draw(st.sampled_from(MODELS)),
                 tuple(np.cumsum(steps).tolist()), tuple(lat), tuple(ok), tuple(probe))


ops = st.one_of(
    batches(), batches(), batches(),
    st.builds(Beat, st.sampled_from(NODES), st.sampled_from(MODELS), st.sampled_from([None, None, "i1", "i2"])),
    st.builds(Hist, st.tuples(*[st.integers(0, 30)] * 4), st.integers(0, 3), st.sampled_from([None, "i1", "i2"])),
    st.builds(Jump, st.sampled_from(ALL_NODES), st.sampled_from(JUMPS)),
    st.builds(Jump, st.sampled_from(NODES), st.just(60.0)),
    st.builds(Tick, st.sampled_from(ALL_NODES), st.sampled_from([0.0, 1.0, 45.0, -200.0, 700.0])),
)
histories = st.lists(ops, min_size=1, max_size=40)


class Feed:
    """Turns ops into events: one clock per node, moved by batches and jumps."""

    def __init__(self) -> None:
        self.clock = dict.fromkeys(ALL_NODES, T0)

    def events(self, op: Batch | Beat | Hist | Jump) -> list[Event]:
        if isinstance(op, Jump):
            self.clock[op.node] += op.by_s
            return []
        if isinstance(op, Hist):
            self.clock[HIST_NODE] += 15.0
            return [HistogramBatch(HIST_NODE, MODELS[0], "gpu", "e2e", self.clock[HIST_NODE], 15.0,
                                   (0.5, 1.0, 2.0), op.counts, 0.8 * sum(op.counts), None, op.failed, op.instance)]
        t0 = self.clock[op.node]
        if isinstance(op, Beat):
            self.clock[op.node] += 1.0
            return [Heartbeat(op.node, op.model, "gpu", t0, op.instance)]
        ts = t0 + np.asarray(op.offsets)
        self.clock[op.node] = float(ts.max()) + 0.25
        n = ts.size
        sized = (op.node, op.model) in SIZED
        col = (lambda k: np.where(np.arange(n) % 3 == k, np.nan, 10.0 * (k + 1) + np.arange(n))) if sized else None
        return [SampleBatch(op.node, op.model, "gpu", ts, np.asarray(op.lat), np.asarray(op.ok, dtype=bool),
                            np.asarray(op.probe, dtype=bool),
                            None if col is None else col(0), None if col is None else col(1),
                            None if col is None else col(2) * 100.0)]

    def now(self, op: Tick) -> float:
        return self.clock[op.at_node] + op.plus_s


def pools(store: WindowStore, now_s: float) -> dict[str, list[float]]:
    """Each model's cluster pool at every 5th slot (every 2nd at window 16), sorted."""
    return {m: sorted(p.values.tolist()) for m, p in store.model_pools(now_s, per_series=8).items()}


def json_round_trip(snap: dict[str, Any]) -> Any:
    return json.loads(json.dumps(snap, allow_nan=False))


def store_settings(window: int, restart_gap_s: float) -> DetectorSettings:
    return DetectorSettings(window_size=window, min_samples=3, max_sample_age_s=600.0, restart_gap_s=restart_gap_s,
                            warmup_s=60.0, min_peers=2)


def steady(node: str, n: int, step: float = 1.0) -> Batch:
    return Batch(node, "m1", tuple(step * i for i in range(n)), (1000.0,) * n, (True,) * n, (False,) * n)


# A restart after a gap, confirmed by signs of life on both sides of the snapshot.
RESUMED_ACROSS = [steady("a", 10), Jump("a", 60.0), steady("a", 5), steady("a", 5), Tick("a", 0.0)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(history=RESUMED_ACROSS, cut=3, window=16, restart_gap_s=10.0)
@given(history=histories, cut=st.integers(0, 40), window=st.sampled_from([16, 40]),
       restart_gap_s=st.sampled_from([10.0, 60.0]))
def test_store_restored_after_gaps_and_clock_jumps_gives_the_same_summaries(
        history: list[Op], cut: int, window: int, restart_gap_s: float) -> None:
    st_ = store_settings(window, restart_gap_s)
    a, b = Detector(st_), Detector(st_)     # their stores, fed by Detector.observe
    store, other = a.store, b.store
    feed = Feed()
    cut = min(cut, len(history))
    for op in history[:cut]:
        if not isinstance(op, Tick):
            a.observe(feed.events(op))
    other.restore(json_round_trip(store.snapshot()))
    ends = [Tick(n, 0.0) for n in ALL_NODES]
    checks = [Tick(n, p) for n in NODES for p in (0.0, 700.0)] + ends + history[cut:] + ends
    for op in checks:
        if isinstance(op, Tick):
            now = feed.now(op)
            assert repr(other.summaries(now)) == repr(store.summaries(now)), now
            assert pools(other, now) == pools(store, now), now
            continue
        evs = feed.events(op)
        a.observe(evs)
        b.observe(evs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, cut=st.integers(0, 40), window=st.sampled_from([16, 40]),
       restart_gap_s=st.sampled_from([10.0, 60.0]))
def test_detector_restored_after_gaps_and_clock_jumps_gives_the_same_ticks(
        history: list[Op], cut: int, window: int, restart_gap_s: float) -> None:
    st_ = store_settings(window, restart_gap_s)
    det = Detector(st_)
    det.fleet_digest_per_series = 8     # pools of every 2nd (window 16) or 5th (40) slot
    feed = Feed()
    cut = min(cut, len(history))
    for op in history[:cut]:
        if isinstance(op, Tick):
            det.evaluate(feed.now(op))
        else:
            det.observe(feed.events(op))
    other = Detector(st_)
    other.fleet_digest_per_series = 8
    other.restore(json_round_trip(det.snapshot()))
    for op in history[cut:] + [Tick(n, 0.0) for n in ALL_NODES]:
        if isinstance(op, Tick):
            now = feed.now(op)
            assert repr(other.evaluate(now)) == repr(det.evaluate(now)), now
            # Not Detector.unresolved: a log of what past ticks marked, which a snapshot does
            # not hold (a restored detector's starts empty).
            assert (other.statuses(), other.routing()) == (det.statuses(), det.routing())
        else:
            evs = feed.events(op)
            det.observe(evs)
            other.observe(evs)
