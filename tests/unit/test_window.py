"""WindowStore: window content, judged samples, summaries, signals, snapshots."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window.summarize import fresh_min_samples
from tailguard.core.window.window import WindowStore

S = DetectorSettings(window_size=100, min_samples=10, max_sample_age_s=60.0)


def mk(node: str, ts: Any, lat: Any, *, model: str = "m", ok: Any = None, probe: Any = None,
       inp: Any = None, out: Any = None, ttft: Any = None, hw: str | None = None) -> SampleBatch:
    t = np.atleast_1d(np.asarray(ts, dtype=np.float64))
    n = t.size
    lat_a = np.broadcast_to(np.asarray(lat, dtype=np.float64), (n,)).copy()

    def flag(v: Any, default: bool) -> np.ndarray[Any, Any]:
        return np.broadcast_to(np.asarray(default if v is None else v, dtype=bool), (n,)).copy()

    def col(v: Any) -> np.ndarray[Any, Any] | None:
        return None if v is None else np.broadcast_to(np.asarray(v, dtype=np.float64),
                                                       (n,)).copy()

    return SampleBatch(node, model, hw, t, lat_a, flag(ok, True), flag(probe, False), col(inp),
                       col(out), col(ttft))


def by_node(ws: list[WindowSummary]) -> dict[str, WindowSummary]:
    return {w.node_id: w for w in ws}


# ---------------------------------------------------------------- window content

def test_window_keeps_last_n_ok_samples_across_tier_growth() -> None:
    store = WindowStore(S)
    lat = np.arange(1, 251, dtype=np.float64)
    for i in range(0, 250, 7):
        store.observe(mk("a", lat[i:i + 7], lat[i:i + 7]))
    w = store.window("a", "m")
    assert w is not None
    assert w["latency_us"].tolist() == lat[-100:].tolist()
    assert w["ts"].tolist() == lat[-100:].tolist()


def test_failed_samples_are_counted_not_kept() -> None:
    store = WindowStore(S)
    store.observe(mk("a", [10, 11, 12, 13], [5, 6, 7, 8], ok=[True, False, True, False]))
    w = store.window("a", "m")
    assert w is not None and w["latency_us"].tolist() == [5.0, 7.0]
    (s,) = store.summaries(20.0)
    assert s.failed == 2 and s.samples == 2
    (later,) = store.summaries(200.0)
    assert later.failed == 0, "failures older than max_sample_age_s are not counted"


def test_batch_larger_than_window_keeps_its_tail() -> None:
    store = WindowStore(S)
    store.observe(mk("a", [0.5], [1.0]))
    ts = np.arange(1000, dtype=np.float64)
    store.observe(mk("a", ts, ts + 1))
    w = store.window("a", "m")
    assert w is not None and w["latency_us"].tolist() == (ts[-100:] + 1).tolist()


def test_sized_samples_after_unsized_keep_history_with_nan_sizes() -> None:
    store = WindowStore(S)
    store.observe(mk("a", [1, 2], [10, 20]))
    store.observe(mk("a", [3], [30], out=[4], ttft=[1]))
    w = store.window("a", "m")
    assert w is not None
    assert w["latency_us"].tolist() == [10.0, 20.0, 30.0]
    np.testing.assert_array_equal(w["output_tokens"], [np.nan, np.nan, 4.0])
    np.testing.assert_array_equal(w["input_tokens"], [np.nan, np.nan, np.nan])


batches = st.lists(st.tuples(
    st.lists(st.tuples(st.floats(1, 1e6, width=32), st.booleans(), st.booleans()),
             min_size=0, max_size=40),
    st.booleans()), max_size=25)


@settings(max_examples=150, deadline=None)
@given(window=st.sampled_from([10, 17, 100, 200]), plan=batches)
def test_window_equals_last_n_observed_ok_samples(window: int,
                                                  plan: list[tuple[list[Any], bool]]) -> None:
    store = WindowStore(DetectorSettings(window_size=window, min_samples=1))
    ref: list[tuple[float, float, bool, float]] = []
    t = 0.0
    for samples, sized in plan:
        if not samples:
            continue
        ts = np.arange(t, t + len(samples))
        t += len(samples)
        lat = np.array([s[0] for s in samples])
        ok = np.array([s[1] for s in samples])
        probe = np.array([s[2] for s in samples])
        out = (ts % 50) if sized else None
        store.observe(mk("n", ts, lat, ok=ok, probe=probe, out=out))
        for i in range(len(samples)):
            if ok[i]:
                ref.append((float(ts[i]), float(np.float32(lat[i])), bool(probe[i]),
                            float(ts[i] % 50) if sized else np.nan))
    expect = ref[-window:]
    w = store.window("n", "m")
    if not plan or all(not s for s, _ in plan):
        assert w is None
        return
    assert w is not None
    assert w["ts"].tolist() == [r[0] for r in expect]
    assert w["latency_us"].tolist() == [r[1] for r in expect]
    assert w["probe"].astype(bool).tolist() == [r[2] for r in expect]
    if "output_tokens" in w:
        np.testing.assert_array_equal(w["output_tokens"], [r[3] for r in expect])


# ---------------------------------------------------------------- judged samples

def test_summary_quantiles_equal_numpy_on_judged_samples() -> None:
    rng = np.random.default_rng(1)
    store = WindowStore(S)
    ts = np.linspace(1, 100, 300)
    lat = rng.lognormal(10, 0.5, 300)
    store.observe(mk("a", ts, lat, hw="A100"))
    (s,) = store.summaries(100.0)
    tail = lat[-100:].astype(np.float32).astype(np.float64)
    judged = tail[ts[-100:] > 40.0]
    assert s.samples == judged.size
    assert s.signal == "latency" and s.hardware == "A100"
    assert s.p50 == pytest.approx(np.quantile(judged, 0.5), rel=1e-9)
    assert s.p99 == pytest.approx(np.quantile(judged, 0.99), rel=1e-9)
    assert s.latency_p50_us == s.p50 and s.latency_p99_us == s.p99
    assert s.first_seen_ts == 1.0 and s.last_seen_ts == 100.0


def test_clean_fast_path_equals_general_path() -> None:
    rng = np.random.default_rng(2)
    store = WindowStore(S)
    for i in range(20):
        store.observe(mk(f"n{i:02}", np.linspace(50, 99, 100), rng.lognormal(10, 1, 100)))
    fast = store.summaries(100.0)
    # judge_since makes every row take the masked path; here it selects the same samples.
    general = by_node(store.summaries(100.0, {(f"n{i:02}", "m"): 0.0 for i in range(20)}))
    for s in fast:
        g = general[s.node_id]
        assert (s.p50, s.p99, s.samples) == (g.p50, g.p99, g.samples)


def _fresh_reference(w: dict[str, Any], now: float, values: Any = None) -> tuple[int, float | None]:
    """(count, P50) of a window's judged, non-probe samples (of ``values``, default the
    latency) in (now - tick_interval_s, now]; the P50 is None below fresh_min_samples of them
    (a quarter of min_samples)."""
    v = w["latency_us"] if values is None else values
    judged = (w["ts"] <= now) & (w["ts"] > now - S.max_sample_age_s) & (w["probe"] == 0)
    fresh = judged & (w["ts"] > now - S.tick_interval_s) & ~np.isnan(v)
    n = int(fresh.sum())
    return n, (float(np.quantile(v[fresh], 0.5)) if n >= fresh_min_samples(S) else None)


def _assert_fresh_matches_reference(s: WindowSummary, w: dict[str, Any], now: float) -> None:
    n, p50 = _fresh_reference(w, now)
    assert s.fresh_samples == n
    if p50 is None:
        assert s.fresh_p50 is None
    else:
        assert s.fresh_p50 == pytest.approx(p50, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 130), st.floats(0, 200), st.floats(1, 100),
                          st.booleans()), min_size=1, max_size=12),
       st.floats(100, 300))
def test_summaries_match_reference_on_mixed_rows(series: list[tuple[int, float, float, bool]],
                                                  now: float) -> None:
    """Full/partial, aged/fresh, probe/no-probe rows side by side in the same slabs (also
    the fresh P50: the fast path for clean rows, the masked one for the others)."""
    store = WindowStore(S)
    rng = np.random.default_rng(len(series))
    for i, (n, t0, span, probe) in enumerate(series):
        ts = t0 + np.linspace(0, span, n)
        store.observe(mk(f"n{i:02}", ts, rng.lognormal(8, 1, n), probe=(ts % 7 < 1) & probe))
    got = by_node(store.summaries(now))
    for i in range(len(series)):
        w = store.window(f"n{i:02}", "m")
        assert w is not None
        judged = (w["ts"] <= now) & (w["ts"] > now - S.max_sample_age_s)
        probe_m = judged & (w["probe"] > 0)
        lat = w["latency_us"][judged & (w["probe"] == 0)]
        s = got[f"n{i:02}"]
        assert s.samples == lat.size and s.probe_samples == int(probe_m.sum())
        if lat.size:
            assert s.p50 == pytest.approx(np.quantile(lat, 0.5), rel=1e-6)
            assert s.p99 == pytest.approx(np.quantile(lat, 0.99), rel=1e-6)
        else:
            assert s.p50 is None and s.p99 is None
        _assert_fresh_matches_reference(s, w, now)


def _assert_matches_reference(store: WindowStore, nodes: list[str], now: float) -> None:
    got = by_node(store.summaries(now))
    for node in nodes:
        w = store.window(node, "m")
        assert w is not None
        judged = (w["ts"] <= now) & (w["ts"] > now - S.max_sample_age_s)
        lat = w["latency_us"][judged & (w["probe"] == 0)]
        s = got[node]
        assert s.samples == lat.size and s.probe_samples == int((judged & (w["probe"] > 0)).sum())
        if lat.size:
            assert s.p50 == pytest.approx(np.quantile(lat, 0.5), rel=1e-6)
            assert s.p99 == pytest.approx(np.quantile(lat, 0.99), rel=1e-6)
        _assert_fresh_matches_reference(s, w, now)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 120), st.floats(-30, 10),
                          st.sampled_from([0.0, 0.0, 0.1, 1.0]), st.floats(-20, 80)),
                min_size=1, max_size=25))
def test_summaries_stay_exact_across_ticks(steps: list[tuple[int, int, float, float, float]]) -> None:
    """Observe and summarise interleaved, ``now`` moving both ways: the per-ring bounds
    that let full rings skip the masked path must never let a stale, future or probe
    sample be judged (each tick checked against the window content)."""
    store = WindowStore(S)
    rng = np.random.default_rng(len(steps))
    now = 100.0
    nodes: set[str] = set()
    for node_i, n, t_off, probe_share, step_s in steps:
        node = f"n{node_i}"
        ts = now + t_off + rng.uniform(-5, 5, n)          # out of order, some in the future
        store.observe(mk(node, ts, rng.lognormal(8, 1, n), probe=rng.uniform(size=n) < probe_share))
        nodes.add(node)
        now += step_s
        _assert_matches_reference(store, sorted(nodes), now)


def test_samples_after_now_are_not_judged_yet() -> None:
    store = WindowStore(S)
    store.observe(mk("a", [10, 20, 30], [1, 2, 3]))
    (s,) = store.summaries(20.0)
    assert s.samples == 2 and s.p99 == pytest.approx(np.quantile([1, 2], 0.99))


def test_age_bound_excludes_old_samples_of_quiet_node() -> None:
    store = WindowStore(S)
    store.observe(mk("a", np.arange(0, 50), 100.0))
    store.observe(mk("a", [500.0], 900.0))
    (s,) = store.summaries(510.0)
    assert s.samples == 1 and s.p50 == 900.0
    (gone,) = store.summaries(1000.0)
    assert gone.samples == 0 and gone.p50 is None and gone.ratio is None


def test_probes_are_reported_apart_and_not_judged() -> None:
    store = WindowStore(S)
    store.observe(mk("a", [1, 2, 3, 4], [10, 20, 500, 700], probe=[False, False, True, True]))
    (s,) = store.summaries(10.0)
    assert s.samples == 2 and s.p50 == 15.0
    assert s.probe_samples == 2 and s.probe_p50 == 600.0
    assert s.probe_p99 == pytest.approx(np.quantile([500, 700], 0.99))


def test_judge_since_uses_all_ok_samples_since_cutoff() -> None:
    store = WindowStore(S)
    store.observe(mk("a", [1, 2], [1000, 1000]))
    store.observe(mk("a", [5, 6, 7], [10, 20, 30], probe=True))
    store.observe(mk("b", [5, 6, 7], [10, 20, 30], probe=True))
    got = by_node(store.summaries(10.0, {("a", "m"): 5.0, ("zz", "m"): 1.0}))
    assert got["a"].samples == 3 and got["a"].p50 == 20.0
    assert got["a"].extra["judged_since"] == 5.0
    assert got["b"].samples == 0 and "judged_since" not in got["b"].extra


# ---------------------------------------------------------------- fresh P50

def test_fresh_p50_is_over_the_samples_since_the_previous_tick() -> None:
    # A node that slowed 3x at t=80: its 100-sample window (t 41..100) still holds 2/3 old
    # samples, so the window P50 is barely up while the P50 of the last 30 s is 3x.
    rng = np.random.default_rng(11)
    ts = np.linspace(40.6, 100, 100)
    lat = rng.lognormal(np.log(1000), 0.2, 100) * np.where(ts > 80, 3.0, 1.0)
    store = WindowStore(S)
    store.observe(mk("slowed", ts, lat))
    store.observe(mk("steady", ts, rng.lognormal(np.log(1000), 0.2, 100)))
    store.observe(mk("some", np.linspace(95, 100, 9), 1000.0))  # below min_samples (10)
    store.observe(mk("few", np.array([100.0]), 1000.0))   # below a quarter of it (2)
    got = by_node(store.summaries(100.0))
    slowed = got["slowed"]
    fresh_lat = lat[ts > 70].astype(np.float32).astype(np.float64)
    assert slowed.fresh_samples == fresh_lat.size == 50
    assert slowed.fresh_p50 == pytest.approx(np.quantile(fresh_lat, 0.5), rel=1e-6)
    assert slowed.p50 is not None and slowed.p50 < 1.5 * 1000 < 2.0 * 1000 < slowed.fresh_p50
    # fewer fresh samples than min_samples but a quarter of it (a quieter node, or one whose
    # events arrive late): a fresh P50, which stage 2 judges but takes as no reference
    some = got["some"]
    assert (some.fresh_samples, some.fresh_p50, some.samples) == (9, 1000.0, 9)
    few = got["few"]
    # fewer than a quarter of min_samples: counted, no P50
    assert (few.fresh_samples, few.fresh_p50, few.samples) == (1, None, 1)
    assert few.p50 == 1000.0


def test_fresh_p50_of_a_wholly_fresh_window_is_its_p50() -> None:
    rng = np.random.default_rng(12)
    store = WindowStore(S)
    store.observe(mk("a", np.linspace(75, 100, 60), rng.lognormal(8, 1, 60)))
    (s,) = store.summaries(100.0)
    assert s.fresh_samples == s.samples == 60 and s.fresh_p50 == s.p50


def test_fresh_p50_follows_cutoffs_probes_and_the_signal() -> None:
    rng = np.random.default_rng(13)
    store = WindowStore(S)
    ts = np.linspace(41, 100, 100)
    # probes are not judged, so not fresh either
    store.observe(mk("probed", ts, rng.lognormal(8, 1, 100), probe=ts % 3 < 1))
    # a cut-off (judge_since) inside the fresh span: only samples since it count
    store.observe(mk("cut", ts, rng.lognormal(8, 1, 100)))
    got = by_node(store.summaries(100.0, {("cut", "m"): 85.0}))
    for node in ("probed", "cut"):
        w = store.window(node, "m")
        assert w is not None
        if node == "cut":
            w = {k: v[w["ts"] >= 85.0] for k, v in w.items()}
        n, p50 = _fresh_reference(w, 100.0)
        assert got[node].fresh_samples == n > 0
        assert got[node].fresh_p50 == pytest.approx(p50, rel=1e-6)
    # per-token signal: the fresh P50 is of TPOT, like p50
    sized = WindowStore(S.replace(signal="tpot"))
    sized.observe(llm_batch("n0", rng, 100, 30_000.0, t0=50.0))
    (s,) = sized.summaries(100.0)
    w = sized.window("n0", "llm")
    assert w is not None and s.signal == "tpot"
    tpot = (w["latency_us"] - w["ttft_us"]) / (w["output_tokens"] - 1)
    n, p50 = _fresh_reference(w, 100.0, values=tpot)
    assert s.fresh_samples == n and 0 < n < s.samples
    assert s.fresh_p50 == pytest.approx(p50, rel=1e-4)


def test_heartbeat_only_series_is_known_without_samples() -> None:
    store = WindowStore(S)
    store.observe_heartbeat(Heartbeat("idle", "m", "A10", 42.0))
    store.observe_heartbeat(Heartbeat("idle", "m", None, 50.0))
    assert store.series_count() == 1 and ("idle", "m") in store
    (s,) = store.summaries(60.0)
    assert (s.samples, s.p50, s.hardware, s.first_seen_ts, s.last_seen_ts) == \
        (0, None, "A10", 42.0, 50.0)


def test_forget_and_order() -> None:
    store = WindowStore(S)
    for node, model in [("b", "y"), ("a", "y"), ("c", "x")]:
        store.observe(mk(node, [1.0], [5.0], model=model))
    assert [(s.model, s.node_id) for s in store.summaries(2.0)] == \
        [("x", "c"), ("y", "a"), ("y", "b")]
    assert store.forget("a", "y") and not store.forget("a", "y")
    assert store.series_count() == 2
    assert store.window("a", "y") is None
    store.observe(mk("a", [1.5], [9.0], model="y"))
    w = store.window("a", "y")
    assert w is not None and w["latency_us"].tolist() == [9.0]


def test_summaries_do_not_change_the_store() -> None:
    store = WindowStore(S)
    store.observe(mk("a", np.arange(50.0), np.arange(1, 51.0), out=np.arange(50) % 9, ttft=0.5))
    first = store.summaries(40.0, {("a", "m"): 10.0}, digests=True)
    assert store.summaries(40.0, {("a", "m"): 10.0}, digests=True) == first


def test_digest_extra_is_mergeable_dict() -> None:
    from tailguard.core.window.quantiles import digest_from_dict

    store = WindowStore(S)
    store.observe(mk("a", np.arange(100.0), np.arange(1, 101.0)))
    (s,) = store.summaries(99.0, digests=True)
    d = digest_from_dict(s.extra["digest"])
    assert d.n_values == 60 and d.quantile(0.5) == pytest.approx(70.5, rel=0.02)


# ---------------------------------------------------------------- signals in the store

def llm_batch(node: str, rng: np.random.Generator, n: int, tpot: float, *, t0: float = 1.0,
              with_ttft: bool = True, model: str = "llm") -> SampleBatch:
    out = rng.integers(2, 400, n).astype(np.float64)
    inp = rng.integers(10, 3000, n).astype(np.float64)
    ttft = 50_000 + 20.0 * inp
    lat = (ttft + tpot * out) * rng.lognormal(0, 0.05, n)
    ttft = np.minimum(ttft, lat)
    return mk(node, np.linspace(t0, t0 + 50, n), lat, model=model, inp=inp, out=out,
              ttft=ttft if with_ttft else None)


@pytest.mark.parametrize(("configured", "with_ttft", "expect"), [
    ("auto", True, "tpot"),
    ("auto", False, "normalized"),
    ("latency", True, "latency"),
    ("normalized", True, "normalized"),
    ("tpot", True, "tpot"),
])
def test_signal_choice(configured: str, with_ttft: bool, expect: str) -> None:
    rng = np.random.default_rng(3)
    store = WindowStore(S.replace(signal=configured))
    for i in range(4):
        store.observe(llm_batch(f"n{i}", rng, 100, 30_000.0, with_ttft=with_ttft))
    store.observe(mk("plain", np.linspace(1, 50, 100), 10_000.0, model="embed"))
    got = store.summaries(60.0)
    llm = [s for s in got if s.model == "llm"]
    assert {s.signal for s in llm} == {expect}
    assert all(s.samples == 100 and s.p50 is not None for s in llm)
    embed = next(s for s in got if s.model == "embed")
    # A model configured to a token signal whose series carry no token counts is judged in
    # raw latency (it used to be summarised with no sample, never judged, never admitted).
    assert embed.signal == "latency" and embed.p50 == 10_000.0 and embed.samples == 100
    assert embed.latency_p50_us == 10_000.0 and embed.fresh_over is None


def test_a_node_without_token_counts_turns_its_model_to_a_signal_every_node_has() -> None:
    # A partial emitter rollout: four nodes send token counts (and TTFT), two send latency
    # only. Judged per token, the two would have no sample of the signal, never be judged,
    # never admitted: the model is judged in raw latency until every node can be judged.
    rng = np.random.default_rng(4)
    store = WindowStore(S)
    for i in range(4):
        store.observe(llm_batch(f"n{i}", rng, 100, 30_000.0))
    for i in range(4, 6):
        store.observe(mk(f"n{i}", np.linspace(1, 50, 100), 5e6, model="llm"))
    got = {s.node_id: s for s in store.summaries(60.0)}
    assert {s.signal for s in got.values()} == {"latency"}
    assert all(s.samples == 100 and s.p50 == s.latency_p50_us for s in got.values())
    # the same nodes with TTFT missing on two: normalized (output tokens everywhere)
    store = WindowStore(S)
    for i in range(6):
        store.observe(llm_batch(f"n{i}", rng, 100, 30_000.0, with_ttft=i < 4))
    assert {s.signal for s in store.summaries(60.0)} == {"normalized"}
    # a node with too few samples to be judged yet changes nothing
    store = WindowStore(S)
    for i in range(4):
        store.observe(llm_batch(f"n{i}", rng, 100, 30_000.0))
    store.observe(mk("new", np.linspace(1, 50, S.min_samples - 1), 5e6, model="llm"))
    got = {s.node_id: s for s in store.summaries(60.0)}
    assert got["n0"].signal == "tpot" and got["new"].samples == 0


def test_model_signals_override_one_model() -> None:
    rng = np.random.default_rng(4)
    store = WindowStore(S.replace(model_signals="llm=latency"))
    store.observe(llm_batch("n0", rng, 100, 30_000.0))
    store.observe(llm_batch("n0", rng, 100, 30_000.0, model="other"))
    got = {s.model: s.signal for s in store.summaries(60.0)}
    assert got == {"llm": "latency", "other": "tpot"}


@pytest.mark.parametrize("with_ttft", [True, False])
def test_llm_signal_tames_request_mix_and_flags_slow_node(with_ttft: bool) -> None:
    rng = np.random.default_rng(5)
    store = WindowStore(S)
    for i in range(8):
        store.observe(llm_batch(f"n{i}", rng, 100, 75_000.0 if i == 3 else 30_000.0,
                                with_ttft=with_ttft))
    got = by_node(store.summaries(60.0))
    healthy = [got[f"n{i}"] for i in range(8) if i != 3]
    slow = got["n3"]
    raw_ratio = np.median([s.latency_p99_us / s.latency_p50_us for s in healthy])  # type: ignore[operator]
    assert raw_ratio > 2.0
    for s in healthy:
        assert s.ratio is not None and s.ratio < raw_ratio
    peers = np.median([s.p50 for s in healthy])  # type: ignore[misc]
    assert slow.p50 is not None and slow.p50 > 2.0 * peers
    if not with_ttft:
        assert slow.signal == "normalized"
        assert all(0.8 < s.p50 < 1.25 for s in healthy)  # type: ignore[operator]
        fit = slow.extra["fleet_fit"]
        assert fit["nodes"] == 8 and fit["b_us_per_token"] == pytest.approx(30_000, rel=0.1)


def test_out_of_fit_series_does_not_vote_in_the_fleet_fit() -> None:
    rng = np.random.default_rng(6)
    store = WindowStore(S)
    for i in range(4):
        store.observe(llm_batch(f"n{i}", rng, 100, 30_000.0, with_ttft=False))
    got = store.summaries(60.0, {("n0", "llm"): 0.0}, out_of_fit={("n0", "llm")})
    assert got[0].extra["fleet_fit"]["nodes"] == 3


def test_cutoff_applies_to_judged_samples_and_the_series_keeps_its_fit_vote() -> None:
    # A whole fleet with cut-offs (warm-up ended together; a node just re-admitted) keeps its
    # fit, and each series is judged only on samples since its cut-off.
    rng = np.random.default_rng(7)
    store = WindowStore(S.replace(window_size=1000, max_sample_age_s=300.0))
    for i in range(4):
        store.observe(llm_batch(f"n{i}", rng, 200, 30_000.0, with_ttft=False))
    # n0: slow in its first 100 samples (t <= 51), healthy from t = 60
    slow = llm_batch("n0", rng, 100, 90_000.0, with_ttft=False, t0=1.0)
    store.forget("n0", "llm")
    store.observe(slow)
    store.observe(llm_batch("n0", rng, 100, 30_000.0, with_ttft=False, t0=60.0))
    since = {(f"n{i}", "llm"): 1.0 for i in range(1, 4)} | {("n0", "llm"): 55.0}
    got = by_node(store.summaries(120.0, since))
    assert got["n0"].extra["fleet_fit"]["nodes"] == 4
    assert got["n0"].samples == 100 and got["n0"].extra["judged_since"] == 55.0
    assert got["n0"].p50 == pytest.approx(got["n1"].p50, rel=0.15)   # old slow samples not judged
    unjudged = by_node(store.summaries(120.0))["n0"]
    assert unjudged.samples == 200
    assert unjudged.p99 > 2.0 * got["n0"].p99  # type: ignore[operator]


# ---------------------------------------------------------------- snapshot / restore

def test_snapshot_is_json_and_restores_identically() -> None:
    rng = np.random.default_rng(7)
    store = WindowStore(S)
    store.observe(llm_batch("n0", rng, 150, 30_000.0))
    store.observe(mk("p", [1, 2, 3, 4], [5, 6, 7, 8], ok=[True, False, True, True],
                     probe=[False, False, True, False], hw="A10"))
    store.observe_heartbeat(Heartbeat("idle", "m", "H100", 3.0))
    snap = json.loads(json.dumps(store.snapshot(), allow_nan=False))
    other = WindowStore(S)
    other.restore(snap)
    assert other.summaries(60.0) == store.summaries(60.0)
    more = llm_batch("n0", rng, 30, 30_000.0, t0=60.0)
    for st_ in (store, other):
        st_.observe(more)
        st_.observe(mk("p", [70.0], [1.0]))
    assert other.summaries(120.0) == store.summaries(120.0)
    assert other.snapshot() == store.snapshot()


def round_trip(store: WindowStore, cfg: DetectorSettings) -> WindowStore:
    other = WindowStore(cfg)
    other.restore(json.loads(json.dumps(store.snapshot(), allow_nan=False)))
    return other


def test_samples_stored_as_too_old_keep_their_slots_through_a_snapshot() -> None:
    # Samples an hour older than the ring's newest are stored as too old (time -inf): never
    # judged, but they hold their slots until newer samples push them out. A snapshot holds
    # them as null times (-inf is not JSON) and a restore stores them as too old again: a
    # restore that dropped them kept older samples longer than the original did.
    cfg = DetectorSettings(window_size=16, min_samples=1, max_sample_age_s=600.0)
    store = WindowStore(cfg)
    store.observe(mk("n", [3599.0], 1e5))
    store.observe(mk("n", [-900.0, -880.0, -861.0], [1e5] * 3))     # 75 min before it
    store.observe(mk("n", 3600.0 + np.arange(12.0), 1e5 + np.arange(12.0), probe=[True] + [False] * 11))
    w = store.window("n", "m")
    assert w is not None and np.isneginf(w["ts"]).sum() == 3
    snap = json.loads(json.dumps(store.snapshot(), allow_nan=False))
    assert snap["series"][0]["ts"][:5] == [3599.0, None, None, None, 3600.0]
    other = round_trip(store, cfg)
    old = store.snapshot()                  # written before: -inf times, no base
    old["series"][0]["ts"] = [-np.inf if v is None else v for v in old["series"][0]["ts"]]
    del old["series"][0]["base_us"]
    again = WindowStore(cfg)
    again.restore(old)
    for s in (store, other, again):
        s.observe(mk("n", [3700.0], 2e5))    # pushes the sample of 3599 s out
    for s in (other, again):
        assert s.summaries(3700.0) == store.summaries(3700.0)
        got, want = s.window("n", "m"), store.window("n", "m")
        assert got is not None and want is not None
        assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}


def test_a_restored_ring_keeps_samples_over_its_whole_span() -> None:
    # A ring spans 2^32 µs (71.6 min) below its newest sample. A restore that coded the
    # samples as a first batch (room kept above the newest) stored the oldest hour of them
    # as too old: here the whole window at -2400 s.
    cfg = DetectorSettings(window_size=16, min_samples=1, max_sample_age_s=600.0)
    store = WindowStore(cfg)
    store.observe(mk("n", [1000.0], 1e5))
    store.observe(mk("n", [-2500.0, -2499.0], 2e5))
    other = round_trip(store, cfg)
    w = other.window("n", "m")
    assert w is not None and w["ts"].tolist() == [1000.0, -2500.0, -2499.0]
    assert other.summaries(-2400.0) == store.summaries(-2400.0)
    assert other.summaries(-2400.0)[0].samples == 2


def test_a_restored_ring_keeps_its_base_so_later_samples_fit_as_in_the_original() -> None:
    # The ring's base decides which later samples fit and which a rebase stores as too old:
    # the original's base (first sample at 0 s) holds -3150 s next to 1100 s; a base chosen
    # anew for the restored times (0 s and 100 s) would not, and the later sample at 1100 s
    # would have stored -3150 s as too old in the restored ring only.
    cfg = DetectorSettings(window_size=16, min_samples=1, max_sample_age_s=600.0)
    store = WindowStore(cfg)
    store.observe(mk("n", [0.0], 1e5))
    store.observe(mk("n", [100.0], 1e5))
    other = round_trip(store, cfg)
    for s in (store, other):
        s.observe(mk("n", [-3150.0], 2e5))
        s.observe(mk("n", [1100.0], 1e5))
    got, want = other.window("n", "m"), store.window("n", "m")
    assert got is not None and want is not None
    assert got["ts"].tolist() == want["ts"].tolist()
    assert other.summaries(-3100.0) == store.summaries(-3100.0)


def test_a_restored_ring_sits_in_the_same_slots_so_the_cluster_pools_are_the_same() -> None:
    # The pools take every stride-th slot of a ring (window_size 300 at 128 samples a series:
    # stride 3); a restore that wrote the ring from slot 0 on pooled other samples.
    cfg = DetectorSettings(window_size=300, min_samples=1, max_sample_age_s=600.0)
    store = WindowStore(cfg)
    rng = np.random.default_rng(3)
    for i in range(0, 451, 11):
        store.observe(mk("n", 1000.0 + 0.5 * np.arange(i, i + 11), rng.lognormal(7.0, 1.0, 11)))
    other = round_trip(store, cfg)
    got, want = other.model_pools(1230.0)["m"], store.model_pools(1230.0)["m"]
    assert sorted(got.values.tolist()) == sorted(want.values.tolist())
    assert other.summaries(1230.0) == store.summaries(1230.0)


def test_a_restart_awaiting_confirmation_is_confirmed_after_a_restore() -> None:
    # Signs of life after a gap mark a restart once RESTART_CONFIRM_SIGNS of them follow
    # within restart_gap_s; those seen before the snapshot count after the restore.
    cfg = DetectorSettings(window_size=40, min_samples=1, max_sample_age_s=600.0, restart_gap_s=10.0)
    store = WindowStore(cfg)
    store.observe(mk("n", np.arange(10.0), 1e5))
    store.observe(mk("n", 1000.0 + np.arange(5.0), 1e5))      # after a gap: 5 signs of 10
    other = round_trip(store, cfg)
    for s in (store, other):
        s.observe(mk("n", 1005.0 + np.arange(5.0), 1e5))
    assert store.summaries(1010.0)[0].resumed_ts == 1000.0
    assert other.summaries(1010.0) == store.summaries(1010.0)


def test_restore_into_smaller_window_keeps_newest() -> None:
    store = WindowStore(S)
    store.observe(mk("a", np.arange(100.0), np.arange(1, 101.0)))
    small = WindowStore(DetectorSettings(window_size=10, min_samples=1))
    small.restore(store.snapshot())
    w = small.window("a", "m")
    assert w is not None and w["latency_us"].tolist() == list(range(91, 101))


def test_restore_rejects_unknown_version() -> None:
    with pytest.raises(ValueError, match="version"):
        WindowStore(S).restore({"version": 99, "series": []})


@settings(max_examples=60, deadline=None)
@given(plan=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                               st.lists(st.floats(1, 1e6), min_size=1, max_size=60),
                               st.booleans(), st.booleans()), max_size=12),
       now=st.floats(0, 400))
def test_snapshot_round_trip_property(plan: list[tuple[str, list[float], bool, bool]],
                                      now: float) -> None:
    store = WindowStore(S)
    t = 0.0
    for node, lats, probe, sized in plan:
        ts = t + np.arange(len(lats))
        t += len(lats)
        store.observe(mk(node, ts, lats, probe=probe, out=(ts % 7) if sized else None))
    other = WindowStore(S)
    other.restore(json.loads(json.dumps(store.snapshot())))
    assert other.summaries(now) == store.summaries(now)


@pytest.mark.parametrize("with_ttft", [True, False])
def test_relabelling_and_arrival_order_change_nothing(with_ttft: bool) -> None:
    rng = np.random.default_rng(8)
    batches = [llm_batch(f"n{i}", rng, 100, 30_000.0 * (1 + i % 3), with_ttft=with_ttft)
               for i in range(6)]
    a, b = WindowStore(S), WindowStore(S)
    for x in batches:
        a.observe(x)
    for x in reversed(batches):
        b.observe(SampleBatch(f"z{x.node_id}", x.model, x.hardware, x.ts, x.latency_us, x.ok,
                              x.probe, x.input_tokens, x.output_tokens, x.ttft_us))
    got_a = {s.node_id: (s.p50, s.p99, s.samples, s.signal) for s in a.summaries(60.0)}
    got_b = {s.node_id[1:]: (s.p50, s.p99, s.samples, s.signal) for s in b.summaries(60.0)}
    assert got_a == got_b


@settings(max_examples=25, deadline=None)
@given(window=st.sampled_from([513, 777, 1000, 1025]), seed=st.integers(0, 2**32 - 1),
       ties=st.sampled_from([0, 3, 40]))
def test_wide_windows_match_numpy_quantile(window: int, seed: int, ties: int) -> None:
    """Windows wider than quantiles.SPLIT_WIDTH (sorted as halves), clean and partial rows, ties."""
    rng = np.random.default_rng(seed)
    store = WindowStore(DetectorSettings(window_size=window, min_samples=1, max_sample_age_s=600.0))
    for i, n in enumerate([window, window, window + 50, window // 2 + 1, 600]):
        lat = rng.lognormal(10, 1, n)
        if ties:
            lat = rng.choice(lat[:ties], n)
        store.observe(mk(f"n{i}", np.linspace(1.0, 100.0, n), lat))
    for s in store.summaries(200.0):
        w = store.window(s.node_id, "m")
        assert w is not None
        lat = w["latency_us"].astype(np.float32).astype(np.float64)
        assert s.samples == lat.size
        expect = np.quantile(lat, (0.5, 0.99))
        assert (s.p50, s.p99) == (pytest.approx(expect[0], rel=1e-12), pytest.approx(expect[1], rel=1e-12))
        assert (s.latency_p50_us, s.latency_p99_us) == (s.p50, s.p99)


def test_request_and_failure_counters_are_cumulative_and_survive_a_snapshot() -> None:
    store = WindowStore(S)
    ts = 1000.0 + np.arange(10, dtype=np.float64)
    ok = np.array([True] * 7 + [False] * 3)
    store.observe(SampleBatch("n", "m", None, ts, np.full(10, 100.0), ok, np.zeros(10, bool)))
    store.observe(SampleBatch("n", "m", None, ts + 10, np.full(10, 100.0), ~np.zeros(10, bool),
                              np.zeros(10, bool)))
    store.observe_heartbeat(Heartbeat("idle", "m", None, 1019.0))
    sums = {s.node_id: s for s in store.summaries(1020.0)}
    assert (sums["n"].requests_total, sums["n"].failed_total) == (20, 3)
    assert (sums["idle"].requests_total, sums["idle"].failed_total) == (0, 0)
    again = WindowStore(S)
    again.restore(json.loads(json.dumps(store.snapshot())))
    assert again.summaries(1020.0) == store.summaries(1020.0)


@pytest.mark.parametrize("counts", [(-1, 0), (5, 6), (5.0, 1), (True, 0), ("7", 1)])
def test_a_summary_with_bad_counters_decodes_without_them(counts: tuple[Any, Any]) -> None:
    s = WindowSummary(node_id="n", model="m", tick_ts=0.0, signal="latency", samples=1, p50=1.0,
                      p99=1.0, latency_p50_us=1.0, latency_p99_us=1.0, requests_total=7,
                      failed_total=1).to_dict()
    s["requests_total"], s["failed_total"] = counts
    back = WindowSummary.from_dict(s)
    assert (back.requests_total, back.failed_total) == (0, 0)
    s["requests_total"], s["failed_total"] = 7, 1
    assert WindowSummary.from_dict(s).failed_total == 1


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ties=st.sampled_from([0, 1, 4]))
def test_steady_state_rings_match_the_masked_path(seed: int, ties: int) -> None:
    """Full rings with every sample judged (one sort per ring for the window and its fresh
    samples) give, bit for bit, what the masked path gives for the same samples: a
    judge_since cut-off before every sample sends the same rings down that path."""
    cfg = DetectorSettings(window_size=600, min_samples=10, max_sample_age_s=120.0,
                           tick_interval_s=30.0)
    rng = np.random.default_rng(seed)
    now = 10_000.0
    store = WindowStore(cfg)
    fresh_counts = [0, 5, 10, 11, 300, 599, 600, int(rng.integers(0, 601))]
    for i, nf in enumerate(fresh_counts):
        ts = np.concatenate([rng.uniform(now - 119.0, now - 30.0, 600 - nf),
                             rng.uniform(now - 29.9, now, nf)])
        ts[rng.permutation(600)[:2]] = [now - 30.0, now]       # both edges of "fresh"
        lat = (rng.choice(rng.lognormal(10, 0.5, ties), 600) if ties
               else rng.lognormal(10, 0.5, 600))
        store.observe(mk(f"n{i}", rng.permutation(ts), lat))
    refs = {"m": float(np.exp(10.3))}
    fast = store.summaries(now, tail_refs=refs)
    cut = {(f"n{i}", "m"): now - 500.0 for i in range(len(fresh_counts))}
    masked = store.summaries(now, cut, tail_refs=refs)
    assert [s.fresh_samples for s in fast] == [
        int(np.count_nonzero(store.window(s.node_id, "m")["ts"] > now - 30.0))  # type: ignore[index]
        for s in fast]
    assert all(s.fresh_over is not None for s in fast)
    assert any(s.fresh_over for s in fast) or ties == 1          # one value: none above it
    for f, m in zip(fast, masked, strict=True):
        assert m.extra == {"judged_since": now - 500.0} and f.extra == {}
        assert repr(f._replace(extra={})) == repr(m._replace(extra={}))
