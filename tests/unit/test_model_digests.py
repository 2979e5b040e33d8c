"""Cluster-wide P50/P99 per model: WindowStore.model_pools / model_digests, digest_dict_of_sorted,
the Detector's ModelTick.fleet_latency_* and ``tailguard replay --summary``.

Tolerances (stated by the design, issue 3 item 3): against exact ``np.quantile`` over
the pooled judged samples, P50 within 3 % and P99 within 5 % relative error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.replay.detector import Detector
from tailguard.core.window.quantiles import (
    digest_dict_of_sorted,
    digest_from_dict,
    digest_of,
    digest_quantiles,
    merge_digests,
)
from tailguard.core.window.window import WindowStore
from tailguard.replay_cli import main

S = DetectorSettings()
T0 = 1_764_680_010.0           # a multiple of 30
NOW = T0 + 120.0
P50_TOL, P99_TOL = 0.03, 0.05


def _batch(node: str, lat: np.ndarray, *, model: str = "m", t_lo: float = T0,
           t_hi: float = NOW, probe: bool = False, ok: np.ndarray | None = None) -> SampleBatch:
    n = lat.size
    ts = np.linspace(t_lo, t_hi, n)
    return SampleBatch(node, model, "A100", ts, lat.astype(np.float64),
                       np.ones(n, bool) if ok is None else ok, np.full(n, probe))


def _lognormal_fleet(rng: np.random.Generator, nodes: int) -> list[tuple[str, np.ndarray]]:
    """Nodes of different speed and traffic: full 1000-sample rings and 60..400-sample ones."""
    out = []
    for i in range(nodes):
        n = 1000 if i % 3 else int(rng.integers(60, 400))
        out.append((f"n{i:03d}", 80_000.0 * np.exp(rng.normal(0.1 * (i % 5), 0.5, n))))
    return out


def _bimodal_fleet(rng: np.random.Generator, nodes: int) -> list[tuple[str, np.ndarray]]:
    """Short and long requests (70 / 30 %): P50 in the fast mode, P99 in the slow one."""
    out = []
    for i in range(nodes):
        n = 1000 if i % 4 else 250
        slow = rng.uniform(size=n) < 0.3
        lat = np.where(slow, 900_000.0 * np.exp(rng.normal(0, 0.25, n)),
                       60_000.0 * np.exp(rng.normal(0, 0.3, n)))
        out.append((f"n{i:03d}", lat))
    return out


def _store(fleet: list[tuple[str, np.ndarray]]) -> WindowStore:
    store = WindowStore(S)
    for node, lat in fleet:
        store.observe(_batch(node, lat))
    return store


def _exact(fleet: list[tuple[str, np.ndarray]]) -> np.ndarray:
    # The store keeps float32 latency: compare with the values it holds.
    pooled = np.concatenate([lat.astype(np.float32) for _, lat in fleet]).astype(np.float64)
    return np.quantile(pooled, [0.5, 0.99])


def _qs(d: dict[str, object]) -> list[float]:
    q = digest_quantiles(digest_from_dict(d), (0.5, 0.99))
    assert q is not None
    return q


def _assert_close(got: list[float], want: np.ndarray) -> None:
    assert got[0] == pytest.approx(want[0], rel=P50_TOL)
    assert got[1] == pytest.approx(want[1], rel=P99_TOL)


@pytest.mark.parametrize("make", [_lognormal_fleet, _bimodal_fleet])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_digest_matches_exact_pooled_quantiles(make: object, seed: int) -> None:
    fleet = make(np.random.default_rng(seed), 120)  # type: ignore[operator]
    d = _store(fleet).model_digests(NOW)["m"]
    _assert_close(_qs(d), _exact(fleet))
    assert d["nodes"] == 120
    assert d["n_values"] <= 128 * 120


def test_busy_nodes_weigh_as_their_traffic() -> None:
    """Few fast samples on many quiet nodes vs a slow busy majority: a per-node cap that
    ignored traffic would pull the pooled P50 towards the quiet nodes."""
    fleet = [(f"busy{i}", np.full(1000, 200_000.0) * np.exp(np.linspace(-0.1, 0.1, 1000)))
             for i in range(20)]
    fleet += [(f"quiet{i}", np.full(100, 50_000.0)) for i in range(60)]
    _assert_close(_qs(_store(fleet).model_digests(NOW)["m"]), _exact(fleet))


def test_pool_quantiles_are_exact_on_the_pool_and_agree_with_its_digest() -> None:
    fleet = _lognormal_fleet(np.random.default_rng(5), 90)
    store = _store(fleet)
    pool = store.model_pools(NOW)["m"]
    assert pool.values.dtype == np.float32 and pool.nodes == 90
    assert pool.values.size <= 128 * 90
    got = pool.quantiles((0.5, 0.99))
    assert got == pytest.approx(np.quantile(pool.values.astype(np.float64), [0.5, 0.99]), rel=1e-12)
    _assert_close(got, _exact(fleet))
    assert _qs(pool.digest_dict()) == pytest.approx(_qs(store.model_digests(NOW)["m"]))
    # the pool is an even thinning: a full 1000-sample ring gives every 8th slot
    one = WindowStore(S)
    lat = np.arange(1, 1001, dtype=np.float64) * 1000.0
    one.observe(_batch("a", lat))
    assert np.array_equal(np.sort(one.model_pools(NOW)["m"].values), lat[::8].astype(np.float32))
    # full rings holding stale, future and probe samples keep only the judged ones
    for t_lo, t_hi in ((NOW - 2 * S.max_sample_age_s, NOW), (NOW - 100, NOW + 100)):
        mixed = WindowStore(S)
        mixed.observe(_batch("a", lat, t_lo=t_lo, t_hi=t_hi))
        mixed.observe(_batch("b", lat, t_lo=NOW - 100, t_hi=NOW))
        mixed.observe(_batch("b", np.full(3, 5e6), t_lo=NOW - 2, t_hi=NOW, probe=True))
        ts = np.linspace(t_lo, t_hi, lat.size)
        judged = (ts > NOW - S.max_sample_age_s) & (ts <= NOW)
        want_a = lat[::8][judged[::8]]
        ring_b = np.concatenate([-np.full(3, 5e6), lat[3:]])  # b's slots: probes overwrote 0..2
        want_b = ring_b[::8][ring_b[::8] > 0]
        got = np.sort(mixed.model_pools(NOW)["m"].values)
        assert np.array_equal(got, np.sort(np.concatenate([want_a, want_b])).astype(np.float32))


def test_merging_two_stores_holding_halves_of_the_fleet() -> None:
    fleet = _lognormal_fleet(np.random.default_rng(7), 150)
    a, b = _store(fleet[::2]), _store(fleet[1::2])
    da, db = a.model_digests(NOW)["m"], b.model_digests(NOW)["m"]
    merged = merge_digests([da, db])
    got = digest_quantiles(merged, (0.5, 0.99))
    assert got is not None
    _assert_close(got, _exact(fleet))
    one = _qs(_store(fleet).model_digests(NOW)["m"])
    assert got[0] == pytest.approx(one[0], rel=P50_TOL) and got[1] == pytest.approx(one[1], rel=P99_TOL)
    assert da["nodes"] + db["nodes"] == 150


def test_only_judged_samples_count() -> None:
    rng = np.random.default_rng(3)
    store = WindowStore(S)
    base = 100_000.0 * np.exp(rng.normal(0, 0.3, 800))
    store.observe(_batch("a", base))
    want = _qs(store.model_digests(NOW)["m"])
    # probes, failed requests, stale and not-yet-judged samples never count
    store.observe(_batch("b", np.full(500, 9e6), probe=True))
    store.observe(_batch("c", np.full(500, 9e6), ok=np.zeros(500, bool)))
    store.observe(_batch("d", np.full(500, 9e6), t_lo=T0 - 900, t_hi=NOW - S.max_sample_age_s))
    store.observe(_batch("e", np.full(500, 9e6), t_lo=NOW + 1, t_hi=NOW + 20))
    d = store.model_digests(NOW)["m"]
    assert _qs(d) == pytest.approx(want)
    assert d["nodes"] == 1
    assert store.model_digests(NOW + 10_000) == {}          # everything is stale


def test_models_filter_and_per_series_cap() -> None:
    store = WindowStore(S)
    for model in ("x", "y"):
        for i in range(4):
            store.observe(_batch(f"n{i}", np.linspace(1e4, 2e4, 1000), model=model))
    assert set(store.model_digests(NOW)) == {"x", "y"}
    assert set(store.model_digests(NOW, models=["y", "unknown"])) == {"y"}
    assert store.model_digests(NOW, models=[]) == {}
    assert store.model_digests(NOW, per_series=10)["x"]["n_values"] <= 40
    with pytest.raises(ValueError, match="per_series"):
        store.model_digests(NOW, per_series=0)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 3000),
                  elements=st.floats(1.0, 1e7, allow_nan=False, allow_infinity=False)))
@example(np.full(100, 223599.07946778517))
def test_digest_of_sorted_is_a_valid_mergeable_digest(values: np.ndarray) -> None:
    v = np.sort(values)
    d = digest_dict_of_sorted(v)
    cs = d["centroids"]
    assert len(cs) <= d["max_centroids"]
    assert sum(c["c"] for c in cs) == v.size == d["n_values"]
    assert [c["m"] for c in cs] == sorted(c["m"] for c in cs)
    assert d["min"] == v[0] and d["max"] == v[-1]
    dig = digest_from_dict(d)
    q = digest_quantiles(dig, (0.0, 0.5, 1.0))
    assert q is not None
    slack = 1e-12 * v[-1]                      # fastdigest's interpolation rounds
    assert v[0] - slack <= q[0] and q[2] <= v[-1] + slack
    # Ordered up to that rounding (all-equal values gave q(0) 3e-11 above q(0.5)).
    assert q[0] <= q[1] + slack and q[1] <= q[2] + slack
    both = merge_digests([d, digest_of(v)])
    assert both.n_values == 2 * v.size


def test_digest_of_sorted_tails_are_exact_enough() -> None:
    v = np.sort(np.random.default_rng(5).lognormal(11, 1.0, 50_000))
    got = digest_quantiles(digest_from_dict(digest_dict_of_sorted(v)), (0.5, 0.9, 0.99, 0.999))
    assert got is not None
    assert got == pytest.approx(np.quantile(v, [0.5, 0.9, 0.99, 0.999]).tolist(), rel=0.01)


# ---- the façade and the command --------------------------------------------------------

def test_detector_fills_the_cluster_figures() -> None:
    det = Detector(S)
    fleet = _lognormal_fleet(np.random.default_rng(11), 30)
    for node, lat in fleet:
        det.observe([_batch(node, lat)])
    det.observe([Heartbeat("idle", "quiet-model", "A100", NOW - 5)])
    res = det.evaluate(NOW)
    ticks = {t.model: t for t in res.models}
    m = ticks["m"]
    assert m.fleet_latency_p50_us is not None and m.fleet_latency_p99_us is not None
    _assert_close([m.fleet_latency_p50_us, m.fleet_latency_p99_us], _exact(fleet))
    assert ticks["quiet-model"].fleet_latency_p50_us is None      # no judged sample
    assert det.fleet_digests["m"]["nodes"] == 30


def test_replay_summary_prints_the_cluster_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for k in range(6000):
        ts = T0 + k / 20.0
        for i in range(4):
            lines.append(json.dumps({"node_id": f"n{i}", "model": "m", "ts": ts,
                                     "latency_us": 100_000.0 * float(np.exp(rng.normal(0, 0.3)))}))
    f = tmp_path / "trace.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert main([str(f), "--summary"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("model m: cluster P50"))
    assert line.endswith("(t-digest over 4 nodes)")
    p50_ms = float(line.split("P50 ")[1].split(" ms")[0])
    p99_ms = float(line.split("P99 ")[1].split(" ms")[0])
    # 4 nodes x 125 kept samples: a lognormal(sigma 0.3) P50 of 100 ms, P99 of ~201 ms
    assert p50_ms == pytest.approx(100.0, rel=0.05)
    assert 170.0 < p99_ms < 240.0
