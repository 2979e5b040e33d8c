"""A fresh P50 of fewer than ``min_samples`` samples (a quieter node, or one whose events arrive
late): judged, with its limit raised by its standard error, and never part of the reference."""

from __future__ import annotations

import math

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.health import PairState, Verdict
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.peers import Peer, PeerNorms, fresh_norms, gather_peers, norms_of
from tailguard.core.judge.rules import FRESH_FEW_Z, fresh_margin, judge
from tailguard.core.window.summarize import fresh_min_samples

S = DetectorSettings()


def _s(node: str, fresh_p50: float | None, fresh_samples: int, *, p50: float = 100.0,
       ratio: float = 2.0) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=0.0, signal="latency", samples=1000,
                         p50=p50, p99=p50 * ratio, latency_p50_us=p50, latency_p99_us=p50 * ratio,
                         first_seen_ts=0.0, fresh_p50=fresh_p50, fresh_samples=fresh_samples)


def _norms(sums: list[WindowSummary]) -> PeerNorms:
    ms = ModelState()
    for s in sums:
        ms.pairs[s.node_id] = PairState(s.node_id, "m", HealthState.HEALTHY, 0.0, 0.0, "normal", True)
    ps = gather_peers({s.node_id: s for s in sums}, ms.pairs, S.min_samples, ms.pairs.rare)
    return norms_of(ps, ms.baseline_p50, ms.baseline_ticks, S)


def test_the_stage_1_minimum_is_a_quarter_of_min_samples() -> None:
    assert fresh_min_samples(S) == 25
    assert fresh_min_samples(S.replace(min_samples=400)) == 100
    assert fresh_min_samples(S.replace(min_samples=2)) == 1


def test_the_margin_is_one_from_min_samples_and_grows_with_the_tail_and_fewer_samples() -> None:
    assert fresh_margin(_s("a", 300.0, 100), S) == 1.0
    sigma = math.log(2.0) / 2.3263478740408408
    assert fresh_margin(_s("a", 300.0, 40), S) == pytest.approx(
        math.exp(FRESH_FEW_Z * math.sqrt(math.pi / 2) * sigma / math.sqrt(40)))
    assert 1.0 < fresh_margin(_s("a", 300.0, 40), S) < 1.2            # sigma 0.3: small
    assert fresh_margin(_s("a", 300.0, 27, ratio=33.0), S) > 2.0       # sigma 1.5: large
    assert fresh_margin(_s("a", 300.0, 27), S) > fresh_margin(_s("a", 300.0, 60), S)


def test_few_fresh_samples_are_judged_against_the_full_peers_and_are_no_reference() -> None:
    peers = [_s(f"n{i}", 100.0, 150) for i in range(6)]
    # a node 3x its peers in 40 fresh samples (a narrow distribution): abnormal
    late = _s("late", 300.0, 40)
    pn = _norms([*peers, late])
    assert pn.fresh is not None and pn.fresh.fleet_p50 == 100.0
    j = judge(late, 100.0, 2.0, 1000, pn.window, S, fresh=pn.fresh)
    assert j.verdict is Verdict.ABNORMAL and "x 1.1" in (j.detail or "")
    # the same 2.3x on a tail of P99/P50 33 (sigma 1.5) in 27 samples: within its noise
    noisy = _s("noisy", 230.0, 27, ratio=33.0)
    assert judge(noisy, 100.0, 33.0, 1000, pn.window, S, fresh=pn.fresh, tail=False
                 ).verdict is Verdict.NORMAL
    # ... and abnormal on min_samples of them
    assert judge(noisy._replace(fresh_samples=100), 100.0, 33.0, 1000, pn.window, S,
                 fresh=pn.fresh, tail=False).verdict is Verdict.ABNORMAL


@pytest.mark.parametrize("hardware", [None, "multi"])
def test_fresh_p50s_of_fewer_samples_make_no_reference(hardware: str | None) -> None:
    """Five peers whose fresh P50s rest on 30 samples and two on 150: below min_peers full ones,
    no fresh reference, on the one-class path (norms_of) and the per-class one (fresh_norms)."""
    sums = [_s(f"n{i}", 100.0, 30) for i in range(5)] + [_s(f"m{i}", 100.0, 150) for i in range(2)]
    if hardware:
        sums = [s._replace(hardware="A100" if i % 2 else "H100") for i, s in enumerate(sums)]
    pn = _norms(sums)
    assert pn.fresh is None
    peers = [Peer(s.node_id, s, s.p50 or 0.0, 2.0) for s in sums]
    assert fresh_norms(peers, {}, {}, S) is None
    full = [s._replace(fresh_samples=150) for s in sums]
    pn = _norms(full)
    assert pn.fresh is not None
