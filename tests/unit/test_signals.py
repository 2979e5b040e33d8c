"""Signals on LLM traffic: tpot and fleet-normalized latency vs raw latency.

Request sizes are the Azure LLM inference trace 2023 (app/data); latency is
``ttft + tpot × output_tokens`` with small noise, as in ../data/README.md.
"""

from __future__ import annotations

import numpy as np
import pytest

from tailguard.core.window import signals as sig
from tailguard.data import load_request_sizes

TPOT_US = 30_000.0


def ratio(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, 0.99) / np.quantile(x, 0.5))


def node(rng: np.random.Generator, trace: str, n: int, tpot_us: float = TPOT_US,
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    sizes = load_request_sizes(trace)
    pick = sizes[rng.integers(0, len(sizes), n)]
    inp, out = pick[:, 0], pick[:, 1]
    ttft = (40_000 + 15.0 * inp) * rng.lognormal(0, 0.05, n)
    lat = ttft + tpot_us * np.maximum(out - 1, 0) * rng.lognormal(0, 0.05, n)
    return lat, inp, out, ttft


@pytest.mark.parametrize(("configured", "judged", "tpot", "out", "expect"), [
    ("auto", 100, 51, 100, "tpot"),
    ("auto", 100, 50, 100, "normalized"),
    ("auto", 100, 0, 51, "normalized"),
    ("auto", 100, 0, 50, "latency"),
    ("auto", 0, 0, 0, "latency"),
    ("latency", 100, 100, 100, "latency"),
    ("tpot", 100, 0, 0, "tpot"),
    ("normalized", 10, 0, 0, "normalized"),
])
def test_choose_signal(configured: str, judged: int, tpot: int, out: int, expect: str) -> None:
    assert sig.choose_signal(configured, judged, tpot, out) == expect


def test_tpot_us() -> None:
    got = sig.tpot_us(np.array([1000.0, 1000.0, 1000.0, 500.0]), np.array([100.0, 100, np.nan, 0]),
                      np.array([10.0, 1.0, 10.0, 0.0]))
    assert got[0] == pytest.approx(100.0)
    assert np.isnan(got[1:]).all()


@pytest.mark.parametrize(("trace", "raw_at_least"), [("conv", 3.0), ("code", 5.0)])
def test_healthy_node_has_small_tpot_and_normalized_ratio(trace: str,
                                                          raw_at_least: float) -> None:
    rng = np.random.default_rng(1)
    nodes = [node(rng, trace, 1000) for _ in range(6)]
    fit = sig.fit_fleet_1d([(lat, out, inp) for lat, inp, out, _ in nodes])
    for lat, inp, out, ttft in nodes:
        assert ratio(lat) > raw_at_least
        assert ratio(sig.tpot_us(lat, ttft, out)) < 2.0
        assert ratio(sig.normalized(lat, out, inp, fit)) < 2.0


@pytest.mark.parametrize("trace", ["conv", "code"])
@pytest.mark.parametrize("use_input", [True, False])
def test_slow_node_stands_out_and_does_not_drag_the_fit(trace: str, use_input: bool) -> None:
    rng = np.random.default_rng(2)
    nodes = [node(rng, trace, 1000, TPOT_US * (2.5 if i == 5 else 1.0)) for i in range(8)]
    fit = sig.fit_fleet_1d([(lat, out, inp if use_input else None)
                            for lat, inp, out, _ in nodes])
    assert fit.nodes == 8
    assert fit.b_us_per_token == pytest.approx(TPOT_US, rel=0.1)
    p50 = [float(np.nanmedian(sig.normalized(lat, out, inp if use_input else None, fit)))
           for lat, inp, out, _ in nodes]
    slow = p50.pop(5)
    assert all(0.85 < p < 1.15 for p in p50), p50
    assert slow > 2.0 * float(np.median(p50))
    tp50 = [float(np.nanmedian(sig.tpot_us(lat, ttft, out))) for lat, _, out, ttft in nodes]
    assert tp50[5] > 2.0 * float(np.median(tp50[:5] + tp50[6:]))


def test_row_fits_recovers_exact_coefficients() -> None:
    rng = np.random.default_rng(3)
    out = rng.integers(1, 500, (3, 200)).astype(np.float64)
    inp = rng.integers(1, 4000, (3, 200)).astype(np.float64)
    lat = 5_000 + 30_000 * out + 12.0 * inp
    mask = np.ones_like(out, dtype=bool)
    mask[2, 5:] = False  # too few samples to vote
    f = sig.row_fits(lat, out, inp, mask)
    np.testing.assert_allclose(f.a[:2], 5_000, rtol=1e-6)
    np.testing.assert_allclose(f.b[:2], 30_000, rtol=1e-9)
    np.testing.assert_allclose(f.c[:2], 12.0, rtol=1e-6)
    assert f.valid.tolist() == [True, True, False]
    g = sig.row_fits(lat, out, None, mask)
    assert g.c.tolist() == [0.0, 0.0, 0.0]


def test_row_fits_degenerate_rows_are_invalid() -> None:
    out = np.full((1, 50), 7.0)
    f = sig.row_fits(np.full((1, 50), 100.0), out, None, np.ones((1, 50), dtype=bool))
    assert not f.valid[0] and f.mean_us[0] == 100.0


def test_fleet_fit_without_fits_normalizes_by_typical_latency() -> None:
    fit = sig.fleet_fit([], [], [], [100.0, 200.0, 300.0])
    assert fit.nodes == 0 and fit.a_us == 200.0
    assert sig.normalized(np.array([400.0]), np.array([3.0]), None, fit).tolist() == [2.0]


def test_expected_latency_is_clamped_to_positive_floor() -> None:
    fit = sig.fleet_fit([-50_000.0], [10.0], [0.0], [100_000.0])
    assert fit.floor_us == pytest.approx(5_000.0)
    assert fit.expected_us(np.array([1.0, 10_000.0])).tolist() == [5_000.0, 50_000.0]
    assert np.isnan(sig.normalized(np.array([1.0]), np.array([np.nan]), None, fit)[0])


def test_request_sizes_loader() -> None:
    conv = load_request_sizes("conv")
    assert conv.shape == (19366, 2) and conv[0].tolist() == [374.0, 44.0]
    assert load_request_sizes("code").shape == (8819, 2)
    with pytest.raises(ValueError, match="conv"):
        load_request_sizes("chat")


def test_one_output_length_throughout_is_fitted_on_the_input_alone() -> None:
    # A classification model: output_tokens = 1 on every request, latency grows with the
    # prompt. Fitted on output alone there is no spread (no fit: latency / typical latency,
    # so a node with 3x longer prompts looked 3x slow); on the input, every node is ~1.
    rng = np.random.default_rng(5)
    nodes = []
    for scale in (1.0, 1.0, 1.0, 1.0, 3.0):
        inp = rng.integers(100, 1000, 400).astype(np.float64) * scale
        lat = (20_000.0 + 50.0 * inp) * rng.lognormal(0, 0.05, inp.size)
        nodes.append((lat, np.ones_like(inp), inp))
    fit = sig.fit_fleet_1d(nodes)
    assert fit.nodes == 5 and fit.b_us_per_token == 0.0
    assert fit.c_us_per_input_token == pytest.approx(50.0, rel=0.05)
    long_prompts = sig.normalized(nodes[4][0], nodes[4][1], nodes[4][2], fit)
    assert float(np.median(long_prompts)) == pytest.approx(1.0, abs=0.05)
    # without input tokens there is still nothing to fit on
    assert sig.fit_fleet_1d([(lat, out, None) for lat, out, _ in nodes]).nodes == 0
