"""The synthetic many-series feed (tailguard.sim.series_feed): names, event times, latency, messages."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard.core.contract import binary
from tailguard.sim.series_feed import feed_messages, fleet_pairs, series_batches


def test_fleet_pairs_are_every_node_of_every_model_model_major() -> None:
    pairs = fleet_pairs(2, 3)
    assert pairs == [("n0000", "model-000"), ("n0001", "model-000"), ("n0002", "model-000"),
                     ("n0000", "model-001"), ("n0001", "model-001"), ("n0002", "model-001")]


def test_batches_without_spread_are_all_at_now_and_lognormal_around_the_median() -> None:
    (b,) = series_batches([("n0", "m")], 20_000, 1000.0, np.random.default_rng(1), median_us=2_000.0, sigma=0.3)
    assert (b.node_id, b.model, b.hardware) == ("n0", "m", "A100")
    assert np.all(b.ts == 1000.0) and b.ok.all() and not b.probe.any()
    assert np.median(b.latency_us) == pytest.approx(2_000.0, rel=0.02)
    assert np.std(np.log(b.latency_us)) == pytest.approx(0.3, rel=0.03)
    assert np.array_equal(b.latency_us, b.latency_us.round(1))


def test_spread_gives_sorted_times_within_the_spread_and_the_same_rng_the_same_batches() -> None:
    pairs = fleet_pairs(1, 4)
    a = series_batches(pairs, 50, 500.0, np.random.default_rng(7), median_us=1e5, sigma=0.3, spread_s=25.0)
    b = series_batches(pairs, 50, 500.0, np.random.default_rng(7), median_us=1e5, sigma=0.3, spread_s=25.0)
    for x, y in zip(a, b, strict=True):
        assert np.all(np.diff(x.ts) >= 0) and x.ts.min() > 475.0 and x.ts.max() <= 500.0
        assert np.array_equal(x.ts, y.ts) and np.array_equal(x.latency_us, y.latency_us)
    assert not np.array_equal(a[0].latency_us, a[1].latency_us)


def test_messages_are_keyed_by_series_and_read_back_as_the_batches() -> None:
    batches = series_batches(fleet_pairs(2, 2), 5, 10.0, np.random.default_rng(3), median_us=1e3, sigma=0.2)
    msgs = feed_messages(batches)
    assert [k for k, _ in msgs] == [f"{b.node_id}|{b.model}".encode() for b in batches]
    for (_, value), b in zip(msgs, batches, strict=True):
        got = binary.parse(value)
        assert (got.node_id, got.model, got.hardware, got.ok, got.probe) == (b.node_id, b.model, "A100", True, False)
        assert np.array_equal(got.ts, b.ts) and np.array_equal(got.latency_us, b.latency_us)


def test_no_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="samples must be >= 1"):
        series_batches([("n0", "m")], 0, 0.0, np.random.default_rng(1), median_us=1e3, sigma=0.2)
