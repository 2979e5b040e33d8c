"""Histogram models whose buckets cannot resolve them (all below the first bound): each node's
window mean judged against its peers' (hist_mean), and weighted from its recent windows' means
(hist_weights), against exact answers."""

from __future__ import annotations

import math

import pytest
from test_hist_rules import ST, summary

from tailguard.core.contract.types import Reason
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.health import Verdict
from tailguard.core.judge.hist_mean import MeanRef, Z, as_means
from tailguard.core.judge.hist_rules import HIST_SIGNAL, HistJudge
from tailguard.core.judge.hist_trend import HistTrend
from tailguard.core.judge.hist_weights import targets
from tailguard.core.judge.peers import PeerSet
from tailguard.core.judge.weights import MAD_SIGMA
from tailguard.core.window.hist_window import HistWindow

DYNAMO = (2.0, 5.0, 10.0)


def first_bucket(mean_s: float, requests: int = 200) -> HistWindow:
    """A window of ``requests`` all below Dynamo's first bound (2 s) with mean ``mean_s``."""
    return HistWindow(DYNAMO, (requests, 0, 0, 0), requests, mean_s * requests, 30.0)


# Ten peers' means around 0.1 s (log spread: MAD of the logs x 1.4826).
MEANS = [0.095, 0.098, 0.1, 0.1, 0.1, 0.101, 0.102, 0.104, 0.097, 0.1]


def fleet(slow_mean_s: float, means: list[float] = MEANS) -> dict[str, HistWindow]:
    wins = {f"n{i}": first_bucket(m) for i, m in enumerate(means)}
    wins["n0"] = first_bucket(slow_mean_s)
    return wins


def test_mean_ref_is_the_median_and_robust_spread_of_log_means() -> None:
    ref = MeanRef.of([first_bucket(m) for m in MEANS], ST.min_peers)
    assert ref is not None and ref.peers == 10 and ref.requests == 200
    logs = sorted(math.log(m) for m in MEANS)
    centre = (logs[4] + logs[5]) / 2
    dev = sorted(abs(x - centre) for x in logs)
    assert ref.mean_s == pytest.approx(math.exp(centre))
    assert ref.spread == pytest.approx(MAD_SIGMA * (dev[4] + dev[5]) / 2)
    assert MeanRef.of([first_bucket(0.1)] * (ST.min_peers - 1), ST.min_peers) is None
    assert MeanRef.of([HistWindow(DYNAMO, (200, 0, 0, 0), 200, None, 30.0)] * 5, ST.min_peers) is None


def test_the_limit_is_the_p50_factor_or_z_times_the_noise_of_a_mean_of_fewer_requests() -> None:
    ref = MeanRef(0.1, 0.3, 200.0, 10)
    assert ref.limit(first_bucket(0.1, 200), ST) == pytest.approx(math.exp(Z * 0.3))
    assert ref.limit(first_bucket(0.1, 50), ST) == pytest.approx(math.exp(Z * 0.3 * 2.0))
    assert MeanRef(0.1, 0.01, 200.0, 10).limit(first_bucket(0.1), ST) == ST.relative_p50_factor


@pytest.mark.parametrize(("factor", "verdict"), [(3.0, Verdict.ABNORMAL), (1.5, Verdict.NORMAL),
                                                 (1.0, Verdict.NORMAL)])
def test_unresolved_a_node_whose_mean_is_past_the_limit_is_abnormal(factor: float, verdict: Verdict) -> None:
    peers = {n: summary(n, {"e2e": w}) for n, w in fleet(0.1 * factor).items()}
    j = HistJudge(peers, ST, unresolved=["e2e"]).judge(peers["n0"])
    assert j.verdict is verdict, j
    if verdict is Verdict.ABNORMAL:
        assert j.reason == Reason.RELATIVE_P50 and "mean" in (j.detail or "")
        assert j.evidence is not None and j.evidence.p50 == pytest.approx(0.1 * factor * 1e6)
    # Without the mark (before 2026-12-06: named only), every request in one bucket: no fault.
    assert HistJudge(peers, ST).judge(peers["n0"]).verdict is Verdict.NORMAL


def test_a_noisy_fleet_widens_the_limit_past_the_p50_factor() -> None:
    # Peers' means 0.5x..2x apart (spread ~0.5 in logs): a node 2.5x is within 3 of their spreads.
    noisy = [0.05, 0.07, 0.1, 0.14, 0.2, 0.1, 0.06, 0.16, 0.1, 0.09]
    peers = {n: summary(n, {"e2e": w}) for n, w in fleet(0.25, noisy).items()}
    ref = MeanRef.of([first_bucket(m) for m in noisy], ST.min_peers)
    assert ref is not None and ref.limit(first_bucket(0.25), ST) > 0.25 / ref.mean_s > ST.relative_p50_factor
    judge = HistJudge(peers, ST, unresolved=["e2e"])
    assert judge.judge(peers["n0"]).verdict is Verdict.NORMAL


def test_unresolved_a_node_slower_by_its_recent_means_is_weighted() -> None:
    trend = HistTrend()
    got = {}
    for k in range(4):
        peers = {n: summary(n, {"e2e": w}) for n, w in fleet(0.13).items()}
        ps = PeerSet(list(peers), list(peers.values()), [1.0] * len(peers), [2.0] * len(peers), [], [])
        got = targets(ps, ST, trend=trend, now_s=30.0 * (k + 1), unresolved={"e2e"})
        # Without the mark the buckets give no estimate, so no weight.
        assert targets(ps, ST, trend=HistTrend(), now_s=30.0, unresolved=frozenset()) == {}
    assert set(got) == {"n0"}
    assert got["n0"].value / got["n0"].ref == pytest.approx(1.3, rel=0.03)
    assert got["n0"].target < 1.0


def test_as_means_makes_an_unresolved_metric_s_p50_and_p99_the_window_mean() -> None:
    wins = {"a": first_bucket(0.1), "b": first_bucket(0.25, 50)}
    by_node = {n: summary(n, {"e2e": w}) for n, w in wins.items()}
    got = as_means(by_node, ["e2e"], HIST_SIGNAL)
    assert got["a"].p50 == got["a"].p99 == pytest.approx(0.1e6)
    assert got["b"].p50 == got["b"].p99 == pytest.approx(0.25e6)
    assert got["a"].extra == by_node["a"].extra and got["a"].samples == by_node["a"].samples
    # Another metric unresolved, or no sum: unchanged.
    assert as_means(by_node, ["itl"], HIST_SIGNAL) == by_node
    no_sum = {"c": summary("c", {"e2e": HistWindow(DYNAMO, (200, 0, 0, 0), 200, None, 30.0)})}
    assert as_means(no_sum, ["e2e"], HIST_SIGNAL) == no_sum


def test_a_fleet_wide_swing_under_the_first_bound_moves_the_unresolved_model_s_baseline() -> None:
    """A fleet 2x slower together, every request still below Dynamo's 2-s bound: the fleet's
    P50s (window means now, flat interpolations before) report a baseline shift."""
    ev = FleetEvaluator(ST)
    kinds: list[str] = []
    for k in range(40):
        mean = 0.1 if k < 25 else 0.2
        fleet = [summary(f"n{i}", {"e2e": first_bucket(mean * (1 + 0.01 * i), 200)})._replace(tick_ts=30.0 * k)
                 for i in range(6)]
        tick = ev.evaluate("m", fleet, 30.0 * k + 200.0)
        kinds += [f"{k}:{e.kind}" for e in tick.fleet_events]
    assert tick.unresolved == (("e2e", 2.0),)
    assert [x for x in kinds if x.endswith("baseline_shift")] == ["25:baseline_shift"], kinds
