"""Stage 2's per-model shortcuts decide exactly as the general path they skip.

* :func:`tailguard.core.judge.verdicts.judge_peers` leaves a peer whose fresh-tail count the rule
  cannot judge (:func:`tailguard.core.judge.rules.fresh_tail_judged`) on the quiet path: the same
  verdicts, onset credits, load-event count and recorded rates as judging it by every rule;
* :func:`tailguard.core.judge.peers.gather_peers` gives the positions of the peers with a
  fresh-tail count (``PeerSet.fresh_over_at``), whichever way it gathers them, and the same
  peers from the pairs' streak index (``PairTable.streaked``) as from reading every pair.
"""

from __future__ import annotations

import copy
import dataclasses
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, Reason, WindowSummary
from tailguard.core.judge import verdicts
from tailguard.core.judge.health import Judgement, PairState, Verdict
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.peers import gather_peers, norms_of
from tailguard.core.judge.request_rules import ErrorReport

NOW = 1_000_000.0


@st.composite
def model_tick(draw: st.DrawFn) -> tuple[list[WindowSummary], ModelState]:
    """A model's windows (some with fresh-tail counts, large and small) and its state (some
    pairs unsettled, some rates and streak clocks on record)."""
    n = draw(st.integers(1, 30))
    hardware = draw(st.sampled_from([[None], ["A100"], ["A100", "H100"]]))
    # Mostly a quiet class (its largest values quiet: judge_peers' shortcut for the class).
    slow = draw(st.sampled_from([[], [], [400.0]]))
    wide = draw(st.sampled_from([[], [], [6.0]]))
    ws = []
    ms = ModelState()
    for i in range(n):
        node = f"n{i:02d}"
        p50 = draw(st.sampled_from([100.0, 100.0, 110.0, 95.0, *slow]))
        fresh_samples = draw(st.sampled_from([0, 20, 59, 60, 100, 150]))
        over = draw(st.one_of(st.none(), st.integers(0, 3), st.integers(0, fresh_samples)))
        ws.append(WindowSummary(
            node_id=node, model="m", tick_ts=NOW, signal="latency",
            samples=draw(st.sampled_from([300, 600, 1000])), p50=p50,
            p99=p50 * draw(st.sampled_from([2.0, 2.0, 2.5, *wide])), latency_p50_us=p50,
            latency_p99_us=p50, hardware=draw(st.sampled_from(hardware)),
            first_seen_ts=NOW - 5000.0, fresh_samples=fresh_samples,
            fresh_p50=draw(st.sampled_from([None, p50, 1.2 * p50])), fresh_over=over))
        streak = draw(st.sampled_from([0, 0, 1, 2]))
        ms.pairs[node] = PairState(node, "m", HealthState.SUSPECT if streak else HealthState.HEALTHY,
                                   0.0, 0.0, "normal", True, abnormal_streak=streak,
                                   fault="p99_p50_ratio" if streak else None)
        if draw(st.booleans()):
            ms.rate_per_s[node] = draw(st.sampled_from([0.5, 3.0, 50.0]))
        if streak and draw(st.booleans()):
            ms.advanced_ts[node] = NOW - 30.0
    return ws, ms


@settings(max_examples=200, deadline=None)
@given(model_tick(), st.integers(2, 5), st.booleans(), st.sets(st.integers(0, 29), max_size=3))
def test_unjudged_fresh_tail_counts_stay_quiet(case: tuple[list[WindowSummary], ModelState],
                                               min_peers: int, with_baseline: bool,
                                               failing: set[int]) -> None:
    ws, ms = case
    errors = ErrorReport({f"n{i:02d}": Judgement(Verdict.ABNORMAL, Reason.ERROR_RATE.value,
                                                 severity=2.0) for i in failing})
    st_ = DetectorSettings(min_peers=min_peers, min_samples=100)
    if with_baseline:
        ms.baseline_p50[""] = ms.baseline_p50["A100"] = 4.5
        ms.baseline_ratio = 0.7
    ps = gather_peers({s.node_id: s for s in ws}, ms.pairs, st_.min_samples)
    pn = norms_of(ps, ms.baseline_p50, ms.baseline_ticks, st_)
    own = None if pn.window.enough_peers else dict(zip(ps.nodes, ps.p50s, strict=True))
    fast, general = copy.deepcopy(ms), copy.deepcopy(ms)
    got = verdicts.judge_peers(st_, fast, ps, pn, errors, NOW, own)
    # The general path: every pair with a fresh-tail count judged by every rule.
    with mock.patch.object(verdicts, "fresh_tail_judged", lambda s: True):
        want = verdicts.judge_peers(st_, general, ps, pn, errors, NOW, own)
    # (the verdicts' order is not kept: every reader sorts or looks up)
    assert repr(sorted(got.judgements.items())) == repr(sorted(want.judgements.items()))
    assert repr((got.elevated, got.abnormal)) == repr((want.elevated, want.abnormal))
    assert repr(fast.to_dict()) == repr(general.to_dict())


@settings(max_examples=150, deadline=None)
@given(model_tick(), st.lists(st.sampled_from(["latency", "latency", "tpot"]), min_size=30,
                              max_size=30), st.booleans())
def test_fresh_over_positions_are_the_counted_peers(case: tuple[list[WindowSummary], ModelState],
                                                    signals: list[str], settled: bool) -> None:
    """Column by column (all settled) or pair by pair (some signal apart: the majority's)."""
    ws, ms = case
    if not settled:
        ws = [s._replace(signal=signals[i]) for i, s in enumerate(ws)]
    ps = gather_peers({s.node_id: s for s in ws}, ms.pairs, 100, ms.pairs.rare)
    assert [ps.nodes[i] for i in ps.fresh_over_at] == [
        n for n, s in zip(ps.nodes, ps.summaries, strict=True) if s.fresh_over]
    assert len(ps.nodes) == len(ps.summaries) and all(
        s.node_id == n for n, s in zip(ps.nodes, ps.summaries, strict=True))


@settings(max_examples=150, deadline=None)
@given(model_tick(), st.sampled_from([1, 3]))
def test_streak_index_gathers_the_same_peers(case: tuple[list[WindowSummary], ModelState],
                                             every: int) -> None:
    """``PairTable.streaked`` in place of reading every pair: the same peers, unsettled ones
    included (a healthy pair may have a streak too)."""
    ws, ms = case
    for node in list(ms.pairs)[::every]:      # healthy pairs with a streak (all: column by column)
        ms.pairs[node] = dataclasses.replace(ms.pairs[node], state=HealthState.HEALTHY)
    by_node = {s.node_id: s for s in ws}
    if by_node.keys().isdisjoint(ms.pairs.rare):
        assert ms.pairs.streaked == {n for n, p in ms.pairs.items() if p.abnormal_streak}
    got = gather_peers(by_node, ms.pairs, 100, ms.pairs.rare, ms.pairs.streaked)
    want = gather_peers(by_node, dict(ms.pairs), 100)
    assert (got.nodes, got.summaries, got.p50s, got.ratios, got.unsettled, got.fresh_over_at) == (
        want.nodes, want.summaries, want.p50s, want.ratios, want.unsettled, want.fresh_over_at)
