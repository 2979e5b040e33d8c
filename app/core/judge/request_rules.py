"""The request-count rules of stage 2: error rate and stall, on stage 1's request counters.

Owns :func:`error_judgements` (a pair's failed share of its requests since the last tick, or
pooled over the last ticks up to ``max_sample_age_s`` until ``min_samples`` are in, against
``max_error_share`` and its peers' median share), :func:`stall_judgements` (a routed pair
that completes no request for a tick while it shows signs of life and its peers serve) and
the :class:`ErrorReport` both hand to the evaluator and the guards.

Guarantees: a pair's counters are only read and appended to (``counts``, per pair, oldest
first; a history with the same counters at every kept tick is left as it is, which is what
the append would make of it); counters that go back (a new stage 1) restart the pair's
history, never a verdict; a probe round is judged only on requests since its ejection.
Pure: no clock, no I/O.

Rationale: docs/rules.md (error rate, stall).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, Reason, WindowSummary
from tailguard.core.judge.health import Evidence, Judgement, PairState, Verdict
from tailguard.core.judge.model_state import IrregularCounts, PairTable
from tailguard.core.judge.peers import median
from tailguard.core.window.hist_window import LAST_REQUEST_TS


@dataclass(frozen=True, slots=True)
class ErrorReport:
    """The request-count rules at one tick: abnormal verdicts (reason ``error_rate``, or
    ``stalled``: :func:`stall_judgements`) by node,
    and over the routed, warmed-up pairs with a share this tick: how many are past
    ``max_error_share``, how many there are, and their median share (``ref``; None below
    ``min_peers`` of them: ``peer_shares`` is then None too)."""

    judgements: dict[str, Judgement] = field(default_factory=dict)
    failing: int = 0
    counted: int = 0
    peer_shares: list[float] | None = None

    @property
    def ref(self) -> float | None:
        """The median share of the counted pairs (taken when asked: most ticks nobody does)."""
        return None if self.peer_shares is None else median(self.peer_shares)


STALL_MIN_S = 10.0   # a stall is judged over the last tick, or this long when ticks are shorter


def stall_ticks(st: DetectorSettings) -> int:
    """Over how many past ticks (at least ``STALL_MIN_S``) a pair must have taken no request
    to be stalled: a tick shorter than an emitter's batching is no evidence."""
    return max(1, math.ceil(STALL_MIN_S / st.tick_interval_s - 1e-9))


def pool_ticks(st: DetectorSettings) -> int:
    """Over how many past ticks a pair's requests are pooled: up to ``max_sample_age_s``
    until ``min_samples`` of them are in (a low-rate node)."""
    return max(1, math.ceil(st.max_sample_age_s / st.tick_interval_s))


def error_judgements(counts: MutableMapping[str, list[int]],
                     by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                     st: DetectorSettings, since: Mapping[str, float],
                     now_s: float) -> ErrorReport:
    """The error-rate rule on the failed requests since the last tick, or over the last few
    ticks (up to ``max_sample_age_s``) until ``min_samples`` requests are in; and the stall
    rule on the same counters.

    ``counts``: per pair, stage 1's cumulative (requests, failed) at the last
    ``max(pool_ticks, stall_ticks + 1)`` ticks, oldest first, flat (a list, or an
    :class:`~tailguard.core.judge.model_state.IrregularCounts`); updated for the next tick. ``since``: node
    → a cut-off (the ejection of a pair out of routing): its requests are pooled only over
    ticks at or after it, so a probe round is never judged on failures from before the
    ejection (probes in quarantine before the round still count), and ``probe_min_samples``
    of them suffice, as for its latency."""
    limit = st.max_error_share
    min_n = st.min_samples
    probe_n = min(st.probe_min_samples, min_n)
    pool = pool_ticks(st)
    span = stall_ticks(st)
    keep = 2 * max(pool, span + 1)          # the stall rule's span at least
    get = counts.get
    shares: dict[str, float] = {}           # node -> failed share since the last tick(s)
    over: list[tuple[str, float, int, int, int]] = []   # past the limit: node, share, n, failed, ticks
    tick_s = st.tick_interval_s
    idle: list[str] = []                    # no request at all in the stall rule's span
    reach, back = 2 * pool, 2 * span
    for node, s in by_node.items():
        req = s.requests_total
        fail = s.failed_total
        prev = get(node)
        if prev is None or req < (last := prev[-2]):    # new, or counters that went back
            counts[node] = [req, fail]                  # (a new stage 1)
            continue
        if req == last:                                 # no request since the last tick
            if fail != prev[-1]:
                if type(prev) is list:                  # failed alone: see IrregularCounts
                    counts[node] = prev = IrregularCounts(prev)
            elif (prev[0] == req and prev[1] == fail and len(prev) == keep
                  and type(prev) is list):
                # The same counters at every kept tick (requests never go back, a plain
                # list's failed count never moves alone): idle, no share, and the same
                # history after this tick (oldest tick dropped, this one added): left as is.
                idle.append(node)
                continue
        size = len(prev)
        if req - last >= min_n and type(prev) is list and (not since or since.get(node) is None):
            i = size - 2            # a busy pair: the last tick alone (and so not idle)
        else:
            if size > back and req == prev[-back]:
                idle.append(node)
            # The newest past tick with min_samples requests since, -1 if none; with a cut-off,
            # only ticks since it (the k-th newest entry was recorded k ticks ago), and
            # probe_min_samples suffice. Requests never go back within a pair's history (the
            # even entries are sorted; but see IrregularCounts): the tick is found by
            # bisection, and when even the oldest in reach has fewer since, none has.
            first = size - reach if size > reach else 0
            top = req - min_n
            if since and (cut := since.get(node)) is not None:
                first = max(first, size - 2 * math.floor((now_s - cut) / tick_s + 1e-9))
                top = req - probe_n
            if first <= size - 2 and prev[first] <= top:
                i = (size - 2 if last <= top
                     else first + 2 * (bisect_right(prev[first::2], top) - 1))
            else:
                i = -1
        if i >= 0:
            n = req - prev[i]
            failed = fail - prev[i + 1]
            if 0 <= failed <= n:
                share = shares[node] = failed / n
                if share > limit:
                    over.append((node, share, n, failed, (size - i) // 2))
        # In place: a tuple's copy touched every kept counter (its reference count), each its
        # own int object, cold after stage 1's pass; the list drops its oldest tick in front.
        prev.append(req)
        prev.append(fail)
        if size + 2 > keep:
            del prev[:size + 2 - keep]
    stalled = (stall_judgements(idle, counts, by_node, pairs, st, now_s)
               if idle and st.stall_peer_requests > 0 else {})
    if limit <= 0 or (not shares and st.min_peers > 0):     # (no share: no peer)
        return ErrorReport(stalled)
    return _error_report(stalled, shares, over, by_node, pairs, st)


def _error_report(stalled: dict[str, Judgement], shares: dict[str, float],
                  over: list[tuple[str, float, int, int, int]], by_node: Mapping[str, WindowSummary],
                  pairs: Mapping[str, PairState], st: DetectorSettings) -> ErrorReport:
    """The report of :func:`error_judgements`: its ``shares`` by node and those ``over``
    ``max_error_share`` (node, share, requests, failed, ticks) judged against the peers'."""
    limit = st.max_error_share
    # The peers: pairs routed and past warm-up. Of a PairTable only its rare pairs can be
    # neither; another mapping is asked about each pair.
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


def stall_judgements(idle: Sequence[str], counts: Mapping[str, list[int]],
                     by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                     st: DetectorSettings, now_s: float) -> dict[str, Judgement]:
    """Routed, warmed-up pairs of ``idle`` (no request in the last :func:`stall_ticks`
    ticks) that still show signs of life (a heartbeat or sample within the last tick: a dead
    node goes ``gone`` instead), while the median of such pairs' requests in those ticks
    (``counts``, updated) is at least ``stall_peer_requests`` over ``min_peers`` or more:
    abnormal, reason ``stalled``. ``idle``: as :func:`error_judgements` finds them in
    ``counts`` (nodes of ``by_node``, each once)."""
    rare = pairs.rare if isinstance(pairs, PairTable) else None

    def serving(node: str) -> bool:
        if rare is not None and node not in rare:
            return node in pairs                # healthy and routed
        p = pairs.get(node)
        return p is not None and p.routed and p.state is not HealthState.WARMING

    if rare is not None and not rare:          # every pair healthy and routed
        idle = [n for n in idle if n in pairs]
    else:
        idle = [n for n in idle if (n in pairs if rare is not None and n not in rare
                                    else serving(n))]
    # Each of them is a peer that served 0 requests (never fewer): when they are more than
    # half of all pairs, the peers' median is 0.
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


def _alive_after_requests(s: WindowSummary, last_seen_ts: float) -> bool:
    """A sign of life after the pair's last request: always for a sample pair; for a histogram
    pair, a scrape after its newest interval with requests (its next scrape not in yet is no
    stall: a tick can fall between two scrapes of a node, or after a capture's last one)."""
    last_req = s.extra.get(LAST_REQUEST_TS) if s.extra else None
    return not isinstance(last_req, int | float) or last_seen_ts > last_req


def _window_evidence(s: WindowSummary) -> Evidence:
    """The window's numbers as they are, for a verdict on requests rather than latency."""
    return Evidence(signal=s.signal, p50=s.p50, p99=s.p99,
                    ratio=s.p99 / s.p50 if s.p50 and s.p99 is not None else None,
                    samples=s.samples, latency_p50_us=s.latency_p50_us,
                    latency_p99_us=s.latency_p99_us, hardware=s.hardware)
