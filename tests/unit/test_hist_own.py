"""Histogram pairs below min_peers: each pair's own bucket baseline (an EWMA of its CDFs at the
bounds), the shared-change check, and the exceedance test against the baseline, with exact
hand-counted shares."""

from __future__ import annotations

import math

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.health import Verdict
from tailguard.core.judge.hist_baselines import HistBaselines, cdf_of
from tailguard.core.judge.hist_own import MOVED_GAP, OwnHist, moved, own_reference
from tailguard.core.judge.hist_rules import HistJudge
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.own_history import HALF_LIFE_S, MIN_TICKS
from tailguard.core.window.hist_window import HistWindow

ST = DetectorSettings()
B = (0.3, 0.5, 0.8, 1.0)
HEALTHY = (60, 38, 2, 0, 0)      # CDF .60, .98, 1, 1
SLOW = (5, 25, 50, 15, 5)        # a node about 3x slower


def win(counts: tuple[int, ...], bounds: tuple[float, ...] = B, sum_s: float | None = None) -> HistWindow:
    return HistWindow(bounds, counts, sum(counts), sum_s, 30.0)


def summary(node: str, w: HistWindow) -> WindowSummary:
    return WindowSummary(node, "m", 0.0, "e2e_hist", w.requests, 1.0, 2.0, None, None, hardware="A100",
                         extra={"hist": {"e2e": w.to_dict()}})


def baselines(nodes: tuple[str, ...], counts: tuple[int, ...] = HEALTHY) -> HistBaselines:
    base = HistBaselines()
    for t in range(MIN_TICKS):
        for n in nodes:
            base.update(n, "e2e", win(counts), 30.0 * t)
    return base


def test_the_baseline_is_an_ewma_of_cdfs_at_the_bounds_and_ready_after_min_ticks() -> None:
    base = HistBaselines()
    base.update("a", "e2e", win((100, 0, 0, 0, 0)), 0.0)
    assert base.nodes["a"]["e2e"].cdf == (1.0, 1.0, 1.0, 1.0)
    base.update("a", "e2e", win((0, 100, 0, 0, 0)), HALF_LIFE_S)    # one half-life later: half way
    assert base.nodes["a"]["e2e"].cdf == pytest.approx((0.5, 1.0, 1.0, 1.0))
    assert base.ready("a", "e2e", B) is None
    for t in range(MIN_TICKS - 2):
        base.update("a", "e2e", win(HEALTHY), HALF_LIFE_S + 30.0 * (t + 1))
    assert base.ready("a", "e2e", B) is not None
    assert base.ready("a", "e2e", (0.3, 0.5)) is None                 # other bounds: not comparable
    base.update("a", "e2e", win((1, 1, 0), (0.3, 0.5)), 9999.0)       # other bounds start it over
    assert base.nodes["a"]["e2e"].ticks == 1 and base.nodes["a"]["e2e"].cdf == (0.5, 1.0)
    assert HistBaselines.from_dict(base.to_dict()) == base


def test_cdf_of_is_exact() -> None:
    assert cdf_of(win((10, 30, 10, 0, 0))) == (0.2, 0.8, 1.0, 1.0)


def test_moved_needs_a_share_above_a_bound_grown_past_noise() -> None:
    base = baselines(("a",))
    b = base.nodes["a"]["e2e"]
    assert not moved(win(HEALTHY), b, 100)
    # k50 is bound 0.3 (CDF .60): 40 % above it in the baseline; 40 % + 10 % gap + 3 SE (4.9 %)
    se = 3 * math.sqrt(0.4 * 0.6 / 100)
    assert 0.4 + max(MOVED_GAP, se) < 0.55 and not moved(win((46, 54, 0, 0, 0)), b, 100)
    assert moved(win((44, 56, 0, 0, 0)), b, 100)
    assert moved(win(SLOW), b, 100)


def test_a_slow_node_is_abnormal_against_its_own_baseline_unless_the_other_moved_too() -> None:
    base = baselines(("a", "b"))
    slow, ok = summary("a", win(SLOW)), summary("b", win(HEALTHY))
    j = OwnHist(base, {"a": slow, "b": ok}, ST).judge("e2e", win(SLOW), slow)
    assert j is not None and j.verdict is Verdict.ABNORMAL
    assert "its own baseline" in (j.detail or "")
    both = summary("b", win(SLOW))
    assert OwnHist(base, {"a": slow, "b": both}, ST).judge("e2e", win(SLOW), slow) is None
    # alone: nobody to tell a shared change from a fault
    assert OwnHist(base, {"a": slow}, ST).judge("e2e", win(SLOW), slow) is None
    # a healthy window against its own history is normal
    j = OwnHist(base, {"a": summary("a", win(HEALTHY)), "b": ok}, ST).judge("e2e", win(HEALTHY), ok)
    assert j is not None and j.verdict is Verdict.NORMAL


def test_own_reference_is_the_baseline_cdf() -> None:
    b = baselines(("a",)).nodes["a"]["e2e"]
    ref = own_reference(b)
    assert ref.cdf == pytest.approx((0.6, 0.98, 1.0, 1.0)) and ref.k50 == 0 and ref.k99 == 2


def test_a_class_without_peers_is_judged_on_own_history_through_the_hist_judge() -> None:
    base = baselines(("a", "b"))
    peers = {"a": summary("a", win(SLOW)), "b": summary("b", win(HEALTHY))}
    hj = HistJudge(peers, ST, own=OwnHist(base, peers, ST))
    assert hj.judge(peers["a"]).verdict is Verdict.ABNORMAL
    # b's only other pair (a) moved: b is held, not judged (a change it may share)
    assert hj.judge(peers["b"]).verdict is Verdict.NONE
    assert HistJudge(peers, ST).judge(peers["a"]).verdict is Verdict.NONE     # no fallback: no verdict
    calm = {"a": summary("a", win(HEALTHY)), "b": peers["b"]}
    assert HistJudge(calm, ST, own=OwnHist(base, calm, ST)).judge(calm["b"]).verdict is Verdict.NORMAL


def test_the_evaluator_admits_a_two_node_histogram_model_and_keeps_baselines_in_its_snapshot() -> None:
    ev = FleetEvaluator(ST)
    t = 0.0
    routed: frozenset[str] = frozenset()
    while t < ST.warmup_s + 10 * ST.tick_interval_s:
        tick = ev.evaluate("m", [summary("a", win(HEALTHY)), summary("b", win(HEALTHY))], t)
        routed = tick.routing
        t += ST.tick_interval_s
    assert routed == {"a", "b"}
    snap = ev.snapshot_model("m")
    assert set(snap["hist_own"]) == {"a", "b"}
    assert ModelState.from_dict(snap).hist_own == ev._models["m"].hist_own
    p = ev.pair("m", "a")
    assert p is not None and p.state is HealthState.HEALTHY
    for _ in range(ST.confirm_windows):
        tick = ev.evaluate("m", [summary("a", win(SLOW)), summary("b", win(HEALTHY))], t)
        t += ST.tick_interval_s
    assert tick.routing == {"b"}

