"""The histogram path's slow-down estimate for weights (app/core/judge/hist_weights.py), against
exact lognormal and Weibull CDFs at vLLM's e2e bounds."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from test_hist_rules import NEW_B, OLD_B, ST, _lognormal_win, summary

from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.hist_weights import cdf_at, log_shift, targets
from tailguard.core.judge.peers import PeerSet
from tailguard.core.window.hist_window import HistWindow
from tailguard.sim.exposition import VLLM_E2E, VLLM_ITL, tgi_buckets

N = NormalDist()


def lognormal_cdf(median_s: float, sigma: float) -> tuple[float, ...]:
    return tuple(N.cdf(math.log(b / median_s) / sigma) for b in VLLM_E2E)


def window_of(cdf: tuple[float, ...], n: int = 100_000) -> HistWindow:
    cum = [round(f * n) for f in cdf] + [n]
    counts = tuple(b - a for a, b in zip([0, *cum[:-1]], cum, strict=True))
    return HistWindow(VLLM_E2E, counts, n, None, 30.0)


@pytest.mark.parametrize("median_s", [0.45, 0.9, 2.2, 12.0])
@pytest.mark.parametrize("factor", [1.0, 1.05, 1.3, 1.6])
def test_a_lognormal_slow_down_is_estimated_whatever_the_bucket_widths(median_s: float, factor: float) -> None:
    ref = lognormal_cdf(median_s, 0.5)
    got = log_shift(VLLM_E2E, ref, window_of(lognormal_cdf(median_s * factor, 0.5)))
    assert got is not None
    assert math.exp(got[0]) == pytest.approx(factor, rel=0.01)
    assert 0 < got[1] < 0.02                         # 100,000 requests: a tight estimate


def test_a_weibull_slow_down_within_6_percent() -> None:
    for lam in (0.6, 1.7, 4.0):
        ref = tuple(1 - math.exp(-((b / lam) ** 1.5)) for b in VLLM_E2E)
        slow = tuple(1 - math.exp(-((b / (lam * 1.3)) ** 1.5)) for b in VLLM_E2E)
        got = log_shift(VLLM_E2E, ref, window_of(slow))
        assert got is not None and math.exp(got[0]) == pytest.approx(1.3, rel=0.06)


def test_no_estimate_inside_one_wide_bucket() -> None:
    """180 ms, sigma 0.3: 95 % below the first bound (0.3 s), no second bound inside the
    distribution: the buckets cannot say how much slower a node is."""
    ref = lognormal_cdf(0.18, 0.3)
    assert log_shift(VLLM_E2E, ref, window_of(lognormal_cdf(0.18 * 1.3, 0.3))) is None


def test_the_standard_error_grows_as_requests_fall() -> None:
    ref = lognormal_cdf(0.9, 0.5)
    many = log_shift(VLLM_E2E, ref, window_of(lognormal_cdf(0.9, 0.5), 10_000))
    few = log_shift(VLLM_E2E, ref, window_of(lognormal_cdf(0.9, 0.5), 100))
    assert many is not None and few is not None
    assert few[1] == pytest.approx(many[1] * 10, rel=0.1)


def _peer_set(wins: dict[str, HistWindow]) -> PeerSet:
    summaries = [summary(node, {"e2e": w}) for node, w in wins.items()]
    return PeerSet(list(wins), summaries, [1.0] * len(wins), [2.0] * len(wins), [], [])


@pytest.mark.parametrize("seed", range(10))
def test_new_pods_with_other_buckets_weighted_only_when_slower(seed: int) -> None:
    """A rolling upgrade: pods of the new version (other buckets) beside 6 old pods. The 1.5x
    slower one is weighted from the bounds it shares with the reference, the healthy one is
    not, and the old pods' targets are those of a fleet without the newcomers."""
    rng = np.random.default_rng(seed)
    old = {f"n{i}": _lognormal_win(rng, 1.2, 400, OLD_B) for i in range(6)}
    new = {"new0": _lognormal_win(rng, 1.2, 400, NEW_B), "new1": _lognormal_win(rng, 1.8, 400, NEW_B)}
    got = targets(_peer_set({**old, **new}), ST)
    assert "new0" not in got                              # healthy: within the band
    assert "new1" in got and 0.35 <= got["new1"].target <= 0.75, got.get("new1")
    assert math.exp(math.log(got["new1"].value / got["new1"].ref)) == pytest.approx(1.5, rel=0.15)
    assert {k: v for k, v in got.items() if k in old} == targets(_peer_set(old), ST)



def test_a_slow_pod_on_a_grid_that_shares_no_bound_is_weighted() -> None:
    """A pod on TGI's 1.5^k buckets beside vLLM pods shares no bound with them: it got no
    estimate, so a pod 1.5x slower kept full weight (a backtest of a rolling upgrade; 3x slower
    it was ejected). Now the reference is read at its own bounds; a healthy one gets none."""
    tgi = tgi_buckets()
    assert not set(tgi) & set(OLD_B)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        old = {f"n{i}": _lognormal_win(rng, 1.2, 400, OLD_B) for i in range(6)}
        new = {"new0": _lognormal_win(rng, 1.2, 400, tgi), "new1": _lognormal_win(rng, 1.8, 400, tgi)}
        got = targets(_peer_set({**old, **new}), ST)
        assert "new0" not in got
        assert "new1" in got and 0.35 <= got["new1"].target <= 0.75, got.get("new1")


def test_the_reference_is_read_at_other_bounds_exactly_for_a_lognormal() -> None:
    cdf = lognormal_cdf(1.2, 0.35)
    at = (0.4, 1.0, 3.0, 7.0, 20.0, 9000.0)
    got = cdf_at(VLLM_E2E, cdf, at)
    for b, f in zip(at[:5], got[:5], strict=True):
        assert f == pytest.approx(N.cdf(math.log(b / 1.2) / 0.35), abs=1e-9)
    assert math.isnan(got[5])                             # past the last bound: nothing to read
    assert math.isnan(cdf_at((0.3, 0.5), (0.0, 0.5), (0.4,))[0])   # next to a CDF of 0: no probit


def _itl_e2e_peer_set(rng: np.random.Generator, slow: dict[str, float]) -> PeerSet:
    """8 vLLM pods with ITL (narrow, 22 ms: inside one of vLLM's ITL buckets) and e2e windows
    (LLM-wide, median 2.4 s); ``slow``: node -> factor on both."""

    def lognormal(median_s: float, sigma: float, n: int, bounds: tuple[float, ...]) -> HistWindow:
        lat = median_s * np.exp(rng.normal(0, sigma, n))
        counts = np.bincount(np.searchsorted(bounds, lat), minlength=len(bounds) + 1).tolist()
        return HistWindow(bounds, tuple(counts), n, None, 30.0)

    nodes = [f"vllm-{i}" for i in range(8)]
    sums = [WindowSummary(n, "m", 0.0, "itl_hist", 1000, 1.0, 2.0, None, None, hardware="H100",
                          extra={"hist": {"itl": lognormal(0.022 * slow.get(n, 1.0), 0.12, 1000, VLLM_ITL).to_dict(),
                                          "e2e": lognormal(2.4 * slow.get(n, 1.0), 0.8, 1000, VLLM_E2E).to_dict()}})
            for n in nodes]
    return PeerSet(nodes, sums, [1.0] * 8, [2.0] * 8, [], [])


@pytest.mark.parametrize("seed", range(10))
def test_a_signal_the_buckets_cannot_resolve_falls_back_to_the_next_metric(seed: int) -> None:
    """vLLM pods on the ITL signal: 22 ms with sigma 0.12 lies inside vLLM's 0.025-0.05 ITL
    bucket (one bound inside the peers' 5-95 %), so no pod got an estimate and a pod 1.5x slower
    kept full weight, though its e2e buckets show it (a backtest of captured vLLM, TGI and Dynamo
    fleets, 2026-12-05). The weight now comes from the next metric whose buckets resolve it;
    healthy pods get none."""
    rng = np.random.default_rng(seed)
    got = targets(_itl_e2e_peer_set(rng, {"vllm-3": 1.5}), ST)
    assert set(got) == {"vllm-3"}, got
    assert got["vllm-3"].signal == "e2e_hist"
    assert 0.35 <= got["vllm-3"].target <= 0.75, got["vllm-3"]
    assert targets(_itl_e2e_peer_set(rng, {}), ST) == {}
