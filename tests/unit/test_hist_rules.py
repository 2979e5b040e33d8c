"""Histogram pairs: stage 1's windows of bucket counts and stage 2's exceedance tests, against
exact answers (hand-counted shares, exact binomial tails)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.health import Verdict
from tailguard.core.judge.hist_rules import (
    MIN_FACTOR,
    P50_GAP,
    P99_FACTOR,
    P99_FLOOR,
    P99_SHARE,
    HistJudge,
    Z,
    judge_metric,
    on_shared_bounds,
    reference,
    share_above,
    shifted_share,
    windows_of,
)
from tailguard.core.replay.detector import Detector
from tailguard.core.window.hist_window import HistWindow, bucket_quantile
from tailguard.core.window.window import WindowStore

ST = DetectorSettings()
B = (0.3, 0.5, 0.8, 1.0)


def win(counts: list[int], requests: int | None = None, bounds: tuple[float, ...] = B) -> HistWindow:
    return HistWindow(bounds, tuple(counts), sum(counts) if requests is None else requests, None, 30.0)


def summary(node: str, wins: dict[str, HistWindow], hardware: str | None = "A100") -> WindowSummary:
    return WindowSummary(node, "m", 0.0, "e2e_hist", 1000, 1.0, 2.0, None, None, hardware=hardware,
                         extra={"hist": {k: w.to_dict() for k, w in wins.items()}})


def test_bucket_quantile_is_prometheus_interpolation() -> None:
    # 10 in (0, 0.3], 30 in (0.3, 0.5], 10 in (0.5, 0.8]: rank 25 of 50 is 15 into the 2nd bucket.
    assert bucket_quantile(B, (10, 30, 10, 0, 0), 0.5) == pytest.approx(0.3 + 0.2 * 15 / 30)
    assert bucket_quantile(B, (10, 30, 10, 0, 0), 0.1) == pytest.approx(0.3 * 5 / 10)
    assert bucket_quantile(B, (0, 0, 0, 0, 7), 0.5) == 1.0          # in +Inf: the highest finite bound
    assert bucket_quantile((), (4,), 0.5, 2.0) == 0.5               # bucketless: the mean
    assert bucket_quantile(B, (0, 0, 0, 0, 0), 0.5) is None


def test_reference_is_the_median_cdf_and_its_p50_p99_bounds() -> None:
    peers = [win([60, 39, 1, 0, 0]), win([40, 58, 2, 0, 0]), win([55, 44, 0, 1, 0])]
    ref = reference(peers)
    assert ref is not None
    # CDFs at 0.3: .60, .40, .55 -> median .55; at 0.5: .99, .98, .99 -> .99; at 0.8: 1, 1, .99 -> 1.
    assert ref.cdf == pytest.approx((0.55, 0.99, 1.0, 1.0))
    assert ref.k50 == 0 and ref.q50 == pytest.approx(0.45)
    assert ref.k99 == 1 and ref.q99 == pytest.approx(0.01)
    assert share_above(win([10, 30, 10, 0, 0]), 0) == pytest.approx(0.8)


# Finer buckets, and peers whose CDF at them is 0, .1, .5, .9, .99, 1, 1 (100 requests each).
FINE = (0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.9)
PEER = [0, 10, 40, 40, 9, 1, 0, 0]


def fine(counts: list[int], requests: int | None = None) -> HistWindow:
    return win(counts, requests, FINE)


def test_shifted_share_is_what_a_min_factor_slower_peer_can_show() -> None:
    ref = reference([fine(PEER)] * 3)
    assert ref is not None and ref.k50 == 2 and ref.k99 == 4
    assert MIN_FACTOR == 1.5
    # above 0.2: a 1.5x slower peer's CDF there is the peers' at 0.133 -- below every bound: unknown
    assert shifted_share(ref, 2) == 1.0
    assert shifted_share(ref, 3) == pytest.approx(0.5)     # 0.3 / 1.5 = 0.2: the peers' CDF .5
    assert shifted_share(ref, 4) == pytest.approx(0.1)     # 0.45 / 1.5 = 0.3: .9
    assert shifted_share(ref, 6) == pytest.approx(0.0)     # 0.9 / 1.5 = 0.6: 1.0


def test_p50_exceedance_limit_is_exact() -> None:
    ref = reference([fine(PEER)] * 3)
    assert ref is not None
    n = 400
    # Above 0.45 s a 1.5x slower peer has at most 10 %: the limit is max(0.5, 0.1 + P50_GAP) + margin.
    limit = max(0.5, 0.1 + P50_GAP) + Z * math.sqrt(0.25 / n)
    k_ok = max(k for k in range(n + 1) if k / n <= limit)      # at the limit: normal; one more: abnormal
    s = summary("x", {})
    j = judge_metric("e2e", fine([0, 0, 0, n - k_ok, 0, k_ok, 0, 0]), ref, s, ST)
    assert j.reason != "relative_p50"      # (the tail rule may see it: 57 % above where 10 % can be)
    j = judge_metric("e2e", fine([0, 0, 0, n - k_ok - 1, 0, k_ok + 1, 0, 0]), ref, s, ST)
    assert j.verdict is Verdict.ABNORMAL and j.reason == "relative_p50"
    assert "above 0.45 s" in (j.detail or "")


def test_a_shift_smaller_than_min_factor_is_never_a_p50_fault() -> None:
    ref = reference([fine(PEER)] * 3)
    assert ref is not None
    # everything one bucket up (0.2 -> 0.3 is 1.5x): the buckets cannot prove more than 1.5x
    j = judge_metric("e2e", fine([0, 0, 10, 40, 40, 10, 0, 0], requests=10_000), ref, summary("x", {}), ST)
    assert j.verdict is Verdict.NORMAL


def test_p50_margin_uses_requests_not_token_observations() -> None:
    ref = reference([fine(PEER)] * 3)
    assert ref is not None
    # 62 % above 0.45 s: abnormal on 4000 independent requests, not on 4000 tokens of 40 requests.
    tokens = [0, 0, 0, 1520, 0, 2480, 0, 0]
    s = summary("x", {})
    assert judge_metric("itl", fine(tokens, requests=4000), ref, s, ST).reason == "relative_p50"
    assert judge_metric("itl", fine(tokens, requests=40), ref, s, ST).reason != "relative_p50"


def _binom_sf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def test_p99_exceedance_needs_share_and_binomial_significance() -> None:
    ref = reference([fine(PEER)] * 3)
    assert ref is not None and ref.k99 == 4
    s = summary("x", {})
    n = 1000
    # Above 0.9 s a 1.5x slower peer has nothing: limit max(2 %, 3 x 0) and a healthy share of 1 %.
    lim = max(P99_SHARE, P99_FACTOR * 0.0)
    k = next(k for k in range(n) if k / n >= lim and _binom_sf(k, n, P99_FLOOR) < 1e-4)
    j = judge_metric("e2e", fine([0, 100, 400, 400, 100 - k, 0, 0, k]), ref, s, ST)
    assert j.verdict is Verdict.ABNORMAL and j.reason == "relative_p99" and "above 0.9 s" in (j.detail or "")
    j = judge_metric("e2e", fine([0, 100, 400, 400, 100 - k + 1, 0, 0, k - 1]), ref, s, ST)
    # past the share limit but not significant: held (not abnormal, and not a normal window either)
    assert (k - 1) / n >= lim
    assert j.verdict is Verdict.NONE and j.reason == "relative_p99" and "not yet significant" in (j.detail or "")
    below = math.ceil(lim * n) - 1
    j = judge_metric("e2e", fine([0, 100, 400, 400, 100 - below, 0, 0, below]), ref, s, ST)
    assert j.verdict is Verdict.NORMAL


def test_uniform_fleet_is_normal_and_relabelling_changes_nothing() -> None:
    rng = np.random.default_rng(3)
    peers = {}
    for i in range(8):
        lat = 0.18 * np.exp(rng.normal(0, 0.3, 600))
        counts = np.bincount(np.searchsorted(B, lat), minlength=len(B) + 1).tolist()
        peers[f"n{i}"] = summary(f"n{i}", {"e2e": win(counts)})
    hj = HistJudge(peers, ST)
    assert all(hj.judge(s).verdict is Verdict.NORMAL for s in peers.values())
    relabelled = {f"z{7 - i}": s._replace(node_id=f"z{7 - i}") for i, s in enumerate(peers.values())}
    hj2 = HistJudge(relabelled, ST)
    assert [hj.judge(s).detail for s in peers.values()] == [hj2.judge(s).detail for s in relabelled.values()]


def test_too_few_peers_or_another_class_give_no_verdict() -> None:
    same = {f"n{i}": summary(f"n{i}", {"e2e": win([90, 10, 0, 0, 0], requests=200)}) for i in range(3)}
    # Other buckets are judged at their own bounds (the next test): all of odd's requests above
    # 2.0 s, where the peers' CDF is 1.0 at 0.5 s already.
    odd = summary("odd", {"e2e": win([0, 0, 200], requests=200, bounds=(0.25, 2.0))})
    hj = HistJudge({**same, "odd": odd}, ST)
    assert hj.judge(odd).verdict is Verdict.ABNORMAL
    assert hj.judge(same["n0"]).verdict is Verdict.NORMAL
    two = HistJudge(dict(list(same.items())[:2]), ST)             # below min_peers (3)
    assert two.judge(same["n0"]).verdict is Verdict.NONE
    # another hardware class of one node is not judged against the A100s
    a10 = summary("a10", {"e2e": win([0, 0, 0, 0, 200], requests=200)}, hardware="A10")
    assert HistJudge({**same, "a10": a10}, ST).judge(a10).verdict is Verdict.NONE


# vLLM's e2e buckets before and after a release that added bounds above 60 s and one between.
OLD_B = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
NEW_B = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
         120.0, 240.0, 480.0, 960.0)


def _lognormal_win(rng: np.random.Generator, median_s: float, n: int, bounds: tuple[float, ...]) -> HistWindow:
    lat = median_s * np.exp(rng.normal(0, 0.35, n))
    counts = np.bincount(np.searchsorted(bounds, lat), minlength=len(bounds) + 1).tolist()
    return win(counts, bounds=bounds)


@pytest.mark.parametrize("seed", range(20))
def test_a_node_with_other_buckets_is_judged_at_its_own_bounds(seed: int) -> None:
    """A rolling upgrade: the new version's node exports other buckets. It was refused a verdict
    (never admitted, never caught); now a healthy one is normal and a 3x slower one abnormal."""
    rng = np.random.default_rng(seed)
    peers = {f"n{i}": summary(f"n{i}", {"e2e": _lognormal_win(rng, 1.2, 400, OLD_B)}) for i in range(6)}
    healthy = summary("new", {"e2e": _lognormal_win(rng, 1.2, 400, NEW_B)})
    slow = summary("new", {"e2e": _lognormal_win(rng, 3.6, 400, NEW_B)})
    coarse = summary("new", {"e2e": _lognormal_win(rng, 1.2, 400, (1.0, 10.0, 100.0))})
    for node, expect in ((healthy, Verdict.NORMAL), (slow, Verdict.ABNORMAL), (coarse, Verdict.NORMAL)):
        j = HistJudge({**peers, "new": node}, ST).judge(node)
        assert j.verdict is expect, j.detail
    # The peers' own verdicts are those of a fleet without the newcomer.
    alone = HistJudge(peers, ST)
    mixed = HistJudge({**peers, "new": slow}, ST)
    assert [alone.judge(s).detail for s in peers.values()] == [mixed.judge(s).detail for s in peers.values()]


def test_buckets_on_one_side_only_are_not_compared() -> None:
    peers = {f"n{i}": summary(f"n{i}", {"e2e": win([90, 10, 0, 0, 0], requests=200)}) for i in range(3)}
    counters = summary("t", {"e2e": HistWindow((), (200,), 200, 400.0, 30.0)})     # Triton's counters
    assert HistJudge({**peers, "t": counters}, ST).judge(counters).verdict is Verdict.NONE


def test_per_token_metric_fires_first() -> None:
    itl_b = (0.025, 0.05, 0.075, 0.1)
    peers = {f"n{i}": summary(f"n{i}", {"e2e": win([50, 50, 0, 0, 0], requests=300),
                                       "itl": win([0, 3000, 0, 0, 0], requests=300, bounds=itl_b)})
             for i in range(4)}
    slow = summary("n0", {"e2e": win([50, 50, 0, 0, 0], requests=300),
                          "itl": win([0, 0, 1500, 1500, 0], requests=300, bounds=itl_b)})
    j = HistJudge({**peers, "n0": slow}, ST).judge(slow)
    assert j.verdict is Verdict.ABNORMAL and j.evidence is not None and j.evidence.signal == "itl_hist"


def _ev(node: str, ts: float, counts: list[int], **kw: Any) -> HistogramBatch:
    return HistogramBatch(node, "m", "A100", kw.pop("metric", "e2e"), ts, 10.0, B, tuple(counts),
                          kw.pop("sum_s", None), kw.pop("requests", None), kw.pop("failed", None),
                          kw.pop("instance", None))


def test_stage1_window_spans_a_tick_and_min_samples_and_respects_cuts() -> None:
    st = DetectorSettings()
    store = WindowStore(st)
    for k in range(1, 31):                      # 30 scrapes, 40 requests each
        store.observe_histogram(_ev("a", 1000.0 + 10 * k, [40, 0, 0, 0, 0], failed=2 if k == 30 else 0))
    (s,) = store.summaries(1300.0)
    w = (windows_of(s) or {})["e2e"]
    assert (w.requests, w.span_s) == (120, 30.0)          # 3 scrapes reach both 30 s and 100 requests
    assert s.signal == "e2e_hist" and s.samples == 120 and s.requests_total == 1200 and s.failed_total == 2
    (s,) = store.summaries(1300.0, {("a", "m"): 1285.0})  # cut: only intervals starting at/after it
    assert (windows_of(s) or {})["e2e"].requests == 40 and s.probe_samples == 40
    # a restart (new instance) drops the old process's intervals
    store.observe_histogram(_ev("a", 1310.0, [5, 0, 0, 0, 0], instance="a#1310"))
    store.observe_histogram(_ev("a", 1320.0, [5, 0, 0, 0, 0], instance="a#1320"))
    (s,) = store.summaries(1320.0)
    assert (windows_of(s) or {})["e2e"].requests == 5 and s.instance_ts == 1320.0


def test_store_snapshot_and_the_summary_wire_form_keep_the_buckets() -> None:
    store = WindowStore(ST)
    for k in range(1, 6):
        store.observe_histogram(_ev("a", 100.0 + 10 * k, [10, 20, 5, 0, 1], instance="a"))
    again = WindowStore(ST)
    again.restore(store.snapshot())
    assert again.summaries(150.0) == store.summaries(150.0)
    (s,) = store.summaries(150.0)
    back = WindowSummary.from_dict(s.to_dict())            # stage 1 -> Kafka -> stage 2
    assert windows_of(back) == windows_of(s) and (windows_of(s) or {})["e2e"].counts == (30, 60, 15, 0, 3)


def test_detector_ejects_a_slow_histogram_node_and_keeps_the_others() -> None:
    det = Detector(ST)
    rng = np.random.default_rng(5)
    out_at = None
    for k in range(1, 90):
        ts = 1_764_680_000.0 + 10 * k
        evs = []
        for i in range(6):
            f = 3.0 if i == 2 and k > 40 else 1.0
            lat = 0.18 * f * np.exp(rng.normal(0, 0.3, 200))
            counts = np.bincount(np.searchsorted(B, lat), minlength=len(B) + 1).tolist()
            evs.append(_ev(f"n{i}", ts, counts, requests=200, instance=f"n{i}"))
        det.observe(evs)
        if k % 3 == 0:
            for t in det.evaluate(ts).transitions:
                assert t.node_id == "n2" or t.reason in ("first_seen", "admitted"), t
                if t.node_id == "n2" and not t.routed and out_at is None and t.to_state == "unhealthy":
                    out_at = ts
    assert out_at is not None and out_at - (1_764_680_000.0 + 400) <= 120


def _scraped_fleet(pods_at: Callable[[int], list[tuple[str, tuple[float, ...], float]]], scrapes: int, *,
                   requests: int, seed: int) -> Detector:
    """A Detector fed ``scrapes`` scrapes 10 s apart of the pods ``pods_at(k)`` gives at scrape
    ``k`` (node, bounds, slow-down of a 1.2 s lognormal), judged every 3rd scrape."""
    det = Detector(ST)
    rng = np.random.default_rng(seed)
    for k in range(1, scrapes):
        ts = 1_764_680_000.0 + 10 * k
        evs = []
        for node, bounds, f in pods_at(k):
            lat = 1.2 * f * np.exp(rng.normal(0, 0.35, requests))
            counts = tuple(np.bincount(np.searchsorted(bounds, lat), minlength=len(bounds) + 1).tolist())
            evs.append(HistogramBatch(node, "m", "A100", "e2e", ts, 10.0, bounds, counts, None, requests,
                                      None, node))
        det.observe(evs)
        if k % 3 == 0:
            det.evaluate(ts)
    return det


@pytest.mark.parametrize("slow", [False, True])
def test_a_rolling_upgrade_with_new_buckets_admits_new_pods_and_catches_a_slow_one(slow: bool) -> None:
    """Pods of a new server version (new ids, other buckets) join a scraped fleet of 6: each is
    admitted within warm-up + a few ticks, and a 3x slower one is never routed."""
    old = [(f"old{i}", OLD_B, 1.0) for i in range(6)]
    new = [("new0", NEW_B, 1.0), ("new1", NEW_B, 3.0 if slow else 1.0)]
    det = _scraped_fleet(lambda k: old + new if k > 10 else old, 70, requests=200, seed=11)
    routed = det.routing()["m"]
    want = {f"old{i}" for i in range(6)} | ({"new0"} if slow else {"new0", "new1"})
    assert routed == want


def test_shared_bounds_rebucket_exactly() -> None:
    a = win([1, 2, 3, 4, 5], bounds=(0.3, 0.5, 0.8, 1.0))
    b = win([6, 7, 8], bounds=(0.5, 1.0))
    bounds, (a2, b2) = on_shared_bounds([a, b])
    assert bounds == (0.5, 1.0) and a2.counts == (3, 7, 5) and b2.counts == (6, 7, 8)
    assert a2.requests == a.requests and a2.observations == a.observations
    assert on_shared_bounds([a, win([1, 1], bounds=(2.0,))]) == ((), [])
    assert on_shared_bounds([a, HistWindow((), (5,), 5, 1.0, 30.0)]) == ((), [])


def test_a_fleet_half_upgraded_is_judged_against_peers_on_the_bounds_all_share() -> None:
    """Pods of three versions, min_peers 3: no grid has 3 windows, but all share the old
    bounds; a slow pod is caught against its peers (there is no own history to fall back on)."""
    rng = np.random.default_rng(2)
    mid_b = tuple(sorted((*OLD_B, 3.0)))
    for slow_bounds in (mid_b, NEW_B):
        peers = {f"o{i}": summary(f"o{i}", {"e2e": _lognormal_win(rng, 1.2, 400, OLD_B)}) for i in range(2)}
        other = NEW_B if slow_bounds == mid_b else mid_b
        peers["n0"] = summary("n0", {"e2e": _lognormal_win(rng, 1.2, 400, other)})
        slow = summary("s", {"e2e": _lognormal_win(rng, 3.6, 400, slow_bounds)})
        hj = HistJudge({**peers, "s": slow}, ST)
        assert hj.judge(slow).verdict is Verdict.ABNORMAL
        assert all(hj.judge(p).verdict is Verdict.NORMAL for p in peers.values())


def test_a_slightly_slow_pod_with_other_buckets_is_weighted_down_not_removed() -> None:
    """Weights of a scraped fleet: a pod of the new version (other buckets) 1.4x slower gets a
    weight below 1 and stays routed (it kept full weight before: no estimate for other bounds);
    its healthy twin keeps full weight."""
    pods = [(f"old{i}", OLD_B, 1.0) for i in range(6)] + [("new0", NEW_B, 1.0), ("new1", NEW_B, 1.4)]
    det = _scraped_fleet(lambda k: pods, 80, requests=300, seed=4)
    weight = {s.node_id: s.weight for s in det.statuses()}
    assert det.routing()["m"] == {p for p in weight}, det.routing()
    assert weight["new1"] is not None and weight["new1"] < 0.9, weight
    assert weight["new0"] == 1.0 and all(weight[f"old{i}"] == 1.0 for i in range(6)), weight
