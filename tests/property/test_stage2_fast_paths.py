"""Stage 2's fast paths decide exactly as the rules they stand in for.

* :func:`tailguard.core.judge.peers.norms_of` gives the numbers of ``window_norms``, ``fresh_norms``
  and the slow baseline's medians (``update_baseline``), bit for bit;
* :func:`tailguard.core.judge.rules.quiet_below` clears a class only when ``judge`` finds every one of
  its peers normal with no onset severity, and clears one pair only when ``judge`` does;
* :func:`tailguard.core.judge.rules.record_rates` records the rates ``new_fraction`` records;
* :func:`tailguard.core.judge.request_rules.error_judgements` pools each pair's requests from
  the newest past tick with enough of them, as a scan of every tick in reach finds it, and its
  shortcuts for idle and busy pairs decide as its general path.
"""

from __future__ import annotations

import copy
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge import health
from tailguard.core.judge.baseline import fold_baseline, update_baseline
from tailguard.core.judge.health import PairState
from tailguard.core.judge.model_state import IrregularCounts, ModelState
from tailguard.core.judge.peers import (
    Peer,
    fresh_norms,
    gather_peers,
    limits,
    norms_of,
    window_norms,
)
from tailguard.core.judge.request_rules import error_judgements, pool_ticks
from tailguard.core.judge.rules import judge, new_fraction, quiet_below, record_rates

NOW = 1_000_000.0

p50_values = st.one_of(st.floats(1.0, 1e6), st.sampled_from([100.0, 100.0, 200.0, 1e-3]))
ratio_values = st.one_of(st.floats(1.0, 20.0), st.sampled_from([2.0, 2.0, 3.0, 4.5]))
fresh_values = st.one_of(st.none(), st.floats(-1.0, 1e6), st.sampled_from([100.0, 0.0]))
hardware_values = st.sampled_from([None, "", "A100", "A100", "H100"])


@st.composite
def windows(draw: st.DrawFn) -> list[WindowSummary]:
    n = draw(st.integers(1, 40))
    out = []
    for i in range(n):
        p50 = draw(p50_values)
        extra = draw(st.sampled_from([{}, {}, {"judged_since": NOW - 30.0},
                                      {"judged_since": NOW - 1000.0}]))
        out.append(WindowSummary(
            node_id=f"n{i:02d}", model="m", tick_ts=NOW, signal="latency",
            samples=draw(st.sampled_from([100, 300, 499, 500, 501, 1000])), p50=p50,
            p99=p50 * draw(ratio_values), latency_p50_us=p50, latency_p99_us=p50,
            hardware=draw(hardware_values),
            first_seen_ts=draw(st.sampled_from([None, 0.0, NOW - 100.0, NOW - 299.0, NOW])),
            extra=extra, fresh_p50=draw(fresh_values),
            # a fresh P50 of fewer than min_samples samples is judged, never a reference
            fresh_samples=draw(st.sampled_from([100, 150, 150, 25, 99]))))
    return out


def _pairs(ws: list[WindowSummary]) -> dict[str, PairState]:
    return {s.node_id: PairState(s.node_id, "m", HealthState.HEALTHY, 0.0, 0.0, "normal", True)
            for s in ws}


def _state(base_classes: list[str]) -> ModelState:
    ms = ModelState()
    for i, c in enumerate(base_classes):
        ms.baseline_p50[c] = math.log(50.0 + 40.0 * i)
        ms.baseline_ticks[c] = 3 + i
    return ms


@settings(max_examples=150, deadline=None)
@given(windows(), st.sampled_from([[], [""], ["A100"], ["A100", "H100", ""]]),
       st.integers(2, 5))
def test_norms_of_matches_the_rules_functions(ws: list[WindowSummary], base: list[str],
                                              min_peers: int) -> None:
    st_ = DetectorSettings(min_peers=min_peers, min_samples=100)
    ms = _state(base)
    ps = gather_peers({s.node_id: s for s in ws}, _pairs(ws), st_.min_samples)
    peers = list(ps)
    pn = norms_of(ps, ms.baseline_p50, ms.baseline_ticks, st_)
    assert repr(pn.window) == repr(window_norms(peers, ms.baseline_p50, ms.baseline_ticks, st_))
    assert repr(pn.fresh) == repr(fresh_norms(peers, ms.baseline_p50, ms.baseline_ticks, st_))
    a, b = copy.deepcopy(ms), copy.deepcopy(ms)
    update_baseline(a, peers, NOW, st_)
    assert pn.ratio is not None
    fold_baseline(b, pn.class_p50, pn.ratio, NOW, st_)
    assert repr(a.to_dict()) == repr(b.to_dict())


@settings(max_examples=150, deadline=None)
@given(windows(), st.sampled_from([0.0, 1.5, 3.0]), st.floats(1.5, 4.0))
def test_quiet_below_only_when_judge_is_quiet(ws: list[WindowSummary], shift: float,
                                              threshold: float) -> None:
    st_ = DetectorSettings(min_peers=2, min_samples=100, shift_factor=shift,
                           ratio_threshold=threshold)
    ps = gather_peers({s.node_id: s for s in ws}, _pairs(ws), st_.min_samples)
    pn = norms_of(ps, {}, {}, st_)
    norms = pn.window
    for peer in ps:
        s = peer.summary
        lim = limits(norms, pn.fresh, s.hardware, st_)
        j = judge(s, peer.p50, peer.ratio, s.samples, norms, st_, tail=s.samples >= 500,
                  fresh=pn.fresh, lim=lim)
        if quiet_below(peer.p50, peer.ratio, peer.p50 * peer.ratio, s.fresh_p50, norms, lim, st_):
            assert j is health.NORMAL
        for c, top in pn.top.items():
            if c == (s.hardware or "") and quiet_below(*top, norms, lim, st_):
                assert j is health.NORMAL


@settings(max_examples=150, deadline=None)
@given(windows(), st.sampled_from([{}, {"n00": 50.0, "n01": 0.5}]))
def test_record_rates_records_what_new_fraction_records(ws: list[WindowSummary],
                                                        before: dict[str, float]) -> None:
    st_ = DetectorSettings()
    a, b = dict(before), dict(before)
    for s in ws:
        new_fraction(a, {}, s.node_id, s, NOW, st_)
    record_rates(b, ((s.node_id, s) for s in ws), NOW, st_)
    assert repr(sorted(a.items())) == repr(sorted(b.items()))


def test_peer_set_is_the_peers() -> None:
    s = WindowSummary(node_id="a", model="m", tick_ts=NOW, signal="latency", samples=200,
                      p50=10.0, p99=30.0, latency_p50_us=10.0, latency_p99_us=30.0)
    ps = gather_peers({"a": s}, _pairs([s]), 100)
    assert ps[0] == Peer("a", s, 10.0, 3.0)
    assert list(ps) == [Peer("a", s, 10.0, 3.0)] and len(ps) == 1
    assert ps[0:1] == [Peer("a", s, 10.0, 3.0)]


@st.composite
def request_histories(draw: st.DrawFn) -> tuple[list[list[tuple[int, int]]], dict[str, float]]:
    """Per node, cumulative (requests, failed) at each of a few ticks (a counter may restart),
    and cut-offs (seconds before the last tick) for some nodes."""
    nodes = draw(st.integers(2, 6))
    ticks = draw(st.integers(1, 16))
    out = []
    for _ in range(nodes):
        req = fail = 0
        hist = []
        for _ in range(ticks):
            if draw(st.integers(0, 20)) == 0:
                req = fail = 0                                  # a new stage 1
            n = draw(st.sampled_from([0, 0, 5, 20, 60, 100, 150]))
            req, fail = req + n, fail + draw(st.integers(0, n))
            hist.append((req, fail))
        out.append(hist)
    cuts = {f"n{i}": draw(st.sampled_from([0.0, 29.0, 30.0, 95.0, 400.0]))
            for i in range(nodes) if draw(st.booleans())}
    return out, cuts


def _scanned_shares(hists: list[list[tuple[int, int]]], cuts: dict[str, float],
                    st_: DetectorSettings, now_s: float) -> list[float]:
    """The rule's failed shares, each found by looking at every past tick in reach."""
    shares = []
    for i, hist in enumerate(hists):
        start = max(k for k in range(len(hist)) if k == 0 or hist[k][0] < hist[k - 1][0])
        req, fail = hist[-1]
        reach, need = pool_ticks(st_), st_.min_samples
        if f"n{i}" in cuts:
            reach = min(reach, math.floor(cuts[f"n{i}"] / st_.tick_interval_s + 1e-9))
            need = min(st_.probe_min_samples, need)
        past = [hist[k] for k in range(max(start, len(hist) - 1 - reach), len(hist) - 1)]
        for r, f in reversed(past):
            if req - r >= need:
                if 0 <= fail - f <= req - r:
                    shares.append((fail - f) / (req - r))
                break
    return shares


@settings(max_examples=200, deadline=None)
@given(request_histories())
def test_error_judgements_pools_as_a_scan_of_every_tick(case: tuple[list[list[tuple[int, int]]],
                                                                    dict[str, float]]) -> None:
    hists, cuts = case
    st_ = DetectorSettings(min_peers=2, min_samples=100, probe_min_samples=20, tick_interval_s=30.0)
    counts: dict[str, list[int]] = {}
    pairs = {f"n{i}": PairState(f"n{i}", "m", HealthState.HEALTHY, 0.0, 0.0, "normal", True)
             for i in range(len(hists))}
    report = None
    for k in range(len(hists[0])):
        now_s = NOW + 30.0 * k
        by_node = {f"n{i}": WindowSummary(
            node_id=f"n{i}", model="m", tick_ts=now_s, signal="latency", samples=0, p50=None,
            p99=None, latency_p50_us=None, latency_p99_us=None, requests_total=h[k][0],
            failed_total=h[k][1]) for i, h in enumerate(hists)}
        since = {n: now_s - back for n, back in cuts.items()}
        report = error_judgements(counts, by_node, pairs, st_, since, now_s)
    assert report is not None
    expected = _scanned_shares(hists, cuts, st_, NOW + 30.0 * (len(hists[0]) - 1))
    assert report.peer_shares == (expected if len(expected) >= 2 else None)


@st.composite
def irregular_histories(draw: st.DrawFn) -> list[list[tuple[int, int]]]:
    """Per node, (requests, failed) at each tick: idle, busy and low-rate spells, counters
    that restart (a new stage 1) and failed counts that move either way while requests do not."""
    nodes, ticks = draw(st.integers(2, 6)), draw(st.integers(2, 20))
    out = []
    for _ in range(nodes):
        req, fail, hist = 0, 0, []
        for _ in range(ticks):
            if draw(st.integers(0, 15)) == 0:
                req = fail = 0                                  # a new stage 1
            n = draw(st.sampled_from([0, 0, 0, 1, 20, 100, 150]))
            # failed moving alone, either way (down: a new stage 1 with as many requests)
            moved = draw(st.sampled_from([0, 0, 0, 1, -1])) if n == 0 else draw(st.integers(0, n))
            req, fail = req + n, max(0, fail + moved)
            hist.append((req, fail))
        out.append(hist)
    return out


def _as_general(counts: dict[str, list[int]]) -> dict[str, list[int]]:
    """The same counters, each an IrregularCounts: every pair takes the general path."""
    return {n: IrregularCounts(c) for n, c in counts.items()}


@settings(max_examples=200, deadline=None)
@given(irregular_histories(), st.sampled_from([60.0, 90.0, 300.0]), st.sampled_from([0, 1, 20]),
       st.sampled_from([0.0, 0.1]))
def test_error_judgements_shortcuts_decide_as_the_general_path(
        hists: list[list[tuple[int, int]]], max_age_s: float, stall_peer_requests: int,
        max_share: float) -> None:
    """The idle and busy shortcuts (plain lists) give the reports and counters that the general
    path gives on the same histories (every list an IrregularCounts, as a restored history
    whose counters the shortcuts cannot vouch for)."""
    st_ = DetectorSettings(min_peers=2, min_samples=100, probe_min_samples=20, tick_interval_s=30.0,
                           max_sample_age_s=max_age_s, stall_peer_requests=stall_peer_requests,
                           max_error_share=max_share)
    pairs = {f"n{i}": PairState(f"n{i}", "m", HealthState.HEALTHY, 0.0, 0.0, "normal", True)
             for i in range(len(hists))}
    fast: dict[str, list[int]] = {}
    general: dict[str, list[int]] = {}
    for k in range(len(hists[0])):
        now_s = NOW + 30.0 * k
        by_node = {f"n{i}": WindowSummary(
            node_id=f"n{i}", model="m", tick_ts=now_s, signal="latency", samples=0, p50=None,
            p99=None, latency_p50_us=None, latency_p99_us=None, requests_total=h[k][0],
            failed_total=h[k][1], last_seen_ts=now_s) for i, h in enumerate(hists)}
        general = _as_general(general)
        got = error_judgements(fast, by_node, pairs, st_, {}, now_s)
        want = error_judgements(general, by_node, pairs, st_, {}, now_s)
        assert {n: list(c) for n, c in fast.items()} == {n: list(c) for n, c in general.items()}
        assert (got.failing, got.counted, got.peer_shares) == (want.failing, want.counted,
                                                               want.peer_shares)
        assert {n: (j.verdict, j.reason) for n, j in got.judgements.items()} == {
            n: (j.verdict, j.reason) for n, j in want.judgements.items()}
