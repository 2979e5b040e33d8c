"""Latency models: generated samples match the requested parameters; seeded determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.sim.latency import (
    LLM,
    Z99,
    Errors,
    Lognormal,
    NodeLatency,
    RequestSizes,
    Slowdown,
    Spikes,
    TailDegradation,
    Warmup,
    node_rng,
    sigma_for_ratio,
)

N = 200_000


def q(a: np.ndarray, p: float) -> float:
    return float(np.percentile(a, p))


def sizes() -> RequestSizes:
    rng = np.random.default_rng(0)
    inp = rng.integers(10, 4000, 5000)
    out = rng.integers(2, 600, 5000)
    return RequestSizes("synthetic", np.stack([inp, out], axis=1).astype(np.int64))


@pytest.mark.parametrize(("p50_us", "sigma"), [(180_000.0, 0.3), (5_000.0, 0.1), (2e6, 0.6)])
def test_lognormal_p50_and_p99_match_the_parameters(p50_us: float, sigma: float) -> None:
    d = NodeLatency(Lognormal(p50_us, sigma)).sample(node_rng(1), np.zeros(N))
    assert q(d.latency_us, 50) == pytest.approx(p50_us, rel=0.01)
    assert q(d.latency_us, 99) / q(d.latency_us, 50) == pytest.approx(math.exp(Z99 * sigma), rel=0.03)
    assert d.ok.all() and d.input_tokens is None and d.ttft_us is None


def test_sigma_for_ratio_gives_that_ratio() -> None:
    s = sigma_for_ratio(2.0)
    d = Lognormal(100.0, s).draw(node_rng(2), N)
    assert q(d.latency_us, 99) / q(d.latency_us, 50) == pytest.approx(2.0, rel=0.03)
    with pytest.raises(ValueError, match="p99_over_p50"):
        sigma_for_ratio(1.0)


def test_same_seed_same_samples_other_seed_other_samples() -> None:
    model = NodeLatency(Lognormal(1000.0, 0.3), (TailDegradation(0.05, 5.0),))
    t = np.arange(1000.0)
    a = model.sample(node_rng(7, 1, 2), t)
    b = model.sample(node_rng(7, 1, 2), t)
    c = model.sample(node_rng(8, 1, 2), t)
    d = model.sample(node_rng(7, 1, 3), t)
    assert np.array_equal(a.latency_us, b.latency_us)
    assert not np.array_equal(a.latency_us, c.latency_us)
    assert not np.array_equal(a.latency_us, d.latency_us)


def test_effects_do_not_change_the_healthy_draws_before_onset() -> None:
    t = np.arange(2000.0) / 10          # 0 … 200 s
    healthy = NodeLatency(Lognormal(1000.0, 0.3)).sample(node_rng(3), t)
    faulty = NodeLatency(Lognormal(1000.0, 0.3), (Slowdown(3.0, onset_s=100.0),)).sample(node_rng(3), t)
    before = t < 100
    assert np.array_equal(healthy.latency_us[before], faulty.latency_us[before])
    assert np.allclose(faulty.latency_us[~before], 3.0 * healthy.latency_us[~before])


def test_tail_degradation_raises_p99_not_p50() -> None:
    t = np.zeros(N)
    base = NodeLatency(Lognormal(1000.0, 0.3)).sample(node_rng(4), t)
    tail = NodeLatency(Lognormal(1000.0, 0.3), (TailDegradation(0.05, 8.0),)).sample(node_rng(4), t)
    assert q(tail.latency_us, 50) == pytest.approx(q(base.latency_us, 50), rel=0.06)
    assert q(tail.latency_us, 99) > 3.0 * q(base.latency_us, 99)
    assert np.mean(tail.latency_us != base.latency_us) == pytest.approx(0.05, abs=0.003)


def test_slowdown_with_recovery_applies_only_on_its_interval() -> None:
    t = np.repeat([50.0, 150.0, 250.0], N // 3)
    d = NodeLatency(Lognormal(1000.0, 0.2), (Slowdown(3.0, 100.0, 200.0),)).sample(node_rng(5), t)
    p50 = [q(d.latency_us[t == x], 50) for x in (50.0, 150.0, 250.0)]
    assert p50[0] == pytest.approx(1000.0, rel=0.02)
    assert p50[1] == pytest.approx(3000.0, rel=0.02)
    assert p50[2] == pytest.approx(1000.0, rel=0.02)


def test_spikes_hit_only_the_spike_windows() -> None:
    eff = Spikes(period_s=60.0, spike_s=5.0, factor=10.0, onset_s=100.0)
    t = np.array([99.0, 100.0, 104.9, 105.0, 159.9, 160.0, 164.0, 170.0])
    m = eff.multiplier(node_rng(0), t)
    assert m.tolist() == [1.0, 10.0, 10.0, 1.0, 1.0, 10.0, 10.0, 1.0]


def test_warmup_decays_linearly_from_its_factor_to_one() -> None:
    eff = Warmup(start_s=100.0, duration_s=60.0, factor=8.0)
    m = eff.multiplier(node_rng(0), np.array([99.0, 100.0, 130.0, 160.0, 500.0]))
    assert m.tolist() == [1.0, 8.0, 4.5, 1.0, 1.0]


def test_errors_fail_their_share_of_requests_in_their_window() -> None:
    t = np.repeat([10.0, 20.0], N // 2)
    d = NodeLatency(Lognormal(1000.0, 0.3), (Errors(0.2, onset_s=15.0),)).sample(node_rng(6), t)
    assert d.ok[t == 10.0].all()
    assert np.mean(~d.ok[t == 20.0]) == pytest.approx(0.2, abs=0.01)


def test_llm_latency_is_ttft_plus_tpot_per_decode_step() -> None:
    base = LLM(sizes(), ttft_base_us=50_000.0, ttft_per_input_token_us=250.0, tpot_us=30_000.0, jitter_sigma=0.0)
    d = NodeLatency(base).sample(node_rng(8), np.zeros(10_000))
    assert d.input_tokens is not None and d.output_tokens is not None and d.ttft_us is not None
    assert np.allclose(d.ttft_us, 50_000.0 + 250.0 * d.input_tokens)
    assert np.allclose(d.latency_us, d.ttft_us + 30_000.0 * (d.output_tokens - 1))


def test_llm_jitter_keeps_tpot_median_and_given_sizes_are_used() -> None:
    base = LLM(sizes(), tpot_us=30_000.0, jitter_sigma=0.05)
    d = NodeLatency(base).sample(node_rng(9), np.zeros(50_000))
    assert d.output_tokens is not None and d.ttft_us is not None
    tpot = (d.latency_us - d.ttft_us) / (d.output_tokens - 1)
    assert q(tpot, 50) == pytest.approx(30_000.0, rel=0.01)
    given_sizes = (np.array([100, 200]), np.array([11, 21]))
    g = NodeLatency(base).sample(node_rng(9), [0.0, 0.0], given_sizes)
    assert g.input_tokens is not None and g.output_tokens is not None
    assert g.input_tokens.tolist() == [100, 200] and g.output_tokens.tolist() == [11, 21]


def test_tpot_fault_multiplies_decode_time_only() -> None:
    base = LLM(sizes(), jitter_sigma=0.0)
    t = np.repeat([100.0, 400.0], 20_000)
    d = NodeLatency(base, (Slowdown(2.5, onset_s=300.0, channel="tpot"),)).sample(node_rng(10), t)
    assert d.output_tokens is not None and d.ttft_us is not None and d.input_tokens is not None
    tpot = (d.latency_us - d.ttft_us) / (d.output_tokens - 1)
    assert np.allclose(tpot[t == 100.0], 30_000.0)
    assert np.allclose(tpot[t == 400.0], 75_000.0)
    assert np.allclose(d.ttft_us, 50_000.0 + 250.0 * d.input_tokens)


def test_ttft_fault_multiplies_prefill_only() -> None:
    base = LLM(sizes(), jitter_sigma=0.0)
    d = NodeLatency(base, (Slowdown(4.0, channel="ttft"),)).sample(node_rng(11), np.zeros(1000))
    assert d.ttft_us is not None and d.input_tokens is not None and d.output_tokens is not None
    assert np.allclose(d.ttft_us, 4.0 * (50_000.0 + 250.0 * d.input_tokens))
    assert np.allclose(d.latency_us - d.ttft_us, 30_000.0 * (d.output_tokens - 1))


@pytest.mark.parametrize(("make", "match"), [
    (lambda: Lognormal(0.0), "p50_us"),
    (lambda: Lognormal(1.0, -1.0), "sigma"),
    (lambda: TailDegradation(0.5, 2.0), "share"),
    (lambda: Spikes(10.0, 10.0, 2.0), "spike_s"),
    (lambda: Slowdown(0.0), "factor"),
    (lambda: Slowdown(2.0, 10.0, 5.0), "end_s"),
    (lambda: Warmup(0.0, 0.0, 2.0), "duration_s"),
    (lambda: Errors(0.0), "share"),
    (lambda: NodeLatency(Lognormal(1.0), (Slowdown(2.0, channel="tpot"),)), "LLM base"),
    (lambda: RequestSizes("x", np.zeros((3, 2), dtype=np.int64)), "output tokens"),
    (lambda: LLM(sizes(), tpot_us=0.0), "tpot_us"),
])
def test_bad_parameters_fail_at_construction_naming_the_culprit(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


@settings(max_examples=60, deadline=None)
@given(factor=st.floats(0.1, 50.0), onset=st.floats(0.0, 500.0), length=st.floats(1.0, 500.0),
       t=st.lists(st.floats(0.0, 1500.0), min_size=1, max_size=50))
def test_slowdown_multiplier_is_factor_exactly_inside_its_interval(
        factor: float, onset: float, length: float, t: list[float]) -> None:
    eff = Slowdown(factor, onset, onset + length)
    ts = np.array(t)
    m = eff.multiplier(node_rng(0), ts)
    inside = (ts >= onset) & (ts < onset + length)
    assert np.all(m[inside] == factor) and np.all(m[~inside] == 1.0)
