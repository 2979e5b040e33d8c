"""The error-rate and stall rules on the request counters as arrays
(:class:`tailguard.core.judge.request_counts.RequestCounts`) decide exactly as the
straightforward per-pair form they replaced (kept here: a list of counters per pair, a loop
over the pairs, a bisection), and keep the same counters: over random tick sequences
(pairs coming, going and coming back, in any order; counters that go back; cut-offs; idle
and busy stretches; any settings), each tick's report (verdicts with their text, peers'
shares, counts) and the counters' snapshot form are equal, also across a snapshot and
restore (also of longer histories), a forgotten pair, and a plain dict of lists handed in place
of the arrays."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, MutableMapping, Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, Reason, WindowSummary
from tailguard.core.judge.health import Judgement, PairState, Verdict
from tailguard.core.judge.model_state import PairTable
from tailguard.core.judge.peers import median
from tailguard.core.judge.request_counts import RequestCounts
from tailguard.core.judge.request_rules import (
    ErrorReport,
    _alive_after_requests,
    _window_evidence,
    error_judgements,
    pool_ticks,
    stall_ticks,
)
from tailguard.core.window.hist_window import LAST_REQUEST_TS

T0 = 1_764_680_000.0


def reference(counts: MutableMapping[str, list[int]], by_node: Mapping[str, WindowSummary],
              pairs: Mapping[str, PairState], st: DetectorSettings, since: Mapping[str, float],
              now_s: float) -> ErrorReport:
    """``error_judgements`` as it was before the arrays (main at d2d10e5)."""
    limit = st.max_error_share
    min_n = st.min_samples
    probe_n = min(st.probe_min_samples, min_n)
    pool = pool_ticks(st)
    span = stall_ticks(st)
    keep = 2 * max(pool, span + 1)
    get = counts.get
    shares: dict[str, float] = {}
    over: list[tuple[str, float, int, int, int]] = []
    tick_s = st.tick_interval_s
    idle: list[str] = []
    reach, back = 2 * pool, 2 * span
    for node, s in by_node.items():
        req = s.requests_total
        fail = s.failed_total
        prev = get(node)
        if prev is None or req < prev[-2]:
            counts[node] = [req, fail]
            continue
        size = len(prev)
        if size > back and req == prev[-back]:
            idle.append(node)
        first = size - reach if size > reach else 0
        need = min_n
        if since and (cut := since.get(node)) is not None:
            first = max(first, size - 2 * math.floor((now_s - cut) / tick_s + 1e-9))
            need = probe_n
        top = req - need
        if first <= size - 2 and prev[first] <= top:
            i = (size - 2 if prev[-2] <= top
                 else first + 2 * (bisect_right(prev[first::2], top) - 1))
            n = req - prev[i]
            failed = fail - prev[i + 1]
            if 0 <= failed <= n:
                share = shares[node] = failed / n
                if share > limit:
                    over.append((node, share, n, failed, (size - i) // 2))
        prev.append(req)
        prev.append(fail)
        if size + 2 > keep:
            del prev[:size + 2 - keep]
    stalled = (reference_stall(idle, counts, by_node, pairs, st, now_s)
               if idle and st.stall_peer_requests > 0 else {})
    if limit <= 0:
        return ErrorReport(stalled)
    if isinstance(pairs, PairTable) and shares.keys() <= pairs.keys():
        drop = {n for n in pairs.rare if n in shares
                and (not (p := pairs[n]).routed or p.state is HealthState.WARMING)}
    else:
        drop = {n for n in shares if (q := pairs.get(n)) is None or not q.routed
                or q.state is HealthState.WARMING}
    peers = list(shares.values()) if not drop else [sh for n, sh in shares.items() if n not in drop]
    failing = sum(1 for node, *_ in over if node not in drop)
    report = ErrorReport(stalled, failing, len(peers), peers if len(peers) >= st.min_peers else None)
    if not over:
        return report
    ref = report.ref
    factor = st.error_share_peer_factor
    out = report.judgements
    for node, share, n, failed, ticks in over:
        if ref is not None and share <= factor * ref:
            continue
        peers_part = "" if ref is None else f" and > {factor:g} x peers' {ref:.1%}"
        out[node] = Judgement(Verdict.ABNORMAL, Reason.ERROR_RATE.value,
                              _window_evidence(by_node[node]), share / limit,
                              f"{failed} of {n} requests since the last "
                              f"{'tick' if ticks == 1 else f'{ticks} ticks'} failed "
                              f"({share:.1%} > {limit:.0%}{peers_part})")
    return report


def reference_stall(idle: Sequence[str], counts: Mapping[str, list[int]],
                    by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                    st: DetectorSettings, now_s: float) -> dict[str, Judgement]:
    """``stall_judgements`` as it was before the arrays (main at d2d10e5)."""
    rare = pairs.rare if isinstance(pairs, PairTable) else None

    def serving(node: str) -> bool:
        if rare is not None and node not in rare:
            return node in pairs
        p = pairs.get(node)
        return p is not None and p.routed and p.state is not HealthState.WARMING

    idle = [n for n in idle if (n in pairs if rare is not None and n not in rare
                                else serving(n))]
    if not idle or (2 * len(idle) > len(by_node) and st.stall_peer_requests > 0):
        return {}
    span = stall_ticks(st)
    back = -2 - 2 * span
    get = counts.get
    served = [c[-2] - c[back] for n in by_node if (c := get(n)) is not None
              and len(c) > 2 * span and (n in pairs if rare is not None and n not in rare
                                         else serving(n))]
    if len(served) < st.min_peers:
        return {}
    ref = median(served)
    if ref < st.stall_peer_requests:
        return {}
    idle = [n for n in idle if (last := by_node[n].last_seen_ts) is not None
            and now_s - last <= st.tick_interval_s and _alive_after_requests(by_node[n], last)]
    out: dict[str, Judgement] = {}
    for node in idle:
        out[node] = Judgement(Verdict.ABNORMAL, Reason.STALLED.value, _window_evidence(by_node[node]),
                              ref / st.stall_peer_requests,
                              f"no request completed in the last {span * st.tick_interval_s:g} s, "
                              f"while its {len(served)} peers completed {ref:g} each (median; "
                              f"stall_peer_requests={st.stall_peer_requests})")
    return out


SETTINGS = st.builds(
    DetectorSettings,
    tick_interval_s=st.sampled_from([5.0, 10.0, 30.0, 60.0, 400.0]),
    max_sample_age_s=st.sampled_from([30.0, 60.0, 90.0, 300.0]),
    min_samples=st.sampled_from([1, 5, 20, 100]),
    probe_min_samples=st.sampled_from([1, 3, 20]),
    min_peers=st.sampled_from([2, 3]),
    stall_peer_requests=st.sampled_from([0, 1, 20]),
    max_error_share=st.sampled_from([0.0, 0.1, 0.1, 0.5]),
    error_share_peer_factor=st.sampled_from([1.5, 2.0]),
)
PAIR_KINDS = ["healthy", "healthy", "healthy", "unrouted", "warming", "suspect", "absent"]
# Per node and tick: what happens to its counters (requests, failed added).
STEPS = st.sampled_from(["idle", "idle", "busy", "busy", "busy", "trickle", "reset", "gone",
                         "failing", "back"])
OPS = st.sampled_from(["tick", "tick", "tick", "tick", "restore", "longer", "forget", "shuffle",
                       "settings"])


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[DetectorSettings], int, list[tuple[str, list[str]]],
                                        list[str], dict[int, float], bool]:
    cfg = [draw(SETTINGS), draw(SETTINGS)]
    nodes = draw(st.integers(1, 9))
    ticks = draw(st.integers(1, 30))
    usual = [draw(STEPS) for _ in range(nodes)]         # each node's habit, now and then broken
    ops = [(draw(OPS), [u if draw(st.integers(0, 4)) else draw(STEPS) for u in usual])
           for _ in range(ticks)]
    kinds = [draw(st.sampled_from(PAIR_KINDS)) for _ in range(nodes)]
    cuts = {i: draw(st.sampled_from([0.0, 1.0, 29.0, 30.0, 95.0, 400.0, -30.0, 1e9]))
            for i in range(nodes) if draw(st.integers(0, 3)) == 0}
    return cfg, nodes, ops, kinds, cuts, draw(st.booleans())


def _pairs(kinds: list[str], table: bool) -> Mapping[str, PairState]:
    out: dict[str, PairState] = {}
    for i, kind in enumerate(kinds):
        if kind == "absent":
            continue
        state = {"warming": HealthState.WARMING, "suspect": HealthState.SUSPECT,
                 "unrouted": HealthState.QUARANTINED}.get(kind, HealthState.HEALTHY)
        out[f"n{i}"] = PairState(f"n{i}", "m", state, T0, T0, "normal", kind != "unrouted")
    return PairTable(out) if table else out


def _summary(node: str, now_s: float, req: int, fail: int, alive: int) -> WindowSummary:
    return WindowSummary(
        node_id=node, model="m", tick_ts=now_s, signal="latency", samples=0, p50=None, p99=None,
        latency_p50_us=None, latency_p99_us=None, requests_total=req, failed_total=fail,
        last_seen_ts=(None, now_s - 1.0, now_s - 1000.0)[alive % 3],
        extra={LAST_REQUEST_TS: now_s - 5.0} if alive % 4 == 3 else {})


def _step(kind: str, req: int, fail: int, k: int) -> tuple[int, int]:
    if kind == "busy":
        n = 100 + 37 * (k % 5)
        return req + n, fail + (k % 7) * n // 40
    if kind == "trickle":
        return req + 3 + k % 4, fail + k % 2
    if kind == "failing":
        return req + 50, fail + 30
    if kind == "reset":
        return k % 3 * 7, k % 3
    if kind == "back":                      # failed past requests: no share
        return req + 2, fail + 5
    return req, fail


@settings(max_examples=300, deadline=None)
@given(scenarios())
# Most pairs idle, but the warming ones are no peers: the rest may still stall.
@example(([DetectorSettings(min_peers=2)] * 2, 5, [("tick", ["idle"] * 3 + ["busy"] * 2)] * 6,
          ["warming", "warming", "healthy", "healthy", "healthy"], {}, True))
# Fewer ticks kept from a tick on (other settings), one pair absent meanwhile.
@example(([DetectorSettings(min_peers=2), DetectorSettings(min_peers=2, max_sample_age_s=30.0)],
          2, [("tick", ["trickle"] * 2)] * 4 + [("settings", ["trickle", "gone"]),
                                                 ("tick", ["trickle"] * 2)],
          ["healthy"] * 2, {}, True))
# The same nodes in another order, holding different numbers of ticks.
@example(([DetectorSettings(min_peers=2)] * 2, 3,
          [("tick", ["busy"] * 3), ("tick", ["busy", "reset", "busy"]), ("shuffle", ["busy"] * 3),
           ("tick", ["trickle"] * 3)], ["healthy"] * 3, {}, True))
def test_the_arrays_decide_and_keep_what_the_per_pair_lists_did(
        case: tuple[list[DetectorSettings], int, list[tuple[str, list[str]]], list[str],
                    dict[int, float], bool]) -> None:
    configs, nodes, ops, kinds, cuts, table = case
    cfg = configs[0]
    pairs = _pairs(kinds, table)
    lists: dict[str, list[int]] = {}
    arrays = RequestCounts()
    totals = [(0, 0)] * nodes
    order = list(range(nodes))
    now_s = T0
    for k, (op, steps) in enumerate(ops):
        if op == "restore":
            arrays = RequestCounts.from_lists(arrays.to_lists())
        elif op == "longer":                # a snapshot kept under longer settings
            lists = {n: v[:2] * 3 + v for n, v in lists.items()}
            arrays = RequestCounts.from_lists(lists)
            assert arrays.to_lists() == dict(sorted(lists.items()))
        elif op == "forget" and lists:
            node = sorted(lists)[k % len(lists)]
            lists.pop(node)
            arrays.drop(node)
        elif op == "shuffle":
            order = order[k % nodes:] + order[:k % nodes]
        elif op == "settings":              # other settings: more or fewer ticks kept
            cfg = configs[1] if cfg is configs[0] else configs[0]
        now_s += cfg.tick_interval_s
        by_node = {}
        for i in order:
            if steps[i] == "gone":
                continue
            totals[i] = _step(steps[i], *totals[i], k + i)
            by_node[f"n{i}"] = _summary(f"n{i}", now_s, *totals[i], k + i)
        since = {f"n{i}": now_s - back for i, back in cuts.items()}
        want = reference(lists, by_node, pairs, cfg, since, now_s)
        got = error_judgements(arrays, by_node, pairs, cfg, since, now_s)
        assert got == want, (k, op)
        assert list(got.judgements) == list(want.judgements)
        assert arrays.to_lists() == dict(sorted(lists.items())), k
    # The snapshot form handed in place of the arrays: read, then written back.
    again = {n: list(v) for n, v in lists.items()}
    now_s += cfg.tick_interval_s
    by_node = {f"n{i}": _summary(f"n{i}", now_s, *totals[i], i) for i in order}
    since = {f"n{i}": now_s - back for i, back in cuts.items()}
    assert (error_judgements(again, by_node, pairs, cfg, since, now_s)
            == reference(lists, by_node, pairs, cfg, since, now_s))
    assert again == lists
