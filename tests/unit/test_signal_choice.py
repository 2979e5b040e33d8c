"""One signal per model across stage-1 workers: stage 2's choice (core/judge/signal_choice) from
every worker's summaries, and each store applying it (core/window summarize ``choices``)."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.signal_choice import choose_for_model
from tailguard.core.window import signals as sig
from tailguard.core.window.window import WindowStore

SETTINGS = DetectorSettings(min_samples=50, window_size=200, warmup_s=0.0)
NOW = 1000.0
MODEL = "llm"


def batch(node: str, rng: np.random.Generator, *, tokens: bool, ttft: bool = True,
          slow: float = 1.0, n: int = 200) -> SampleBatch:
    """``n`` requests in the last 60 s: latency = ttft + 30 ms × output tokens (× ``slow``)."""
    out = rng.integers(20, 400, n).astype(np.float64)
    inp = rng.integers(100, 2000, n).astype(np.float64)
    first = (40_000 + 15.0 * inp) * rng.lognormal(0, 0.05, n)
    lat = (first + 30_000.0 * (out - 1) * rng.lognormal(0, 0.05, n)) * slow
    ts = np.linspace(NOW - 60, NOW - 1, n)
    ones = np.ones(n, dtype=bool)
    return SampleBatch(node, MODEL, "A100", ts, lat, ones, ~ones,
                       inp if tokens else None, out if tokens else None,
                       first * slow if tokens and ttft else None)


def store(nodes: dict[str, dict[str, object]], seed: int = 1) -> WindowStore:
    rng = np.random.default_rng(seed)
    w = WindowStore(SETTINGS)
    for node, kw in nodes.items():
        w.observe(batch(node, rng, **kw))  # type: ignore[arg-type]
    return w


def by_node(summaries: list[WindowSummary]) -> dict[str, WindowSummary]:
    return {s.node_id: s for s in summaries}


def test_shares_with_and_without_tokens_get_one_signal_from_stage_2() -> None:
    """Worker A's share carries token counts, worker B's does not: alone, A picks tpot and
    B latency; stage 2's choice from both (latency: B's nodes have no TPOT) is what both apply."""
    a = store({f"a{i}": {"tokens": True} for i in range(4)})
    b = store({f"b{i}": {"tokens": False} for i in range(2)}, seed=2)
    sa, sb = a.summaries(NOW, evidence=True), b.summaries(NOW, evidence=True)
    assert {s.signal for s in sa} == {"tpot"} and {s.signal for s in sb} == {"latency"}
    assert all(s.extra[sig.LOCAL_KEY] for s in sa + sb)     # no stage-2 choice yet: said so
    choice = choose_for_model("auto", sa + sb, SETTINGS.min_samples)
    assert choice is not None and choice.signal == "latency"
    ca = a.summaries(NOW, choices={MODEL: choice}, evidence=True)
    cb = b.summaries(NOW, choices={MODEL: choice}, evidence=True)
    assert {s.signal for s in ca + cb} == {"latency"}
    assert not any(sig.LOCAL_KEY in s.extra for s in ca + cb)
    # Raw latency is what one store holding every node (tailguard replay) judges them on.
    both = WindowStore(SETTINGS)
    rng = np.random.default_rng(3)
    for i in range(4):
        both.observe(batch(f"a{i}", rng, tokens=True))
    for i in range(2):
        both.observe(batch(f"b{i}", rng, tokens=False))
    assert {s.signal for s in both.summaries(NOW)} == {"latency"}


def test_normalized_choice_and_fit_are_a_single_store_s() -> None:
    """Output tokens without TTFT, split 3 + 3 (one slow node): stage 2's choice from the two
    shares' summaries is ``normalized`` with the fit of one store holding all six, and each
    share applying it summarises every node as that store does."""
    spec: dict[str, dict[str, object]] = {f"n{i}": {"tokens": True, "ttft": False} for i in range(6)}
    spec["n5"] = {"tokens": True, "ttft": False, "slow": 2.5}
    rng = np.random.default_rng(5)
    batches = [batch(n, rng, **kw) for n, kw in spec.items()]  # type: ignore[arg-type]
    whole, left, right = WindowStore(SETTINGS), WindowStore(SETTINGS), WindowStore(SETTINGS)
    for i, bt in enumerate(batches):
        whole.observe(bt)
        (left if i < 3 else right).observe(bt)
    one = by_node(whole.summaries(NOW))
    assert {s.signal for s in one.values()} == {"normalized"}
    sl, sr = left.summaries(NOW, evidence=True), right.summaries(NOW, evidence=True)
    # Alone, each share fits its own expectation: the slow node's share is a different unit.
    assert sl[0].extra["fleet_fit"] != sr[0].extra["fleet_fit"]
    choice = choose_for_model("auto", sl + sr, SETTINGS.min_samples)
    assert choice is not None and choice.signal == "normalized" and choice.fit is not None
    assert choice.fit.to_dict() == pytest.approx(one["n0"].extra["fleet_fit"])
    assert choice.use_input is True
    applied = by_node(left.summaries(NOW, choices={MODEL: choice})
                      + right.summaries(NOW, choices={MODEL: choice}))
    for node, s in one.items():
        assert applied[node].signal == "normalized"
        assert applied[node].p50 == pytest.approx(s.p50) and applied[node].p99 == pytest.approx(s.p99)
    assert applied["n5"].p50 > 2.0 * applied["n0"].p50


def test_a_normalized_choice_without_votes_lets_each_store_fit_and_vote() -> None:
    w = store({f"n{i}": {"tokens": True, "ttft": False} for i in range(3)})
    plain = by_node(w.summaries(NOW))
    got = by_node(w.summaries(NOW, choices={MODEL: sig.ModelChoice("normalized", True, None)},
                              evidence=True))
    assert all(got[n].p50 == pytest.approx(plain[n].p50) for n in plain)
    assert all(len(s.extra[sig.VOTE_KEY]) == 4 for s in got.values())
    assert all(s.extra[sig.COUNTS_KEY] == [0, 200, 200] for s in got.values())


def test_histogram_and_empty_summaries_are_no_evidence() -> None:
    assert choose_for_model("auto", [], 50) is None
    s = store({"n0": {"tokens": False}}).summaries(NOW, evidence=True)[0]
    assert choose_for_model("auto", [s._replace(signal="e2e_hist")], 50) is None
    configured = choose_for_model("tpot", [s], 50)
    assert configured is not None and configured.signal == "tpot"
    assert choose_for_model("latency", [], 50) == sig.ModelChoice("latency")


def test_model_choice_round_trips_and_refuses_bad_values() -> None:
    fit = sig.FleetFit(1000.0, 30.0, 0.5, 50.0, 4)
    c = sig.ModelChoice("normalized", True, fit)
    assert sig.ModelChoice.from_dict(c.to_dict()) == c
    assert sig.ModelChoice.from_dict({"signal": "tpot"}) == sig.ModelChoice("tpot")
    for bad in ({"signal": "auto"}, {"signal": "normalized", "fit": 3},
                {"signal": "normalized", "fit": {"a_us": 1.0}},
                {"signal": "normalized", "fit": {**fit.to_dict(), "floor_us": float("nan")}}):
        with pytest.raises(ValueError, match=r"signal|fit"):
            sig.ModelChoice.from_dict(bad)
