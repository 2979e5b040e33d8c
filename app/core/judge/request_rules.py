"""The request-count rules of stage 2: error rate and stall, on stage 1's request counters.

Owns :func:`error_judgements` (a pair's failed share of its requests since the last tick, or
pooled over the last ticks up to ``max_sample_age_s`` until ``min_samples`` are in, against
``max_error_share`` and its peers' median share), :func:`stall_judgements` (a routed pair
that completes no request for a tick while it shows signs of life and its peers serve) and
the :class:`ErrorReport` both hand to the evaluator and the guards.

Guarantees: a pair's counters are only appended to (``counts``: a
:class:`~tailguard.core.judge.request_counts.RequestCounts`, whose snapshot form is per pair,
oldest first); counters that go back (a new stage 1) restart the pair's history, never a
verdict; a probe round is judged only on requests since its ejection. A tick takes the model's
pairs together, a few numpy calls on all of them. Pure: no clock, no I/O.

Rationale: docs/rules.md (error rate, stall).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, Reason, WindowSummary
from tailguard.core.judge.health import Evidence, Judgement, PairState, Verdict
from tailguard.core.judge.model_state import PairTable
from tailguard.core.judge.peers import median
from tailguard.core.judge.request_counts import I64, Bools, RequestCounts
from tailguard.core.window.hist_window import LAST_REQUEST_TS

F64 = npt.NDArray[np.float64]
_REQUESTS, _FAILED = attrgetter("requests_total"), attrgetter("failed_total")
_NONE: I64 = np.zeros(0, np.int64)
# The reductions themselves: the array methods add a Python call each.
_least, _most, _every, _total = (np.minimum.reduce, np.maximum.reduce, np.logical_and.reduce,
                                 np.add.reduce)


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


def error_judgements(counts: RequestCounts | MutableMapping[str, list[int]],
                     by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                     st: DetectorSettings, since: Mapping[str, float],
                     now_s: float) -> ErrorReport:
    """The error-rate rule on the failed requests since the last tick, or over the last few
    ticks (up to ``max_sample_age_s``) until ``min_samples`` requests are in; and the stall
    rule on the same counters.

    ``counts``: per pair, stage 1's cumulative (requests, failed) at the last
    ``max(pool_ticks, stall_ticks + 1)`` ticks it was in, updated for the next tick (a plain
    mapping holds them in the snapshot form: flat, oldest first). ``since``: node → a cut-off
    (the ejection of a pair out of routing): its requests are pooled only over ticks at or
    after it, so a probe round is never judged on failures from before the ejection (probes
    in quarantine before the round still count), and ``probe_min_samples`` of them suffice,
    as for its latency."""
    if not isinstance(counts, RequestCounts):
        kept = RequestCounts.from_lists(counts)
        report = error_judgements(kept, by_node, pairs, st, since, now_s)
        counts.clear()
        counts.update(kept.to_lists())
        return report
    span = stall_ticks(st)
    cols = max(pool_ticks(st), span + 1)    # the stall rule's span at least
    keys = list(by_node)
    n = len(keys)
    if not n:
        return ErrorReport()
    cur, last, held, new = counts.begin(keys, cols)
    # Few numpy calls, each on all of the model's pairs: a call costs more than 100 pairs'
    # arithmetic. The common ticks (every pair busy; pairs idle or quiet) take the fewest.
    cur[:, 0] = np.fromiter(map(_REQUESTS, by_node.values()), np.int64, n)
    cur[:, 1] = np.fromiter(map(_FAILED, by_node.values()), np.int64, n)
    grew = cur - last                       # since the last tick held: (requests, failed)
    low = int(_least(grew[:, 0]))
    restart: Bools | None = None
    idle: Bools | None = None
    rows: I64 | None = None
    ticks: I64 | int = 1
    if not (new or since) and low >= st.min_samples:
        # Every pair busy: each judged on its last tick alone; none went back, none idle.
        n_req, n_fail = grew[:, 0], grew[:, 1]
    else:
        if low < 0 or new:
            restart = grew[:, 0] < 0        # counters that went back (a new stage 1)
            restart[new] = True
        if counts.capacity > span:          # no request since the tick ``span`` ticks ago
            idle = cur[:, 0] == counts.ago(span)[:, 0]
            if not counts.full:
                idle &= held > span
            if restart is not None:
                idle &= ~restart
        rows, n_req, n_fail, ticks = _pooled(counts, held, cur, restart, st, since, now_s)
    if len(n_req):
        # A share where 0 <= failed <= requests (at least one): as unsigned, a negative
        # count is above any.
        ok = n_fail.view(np.uint64) <= n_req.view(np.uint64)
        if not _every(ok):
            n_req, n_fail = n_req[ok], n_fail[ok]
            rows = ok.nonzero()[0] if rows is None else rows[ok]
            if not isinstance(ticks, int):
                ticks = ticks[ok]
    counts.advance(restart)
    known = _all_in_table(counts, by_node, pairs)
    stalled: dict[str, Judgement] = {}
    if idle is not None and st.stall_peer_requests > 0 and (k := int(_total(idle))):
        quiet = keys if k == n else list(compress(keys, idle.tolist()))
        stalled = stall_judgements(quiet, counts, by_node, pairs, st, now_s, known=known)
    if st.max_error_share <= 0:
        return ErrorReport(stalled)
    if not len(n_req):
        return ErrorReport(stalled)         # no share: fewer than min_peers (at least 2)
    return _error_report(stalled, keys, rows, n_fail / n_req, n_req, n_fail, ticks, counts,
                         by_node, pairs, st, known)


def _all_in_table(counts: RequestCounts, by_node: Mapping[str, WindowSummary],
                  pairs: Mapping[str, PairState]) -> bool:
    """Whether ``pairs`` is a PairTable holding every node of ``by_node`` (the rows of
    ``counts``): looked up only after the table's pairs or the rows change (the table keeps
    its routing set until a pair comes, goes or changes its routing)."""
    if not isinstance(pairs, PairTable):
        return False
    token = pairs.routing()
    if counts.checked is token:
        return True
    if by_node.keys() <= pairs.keys():
        counts.checked = token
        return True
    return False


def _pooled(counts: RequestCounts, held: I64, cur: I64, restart: Bools | None,
            st: DetectorSettings, since: Mapping[str, float],
            now_s: float) -> tuple[I64 | None, I64, I64, I64 | int]:
    """Of the pairs not restarting: the rows of those with a tick to pool from, and their
    requests, failed requests and ticks since it. That tick is the newest past one with
    ``need`` requests since (the last tick at any rate above min_samples per tick), of the
    last ``pool_ticks`` held; with a cut-off, of those since it (the k-th newest was recorded
    k ticks ago)."""
    pool = pool_ticks(st)
    w = min(counts.capacity, pool)
    req = cur[:, 0]
    need: int | I64 = st.min_samples
    if not since and counts.full and restart is None:
        # Each row holds all ``w`` ticks in reach: none has enough requests since any of
        # them when none has since the oldest.
        if int(_most(req - counts.ago(w)[:, 0])) < need:
            return None, _NONE, _NONE, 1
        depth: int | I64 = w
    else:
        depth = np.minimum(held, pool)
        if since:
            n = len(req)
            need = np.full(n, need, np.int64)
            probe_n = min(st.probe_min_samples, st.min_samples)
            tick_s = st.tick_interval_s
            for node, cut in since.items():
                if (row := counts.row(node)) is not None:
                    depth[row] = max(0, min(int(depth[row]),
                                            math.floor((now_s - cut) / tick_s + 1e-9)))
                    need[row] = probe_n
    # A row's requests never go back (the pad before them is lower): the ticks with ``need``
    # requests since are its first ones in reach, there when the ``depth``-th newest is one.
    enough, at = counts.at_most(req - need, w)
    has = enough > w - depth
    if restart is not None:
        has &= ~restart
    if _every(has):
        since_at = cur - at
        return None, since_at[:, 0], since_at[:, 1], w + 1 - enough
    rows = has.nonzero()[0]
    since_at = cur[rows] - at[rows]
    return rows, since_at[:, 0], since_at[:, 1], w + 1 - enough[rows]


def _error_report(stalled: dict[str, Judgement], keys: list[str], rows: I64 | None,
                  share: F64, n_req: I64, n_fail: I64, ticks: I64 | int, counts: RequestCounts,
                  by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                  st: DetectorSettings, known: bool) -> ErrorReport:
    """The error-rate rule's report on the shares found: of the pairs ``keys[rows]`` (rows
    ascending; None: all), each pooled over ``ticks`` past ticks. ``known``: every node of
    ``by_node`` is in ``pairs``, a PairTable."""
    limit = st.max_error_share
    shares = share.tolist()
    at: Sequence[int] = range(len(shares)) if rows is None else rows.tolist()
    over = (share > limit).nonzero()[0].tolist() if _most(share) > limit else []   # in ``at``
    # The peers: pairs routed and past warm-up. Of a PairTable only its rare pairs can be
    # neither; another mapping is asked about each pair.
    drop: set[int] = set()
    if isinstance(pairs, PairTable) and (known or all(keys[r] in pairs for r in at)):
        for node in pairs.rare:
            if ((r := counts.row(node)) is not None and (k := bisect_left(at, r)) < len(at)
                    and at[k] == r and (not (p := pairs[node]).routed
                                        or p.state is HealthState.WARMING)):
                drop.add(k)
    else:
        drop = {k for k, r in enumerate(at) if (q := pairs.get(keys[r])) is None
                or not q.routed or q.state is HealthState.WARMING}
    peers = shares if not drop else [sh for k, sh in enumerate(shares) if k not in drop]
    failing = sum(1 for k in over if k not in drop)
    report = ErrorReport(stalled, failing, len(peers), peers if len(peers) >= st.min_peers else None)
    if not over:
        return report
    ref = report.ref
    factor = st.error_share_peer_factor
    out = report.judgements
    for k in over:
        share_k = shares[k]
        if ref is not None and share_k <= factor * ref:
            continue
        node, n, failed = keys[at[k]], int(n_req[k]), int(n_fail[k])
        ticks_k = ticks if isinstance(ticks, int) else int(ticks[k])
        peers_part = "" if ref is None else f" and > {factor:g} x peers' {ref:.1%}"
        out[node] = Judgement(Verdict.ABNORMAL, Reason.ERROR_RATE.value,
                              _window_evidence(by_node[node]), share_k / limit,
                              f"{failed} of {n} requests since the last "
                              f"{'tick' if ticks_k == 1 else f'{ticks_k} ticks'} failed "
                              f"({share_k:.1%} > {limit:.0%}{peers_part})")
    return report


def stall_judgements(idle: Sequence[str], counts: RequestCounts,
                     by_node: Mapping[str, WindowSummary], pairs: Mapping[str, PairState],
                     st: DetectorSettings, now_s: float, *, known: bool = False,
                     ) -> dict[str, Judgement]:
    """Routed, warmed-up pairs of ``idle`` (no request in the last :func:`stall_ticks`
    ticks) that still show signs of life (a heartbeat or sample within the last tick: a dead
    node goes ``gone`` instead), while the median of such pairs' requests in those ticks
    (``counts``, updated for this tick, its rows ``by_node``'s pairs) is at least
    ``stall_peer_requests`` over ``min_peers`` or more: abnormal, reason ``stalled``.
    ``idle``: as :func:`error_judgements` finds them (nodes of ``by_node``, each once);
    ``known``: every node of ``by_node`` is in ``pairs``, a PairTable."""
    rare = pairs.rare if isinstance(pairs, PairTable) else None

    def serving(node: str) -> bool:
        if rare is not None and node not in rare:
            return node in pairs                # healthy and routed
        p = pairs.get(node)
        return p is not None and p.routed and p.state is not HealthState.WARMING

    # Each of them is a peer that served 0 requests (never fewer): when they are more than
    # half of all pairs, the peers' median is 0. Most idle: count those not serving first.
    if rare is not None and 2 * len(idle) > len(by_node) and st.stall_peer_requests > 0:
        there = by_node.keys() if len(idle) == len(by_node) else set(idle)
        gone = 0 if known or there <= pairs.keys() else len(there - pairs.keys())
        gone += sum(1 for n in rare if n in there and not serving(n))
        if 2 * (len(idle) - gone) > len(by_node):
            return {}
    idle = [n for n in idle if (n in pairs if rare is not None and n not in rare
                                else serving(n))]
    if not idle or (2 * len(idle) > len(by_node) and st.stall_peer_requests > 0):
        return {}
    span = stall_ticks(st)
    served = [v for n, v in counts.served(span).items()
              if (n in pairs if rare is not None and n not in rare else serving(n))]
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
