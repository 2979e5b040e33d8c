"""Histogram weights from the mean of recent windows (app/core/judge/hist_trend.py, hist_weights.py):
Triton's counters (a mean per interval) and TGI's 1.5^k buckets, where one window cannot see a pod
1.3x slower; simulated windows of heavy-tailed (LLM-like) requests, ticks 30 s apart."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_hist_rules import ST, summary

from tailguard.core.contract.types import WeightEvidence, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.hist_trend import Average, HistTrend, peer_spread, trend_noise
from tailguard.core.judge.hist_weights import targets
from tailguard.core.judge.peers import PeerSet
from tailguard.core.judge.weights import NodeWeight, step
from tailguard.core.window.hist_window import HistWindow
from tailguard.sim.exposition import tgi_buckets

TGI = tgi_buckets()


def _requests(rng: np.random.Generator, factor: float, n: int) -> np.ndarray:
    """LLM-like request latencies (s): lognormal median 3 s, sigma 0.8, 0.4 % of them 3-12x."""
    lat = 3.0 * factor * np.exp(rng.normal(0.0, 0.8, n))
    spikes = rng.random(n) < 0.004
    lat[spikes] *= rng.uniform(3.0, 12.0, int(spikes.sum()))
    return lat


def _window(lat: np.ndarray, bounds: tuple[float, ...]) -> HistWindow:
    counts = np.bincount(np.searchsorted(bounds, lat), minlength=len(bounds) + 1).tolist()
    return HistWindow(bounds, tuple(counts), len(lat), float(lat.sum()), 30.0)


def _peers(rng: np.random.Generator, slow: dict[str, float], bounds: tuple[float, ...], pods: int = 10,
           n: int = 150, scale: float = 1.0) -> PeerSet:
    nodes = [f"pod-{i}" for i in range(pods)]
    sums = [summary(p, {"e2e": _window(_requests(rng, scale * slow.get(p, 1.0), n), bounds)}) for p in nodes]
    return PeerSet(nodes, sums, [1.0] * pods, [2.0] * pods, [], [])


def _ticks(rng: np.random.Generator, slow: dict[str, float], bounds: tuple[float, ...], ticks: int,
           trend: HistTrend | None, **kw: float) -> list[dict[str, WeightEvidence]]:
    return [targets(_peers(rng, slow, bounds, **kw), ST, frozenset(), trend, 1000.0 + 30.0 * t)  # type: ignore[arg-type]
            for t in range(ticks)]


def _weights(ticks: list[dict[str, WeightEvidence]]) -> list[dict[str, float]]:
    """The weights the targets give, confirmed as stage 2 confirms them (:func:`step`)."""
    state: dict[str, NodeWeight] = {}
    out = []
    for t in ticks:
        for node in state.keys() | t.keys():
            ev = t.get(node)
            state[node] = step(state.get(node, NodeWeight()), 1.0 if ev is None else ev.target,
                               ST.confirm_windows)
        out.append({n: nw.weight for n, nw in state.items() if nw.weight < 1.0})
    return out


@pytest.mark.parametrize("bounds", [(), TGI], ids=["triton-counters", "tgi-buckets"])
@pytest.mark.parametrize("seed", range(4))
def test_a_pod_1_3x_slower_is_seen_over_windows_where_one_window_cannot(bounds: tuple[float, ...],
                                                                         seed: int) -> None:
    """A window's noise is about as wide as a 1.3x slow-down (Triton's counters gave no target
    at all before). With the trend the pod's weight is 0.55-0.85 from the 10th window (5
    minutes) on; no other pod gets one."""
    rng = np.random.default_rng(seed)
    got = _ticks(rng, {"pod-3": 1.3}, bounds, 14, HistTrend(), n=300)
    weights = _weights(got)
    assert all(set(w) <= {"pod-3"} for w in weights), weights
    late = [w.get("pod-3", 1.0) for w in weights[9:]]
    assert max(late) <= 0.85 and min(late) >= 0.55, late
    assert got[-1]["pod-3"].value / got[-1]["pod-3"].ref == pytest.approx(1.3, rel=0.12)


@pytest.mark.parametrize("bounds", [(), TGI], ids=["triton-counters", "tgi-buckets"])
@pytest.mark.parametrize(("pods", "n"), [(3, 100), (5, 300), (10, 150), (20, 60)])
def test_a_healthy_fleet_gets_no_target_over_many_windows(bounds: tuple[float, ...], pods: int, n: int) -> None:
    """60 windows (30 minutes) of a healthy fleet, 3 seeds: no pod ever gets a weight, and the
    trend adds no target below 1 to the windows' own (TGI's lone windows give a few, never
    confirmed)."""
    for seed in range(3):
        windows = [_peers(np.random.default_rng(100 + seed), {}, bounds, pods=pods, n=n) for _ in range(60)]
        trend = HistTrend()
        got = [targets(p, ST, frozenset(), trend, 30.0 * t) for t, p in enumerate(windows)]
        assert [w for w in _weights(got) if w] == []
        assert [{n: e.target for n, e in t.items()} for t in got] == [
            {n: e.target for n, e in targets(p, ST).items()} for p in windows]


def test_a_load_event_moves_nobody() -> None:
    """The whole fleet 2x slower from one window on: estimates are against each window's peers."""
    rng = np.random.default_rng(7)
    trend = HistTrend()
    got = _ticks(rng, {}, (), 8, trend) + _ticks(rng, {}, (), 8, trend, scale=2.0)
    assert [t for t in got if t] == []


def test_triton_counters_weight_a_pod_2x_slower_within_a_few_windows() -> None:
    """A window's mean alone gives no target (a few long requests move it); the median of a
    pod's windows does once most of them are slow: 2x from the 6th window on."""
    rng = np.random.default_rng(3)
    assert targets(_peers(rng, {"pod-1": 2.0}, ()), ST) == {}
    trend = HistTrend()
    got = _ticks(rng, {}, (), 4, trend) + _ticks(rng, {"pod-1": 2.0}, (), 6, trend)
    assert all(t == {} for t in got[:6]) and set(got[-1]) == {"pod-1"}, got
    assert got[-1]["pod-1"].target <= 0.35 and got[-1]["pod-1"].signal == "e2e_hist"


def test_a_mean_of_fewer_requests_has_a_wider_band() -> None:
    """The standard error of a mean of n requests: the peers' spread at their median count,
    times sqrt(median / n); a pod with 1/16 of the requests gets a band four times wider."""
    rng = np.random.default_rng(5)
    base = [_peers(rng, {}, (), n=1600) for _ in range(3)]

    def band_with(n: int) -> float:
        trend = HistTrend()
        for t, b in enumerate(base):
            pod0 = summary("pod-0", {"e2e": _window(_requests(rng, 1.6, n), ())})
            peers = PeerSet(b.nodes, [pod0, *b.summaries[1:]], b.p50s, b.ratios, [], [])
            got = targets(peers, ST, frozenset({"pod-0"}), trend, 30.0 * t)
        return math.log(got["pod-0"].band)

    assert band_with(100) == pytest.approx(4 * band_with(1600), rel=0.35)


def test_old_estimates_leave_the_trend_and_it_round_trips() -> None:
    trend = HistTrend()
    key = "e2e_hist|A100"
    for ts, a in ((0.0, 0.3), (30.0, 0.1), (60.0, 0.2)):
        trend.record(key, ts, 300.0, {"a": (a, 0.05), "b": (0.0, 0.05)}, 0.06)
    trend.record(key, 90.0, 300.0, {"b": (0.0, 0.05)}, 0.06)
    trend.record(key, 90.0, 300.0, {"b": (0.0, 0.05), "c": (0.0, 0.05)}, 0.06)   # the same tick again
    avgs = trend.averages(key, {"a": 0, "b": 0, "c": 0})
    assert set(avgs) == {"a", "b"}                         # c: fewer than MIN_WINDOWS windows
    assert avgs["a"] == Average(pytest.approx(0.2), pytest.approx(math.sqrt(math.pi / 2) * 0.05 / math.sqrt(3)), 3)
    assert avgs["b"].windows == 4
    assert trend.window_noise(key) == pytest.approx(0.06)  # the peers': b's deviations are 0
    assert HistTrend.from_dict(trend.to_dict()) == trend
    trend.record(key, 320.0, 300.0, {"a": (0.0, 0.05)}, 0.06)     # 0 s is past the horizon
    assert trend.averages(key, {"a": 0})["a"].windows == 3
    trend.record(key, 400.0, 300.0, {"a": (0.0, 0.05)}, 0.06)
    assert set(trend.rel) == {"a"} and len(trend.rel["a"][key]) == 2   # b's last window is past it
    trend.drop("a")
    assert trend.averages(key, {"a": 0}) == {}


def test_the_noise_of_an_average_shrinks_with_its_windows_but_not_below_the_peers() -> None:
    a = Average(0.2, 0.01, 9)
    assert trend_noise(a, 0.0, 0.09) == pytest.approx(math.sqrt(math.pi / 2) * 0.03)
    assert trend_noise(a, 0.05, 0.09) == 0.05
    assert peer_spread({"x": Average(0.0, 0.0, 1)}) == 0.0


def test_the_evaluator_weights_a_triton_pod_and_keeps_its_trend_in_the_snapshot() -> None:
    """Stage 2 end to end on Triton's counters (bucketless windows): the pod 1.4x slower is
    weighted after a few ticks, nobody else; a model restored from its snapshot mid-way goes on
    to the same weights as the one that was not."""
    rng = np.random.default_rng(11)

    def windows() -> list[WindowSummary]:
        return [WindowSummary(f"pod-{i}", "m", 0.0, "e2e_hist", 300, 1.0, 2.0, None, None, hardware="A100",
                              extra={"hist": {"e2e": _window(_requests(rng, 1.4 if i == 2 else 1.0, 300),
                                                             ()).to_dict()}})
                for i in range(8)]

    ev, twin = FleetEvaluator(ST), FleetEvaluator(ST)
    t, seen = 0.0, []
    while t < ST.warmup_s + 20 * ST.tick_interval_s:
        ws = windows()
        tick = ev.evaluate("m", ws, t)
        if t >= ST.warmup_s + 5 * ST.tick_interval_s:
            if not seen:
                twin.restore_model("m", json.loads(json.dumps(ev.snapshot_model("m"))))
                assert ev.snapshot_model("m")["hist_trend"]["rel"]
            else:
                assert twin.evaluate("m", ws, t).weights == tick.weights
            seen.append(dict(tick.weights))
        t += ST.tick_interval_s
    assert all(set(w) <= {"pod-2"} for w in seen), seen
    assert 0.5 <= seen[-1].get("pod-2", 1.0) <= 0.8, seen
