"""The rings' 4-byte event times (tailguard.core.window.ts_codes): exact round trips, exact
comparisons, new bases, and the ring's size per sample."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.window import ts_codes as tc
from tailguard.core.window.rings import Slab
from tailguard.core.window.window import WindowStore

T0 = 1_764_680_000.0


def test_a_latency_ring_is_stored_at_8_bytes_per_sample() -> None:
    ch = Slab(1000, 16, sized=False)
    assert sum(col.nbytes for col in ch.columns()) == 8 * 1000 * 16
    sized = Slab(1000, 16, sized=True)
    assert sum(col.nbytes for col in sized.columns()) == 20 * 1000 * 16
    store = WindowStore(DetectorSettings(window_size=1000))
    ones, zeros = np.ones(1000, bool), np.zeros(1000, bool)
    for i in range(40):
        store.observe(SampleBatch(f"n{i}", "m", None, T0 + np.arange(1000) * 0.01,
                                  np.full(1000, 1e5), ones, zeros))
    slots = sum(ch.rows * ch.cap for tier in store.tiers.slabs_by_tier.values() for ch in tier)
    assert store.nbytes() == 8 * slots


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4_000_000_000 * 1_000_000), min_size=1, max_size=50))
def test_microsecond_times_decode_to_the_same_float(us: list[int]) -> None:
    ts = np.array([float(f"{u // 1_000_000}.{u % 1_000_000:06d}") for u in us])
    ring = np.zeros(64, dtype=np.uint32)
    codes, base, lost, _, _ = tc.encode_into(ring[None, :], 0, 0, ts, float(ts.min()), float(ts.max()), filled=False)
    span = max(us) - min(us)
    kept = codes > 0
    assert not lost and (kept.all() or span > tc.MAX_CODE - tc.HEADROOM)
    assert tc.decode(codes, base)[kept].tolist() == ts[kept].tolist()


@settings(max_examples=300, deadline=None)
@given(ts=st.lists(st.floats(T0 - 1500, T0 + 1500), min_size=1, max_size=30),
       bound=st.floats(T0 - 5000, T0 + 5000), pick=st.integers(0, 29))
def test_code_thresholds_compare_as_the_decoded_times(ts: list[float], bound: float, pick: int) -> None:
    t = np.array(ts)
    codes, base, _, _, _ = tc.encode_into(np.zeros((1, 1), np.uint32), 0, 0, t, float(t.min()), float(t.max()),
                                          filled=False)
    dec = tc.decode(codes, base)
    assert (np.abs(dec - t) < 0.75e-6).all()
    b = np.array([base])
    for a in (bound, float(dec[pick % dec.size])):        # any bound, and one equal to a sample
        assert ((codes > tc.after(b, a)[0]) == (dec > a)).all()
        assert ((codes <= tc.after(b, a)[0]) == (dec <= a)).all()
        stored = float(np.rint(a * 1e6)) / 1e6              # the cut-off stored as a sample
        assert ((codes > tc.since(b, np.array([a]))[0]) == (dec >= stored)).all()
    for k in range(t.size):                              # a cut-off at a sample's own time
        assert codes[k] > tc.since(b, np.array([t[k]]))[0]


@settings(max_examples=300, deadline=None)
@given(base=st.integers(0, 2 * 10**15), rel=st.integers(-2_100_000_000, tc.MAX_CODE + 2_100_000_000),
       frac=st.floats(0.0, 0.999), seed=st.integers(0, 2**32 - 1))
def test_the_flag_of_codes_near_a_bound_is_the_comparison(base: int, rel: int, frac: float,
                                                          seed: int) -> None:
    """flag_at_most sets bit 31 exactly where codes <= after(base, t), for codes whose times lie
    within FLAG_SPAN_S of t: also where t is before the ring's base or past its last code (the
    threshold clipped to 0 or MAX_CODE)."""
    t = (base + rel) / 1e6 + frac * 1e-6
    span = int(tc.FLAG_SPAN_S * 1e6) - 2
    lo, hi = max(1, rel - span), min(tc.MAX_CODE, rel + span)
    if lo > hi:
        return                              # no code within the span of t
    rng = np.random.default_rng(seed)
    codes = rng.integers(lo, hi, size=(3, 40), endpoint=True).astype(np.uint32)
    codes[:, :3] = [lo, hi, min(max(rel, lo), hi)]
    bases = np.full(3, base, dtype=np.int64)
    at_most = codes <= tc.after(bases, t)[:, None]
    thr1 = tc.flag_thresholds(bases, t)
    for per_ring in (thr1, thr1[0]):        # one threshold per ring, or one for all (one base)
        out = np.empty_like(codes)
        tc.flag_at_most(codes, per_ring, out)
        assert (out == np.where(at_most, np.uint32(1 << 31), np.uint32(0))).all()


def test_a_cut_off_at_a_samples_own_7_decimal_time_counts_it() -> None:
    """Python producers send ``time.time()`` with 7 decimals; such a time is stored up to
    0.5 µs earlier. A cut-off at a first sample's time (warm-up 0) judged none of them."""
    t = 1_796_493_421.6860485            # stored as ….686048 (rounded down)
    codes, base, _, _, _ = tc.encode_into(np.zeros((1, 4), np.uint32), 0, 0, np.full(4, t), t, t,
                                          filled=False)
    assert float(tc.decode(codes, base)[0]) < t
    assert (codes > tc.since(np.array([base]), np.array([t]))[0]).all()
    store = WindowStore(DetectorSettings(window_size=100, min_samples=1))
    store.observe(SampleBatch("a", "m", None, np.full(60, t), np.full(60, 1e3), np.ones(60, bool),
                              np.zeros(60, bool)))
    (s,) = store.summaries(t + 1.0, judge_since={("a", "m"): t})
    assert s.samples == 60


def test_a_ring_moves_its_base_and_keeps_exact_times() -> None:
    store = WindowStore(DetectorSettings(window_size=100, max_sample_age_s=60.0, min_samples=1))
    ones, zeros = np.ones(10, bool), np.zeros(10, bool)
    # Ten batches an hour apart: each new batch needs a new base; the late batch one below it.
    for k in range(10):
        ts = T0 + 3600.0 * k + np.arange(10) * 0.123457
        store.observe(SampleBatch("a", "m", None, ts, np.arange(1.0, 11.0), ones, zeros))
    late = T0 + 3600.0 * 9 - 1800.0 + np.arange(10) * 0.5
    store.observe(SampleBatch("a", "m", None, late, np.arange(1.0, 11.0), ones, zeros))
    w = store.window("a", "m")
    assert w is not None and w["ts"].size == 100
    newest = T0 + 3600.0 * 9 + np.arange(10) * 0.123457
    assert w["ts"][-20:-10].tolist() == newest.tolist() and w["ts"][-10:].tolist() == late.tolist()
    # The ring spans 9.5 hours: what lies more than 71.6 min before its newest is too old.
    old = w["ts"][:-20]
    assert np.isneginf(old).all()
    (s,) = store.summaries(float(newest[-1]))
    assert s.samples == 10                          # the newest batch (the late one is aged)


def test_a_late_sample_below_the_base_moves_it_down() -> None:
    store = WindowStore(DetectorSettings(window_size=100, max_sample_age_s=3400.0, min_samples=1))
    one = np.ones(1, bool)
    store.observe(SampleBatch("a", "m", None, np.array([T0]), np.array([5.0]), one, ~one))
    early = T0 - 3500.25                             # below the first base (53.7 min under T0)
    store.observe(SampleBatch("a", "m", None, np.array([early]), np.array([7.0]), one, ~one))
    w = store.window("a", "m")
    assert w is not None and w["ts"].tolist() == [T0, early]
    (s,) = store.summaries(T0)
    assert s.samples == 1 and s.p50 == 5.0          # the late one is past the age bound
    store.settings = store.settings.replace(max_sample_age_s=3600.0)
    (s,) = store.summaries(T0)
    assert s.samples == 2


def test_one_sample_older_than_its_ring_spans_is_stored_as_too_old() -> None:
    """A single late sample (a backlog sent after an outage) more than 71.6 min older than its
    series' newest raised OverflowError inside observe(); now it is kept, never judged."""
    store = WindowStore(DetectorSettings(window_size=100, min_samples=1))
    for t in (T0, T0 - 5000.0, T0 - 5000.0 + np.array([0.0, 1.0])):
        ts = np.atleast_1d(t)
        ones, zeros = np.ones(ts.size, bool), np.zeros(ts.size, bool)
        store.observe(SampleBatch("a", "m", None, ts, np.full(ts.size, 1e3), ones, zeros))
    w = store.window("a", "m")
    assert w is not None and w["ts"].size == 4 and np.isneginf(w["ts"][1:]).all()
    (s,) = store.summaries(T0 + 1.0)
    assert s.samples == 1


def test_rings_that_start_or_move_within_the_same_grid_step_share_a_base() -> None:
    """New bases lie on the GRID_US grid: rings started seconds apart get one base, and keep
    sharing one when they all move to a new base (their newest samples minutes later), so stage 1
    compares a block of them to one threshold; every time still decodes as stored."""
    store = WindowStore(DetectorSettings(window_size=100, max_sample_age_s=86_400.0))
    ones, zeros = np.ones(5, bool), np.zeros(5, bool)
    cell = (T0 * 1e6 // tc.GRID_US + 1) * tc.GRID_US / 1e6          # a grid line after T0
    starts = [cell + 1.0 + 7.3 * i for i in range(6)]               # within 45 s of each other
    first_ts = [np.round(t + np.arange(5) * 0.1, 6) for t in starts]   # 6 decimals: exact
    later_ts = []
    for i, ts in enumerate(first_ts):
        store.observe(SampleBatch(f"n{i}", "m", None, ts, np.full(5, 1e4), ones, zeros))
    ch = next(iter(store.tiers.slabs_by_tier.values()))[0]

    def bases() -> set[int]:
        return {int(b) for b, used in zip(ch.base_us, ch.midx >= 0, strict=True) if used}

    (first,) = bases()
    assert first % tc.GRID_US == 0
    later = cell + tc.HEADROOM / 1e6 + 60.0       # past the room above the first base's newest
    for i in range(6):
        later_ts.append(np.round(later + i + np.arange(5) * 0.1, 6))
        store.observe(SampleBatch(f"n{i}", "m", None, later_ts[i], np.full(5, 2e4), ones, zeros))
    (moved,) = bases()
    assert moved > first and moved % tc.GRID_US == 0
    for i in range(6):
        w = store.window(f"n{i}", "m")
        assert w is not None
        assert sorted(w["ts"].tolist()) == sorted(first_ts[i].tolist() + later_ts[i].tolist())
