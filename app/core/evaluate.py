"""Stage 2: per-model evaluation — the rules, the fleet guards, the routing set.

:class:`FleetEvaluator` receives, once per tick and per model, the window
summaries of that model's nodes (stage 1) and returns a
:class:`~app.core.types.ModelTick`: transitions, the routing set, the
quarantine, statuses, fleet events and diagnostics requests. It owns the
per-pair :class:`~app.core.health.PairState` of every model and a slow
per-model baseline; :meth:`snapshot`/:meth:`restore` move all of it as plain
data, and a restored evaluator produces the same future.

Rules for a routed, judged pair (``samples >= min_samples``), with *peers*
the model's routed, non-warming pairs that have judged data (the pair itself
included) and *enough peers* meaning at least ``min_peers`` of them:

* tail — ``p99/p50 > ratio_threshold`` and, with enough peers, also
  ``> fleet_ratio_factor ×`` the peers' median ratio (a heavy tail that every
  node shares flags nobody) and ``> median × exp(TAIL_NOISE_K × 1.4826 × MAD)``
  of the peers' log ratios (the spread their own windows show: with heavy
  tails and many nodes, some healthy node always sits far above the median);
  reason ``p99_p50_ratio``.
* relative P50 — with enough peers, ``p50 > relative_p50_factor ×`` the
  reference P50; reason ``relative_p50``. The reference is the peers' median,
  or, when peers carry more than one ``hardware`` class, the median of the
  pair's own class if that class has at least ``min_peers`` peers. For a
  smaller class (too few nodes for a median; the fleet's median would punish
  a slower class) the reference is the class's own slow baseline (below) times
  the fleet's movement since (median over peers of P50 / own class baseline),
  once that baseline has ``SMALL_CLASS_MIN_TICKS`` ticks behind it; before
  that, the pair is not judged by P50 (the tail rule still applies).
  The same rule also judges the window's *fresh* P50 (``WindowSummary.fresh_p50``:
  its samples from the last ``tick_interval_s``, given at least ``min_samples``)
  against the same choice of reference made over the peers' fresh P50s — like
  against like, so a fleet that slows at once flags nobody — once at least
  ``min_peers`` peers have one. After an onset the fresh P50 moves a tick before
  the window's (at 20 req/s a 1000-sample window spans 50 s, most of it from
  before the onset). Its verdict is ``relative_p50`` too (the detail says
  "p50 of the last 30 s"); a single noisy tick of it is one abnormal window,
  never a confirmation.
* relative P99 — with enough peers, ``p99 > relative_p50_factor ×`` the
  reference P99 (the same peer/class choice); reason ``relative_p99``. A
  degrading node's window mixes old and new samples for a while: its P99
  moves at once while its P50 waits for a majority of new samples, and on a
  narrow signal (TPOT, healthy P99/P50 ≈ 1.1) its ratio never reaches
  ``ratio_threshold``. This rule keeps detection within the 120 s target there.
* shift — only on a heavy-tailed model (the peers' median P99/P50 above
  ``ratio_threshold``: raw LLM latency without token counts), with enough
  peers and a P99 with support: P50, P99 and (when it has one) fresh P50 all
  ``> shift_factor ×`` their references; reason ``relative_p50``. Request
  sizes dilute a per-token slowdown in raw latency (2.5x per token is ~1.6x at
  P50 on code-completion traffic); three statistics agreeing is not noise.
  ``shift_factor = 0`` turns it off; on light-tailed models it never applies.
* error rate — the failed share of a pair's requests since the previous tick
  (the difference of stage 1's cumulative ``requests_total``/``failed_total``
  between ticks; at least ``min_samples`` requests; counters that went back —
  a new stage 1 — give no share that tick) above ``max_error_share`` and, with
  ``min_peers`` shares among the routed pairs, above ``relative_p50_factor ×``
  their median; reason ``error_rate``. It also judges routed pairs with too few
  judged samples to be peers (a node that fails fast leaves no latency) and
  fails a probe round. Disjoint ticks: no new-evidence hold, no onset credit.
  When at least ``load_event_fraction`` of those routed pairs (``min_peers`` or
  more) are past ``max_error_share`` at once, an ``error_storm`` fleet event
  opens (``error_storm_end`` closes it); nobody is ejected for it.

Noisy tails (the P99 of a window rests on its few slowest samples):

* support — the tail rules (``p99_p50_ratio``, ``relative_p99``) judge a
  routed pair only when its P99 rests on at least ``TAIL_SUPPORT`` (5)
  samples: ``samples >= 500`` (or a full window when ``window_size`` is
  smaller). Below that only the P50 rules apply (a P99 of 200 samples is the
  second-slowest request).
* new evidence — a window whose only excess is in its tail (its P50 is within
  the limit) advances an abnormal streak only when at least
  ``NEW_EVIDENCE_FRACTION`` (half) of it is newer than the window that last
  advanced the streak; otherwise it holds the streak (neither counts nor
  resets it). So three confirming windows are not one burst of slow requests
  seen three times: the first and third share no sample. The window's time
  span is ``min(now - lo, window_size / rate)`` with ``lo`` its time bound
  (age bound, cut-off, first sample) and the rate measured from windows at
  most half full (see ``_new_fraction``). At 20 req/s a 1000-sample window
  spans 50 s and every 30-s tick counts; at 5 req/s (200 s) every fourth.
  P50 verdicts always count: a median moves only with most of the window.

Onset credit (confirmation): a streak normally needs ``confirm_windows``
abnormal windows. When a routed pair with no streak turns abnormal by any
rule and at the previous tick its *relative* severity (window P50, fresh P50
or P99 against the references above) was already at least
``ONSET_CREDIT_FRACTION`` (0.8) of the limit, the previous window counts
too (the verdict covers two windows). Why: events carry completion time, and
requests that a slow-down hits complete late, so the first window after an
onset under-states it — measured on the conversation trace without token
fields, a node 2.3x slower shows only 1.6–1.8x its peers' P50/P99 40 s after
onset (also in its newest 30 s alone: the long slow requests have not
completed yet); on a fleet of lognormal request sizes (σ 1.2) a 3x node's
window P50 is 1.3x its peers' 31 s after onset while its fresh P50 is already
1.9–2.2x, which earns the credit a tick earlier. Only with
``confirm_windows >= 3`` (at least two windows must pass the full limit); the
tail rule earns no credit (its noise is larger); a node that stays at, say,
1.8x is never abnormal, so never credited. Load-event ticks clear it.

Guards (never violated, whatever the input):

* at most ``floor(max_ejected_fraction × nodes of the model)`` pairs out of
  routing (unhealthy-ejected, quarantined, retired), worst severity first;
  the rest stay unhealthy *and routed* (reason ``ejection_cap``) and leave
  when room appears;
* never the last routed node: a model with nodes always has a routing set;
* load event: when at least ``load_event_fraction`` of the peers (and at
  least ``min_peers``) are abnormal in one tick — by the rules above or
  against the model's slow baseline — nobody is ejected, no streak moves,
  and one ``FleetEvent(kind="load_event")`` opens the episode
  (``"load_event_end"`` closes it);
* baseline shift: the peers' median of P50 / class baseline beyond
  ``BASELINE_SHIFT_FACTOR`` either way emits ``"baseline_shift"`` once per
  episode (``"baseline_shift_end"`` when back within ``BASELINE_CLEAR_FACTOR``).
  The limit (1.5) is below the factor the node rules use (2.0) on purpose:
  the baseline takes in the onset tick (a window half old, half new) before
  the shift is measured, so a fleet that doubles shows ~1.95x and a 2.0 limit
  missed it. The event is a report only (it ejects and holds nobody).
  The baseline is an EWMA (half-life ``BASELINE_HALF_LIFE_S`` of event time,
  in log space) of each hardware class's median P50 and of the median
  ratio; it follows a lasting shift, so a permanent change (a new model
  version) stops being an event after a few minutes.

Quarantined pairs are judged, once their back-off has passed, on the samples
since the probe round began (``judge_since``): the window store's judged
samples since that cut-off (regular and probe alike), once there are
``probe_min_samples`` of them; by the same rules against the current peers.
Probe samples from before the round (``probe_*``, which span the whole age
bound) are used only for a summary the store did not cut.

Forgetting (``forget_after_s`` > 0): a retired pair with no sample or
heartbeat (its summaries' ``last_seen_ts``) for ``forget_after_s`` since its
retirement is dropped — ``retired → unknown``, reason ``forgotten`` — so it
stops counting against ``max_ejected_fraction``, and a summary that shows
life later starts a new pair (warming). Summaries of unknown pairs silent
that long start nothing. Other states are never forgotten.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core import health, liveness
from app.core.config import DetectorSettings
from app.core.health import Evidence, Judgement, PairState, Verdict
from app.core.own_history import OwnBaselines
from app.core.types import (
    DiagnosticsRequest,
    FleetEvent,
    HealthState,
    ModelTick,
    NodeStatus,
    Reason,
    Transition,
    WindowSummary,
)

# Onset credit: a window whose relative severity reached this fraction of the limit counts
# towards confirmation when the next window is abnormal (see the module docstring).
ONSET_CREDIT_FRACTION = 0.8
BASELINE_HALF_LIFE_S = 600.0
BASELINE_SHIFT_FACTOR = 1.5
BASELINE_CLEAR_FACTOR = 1.25
# A hardware class with fewer than min_peers peers is judged by P50 against its own baseline
# (moved with the fleet) once that baseline has this many ticks behind it.
SMALL_CLASS_MIN_TICKS = 4
# The tail limit is at least this many robust standard deviations (1.4826 x MAD) of the
# peers' log P99/P50 above their median (see _tail_limit).
TAIL_NOISE_K = 4.0
# Tail rules (p99_p50_ratio, relative_p99) judge a routed pair only when its P99 rests on at
# least this many samples above it: samples >= TAIL_SUPPORT / (1 - 0.99) (capped at window_size).
TAIL_SUPPORT = 5
# A tail verdict advances an abnormal streak only when at least this fraction of its window is
# newer than the window that last advanced it (see _new_fraction).
NEW_EVIDENCE_FRACTION = 0.5
# Per-pair own baselines are kept for models with at most this many peers (a model may shrink
# below min_peers); larger models skip the cost.
OWN_HISTORY_MAX_PEERS = 16


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (mean of the middle two when even)."""
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


@dataclass(slots=True)
class _ModelState:
    pairs: dict[str, PairState] = field(default_factory=dict)
    baseline_p50: dict[str, float] = field(default_factory=dict)   # hardware class -> log p50
    baseline_ratio: float | None = None                          # log of the median ratio
    baseline_ts: float | None = None
    baseline_signal: str | None = None
    baseline_ticks: dict[str, int] = field(default_factory=dict)   # class -> updates so far
    load_event: bool = False
    shifted: bool = False
    error_storm: bool = False          # most routed pairs past max_error_share (see evaluate)
    # Pairs whose relative severity at the last tick was in [ONSET_CREDIT_FRACTION, 1].
    elevated: dict[str, float] = field(default_factory=dict)
    # Per pair: the tick of the window that last advanced its abnormal streak, and the judged
    # sample rate (per s) last measured on a window not yet full (see _new_fraction).
    advanced_ts: dict[str, float] = field(default_factory=dict)
    rate_per_s: dict[str, float] = field(default_factory=dict)
    # Retired pairs: their last sign of life (sample or heartbeat; at least the retirement).
    retired_seen: dict[str, float] = field(default_factory=dict)
    # Per pair: stage 1's cumulative (requests, failed) at the last tick (_error_judgements).
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    live: liveness.Liveness = field(default_factory=liveness.Liveness)
    own: OwnBaselines = field(default_factory=OwnBaselines)   # per-pair P50 baselines

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": {n: p.to_dict() for n, p in sorted(self.pairs.items())},
                "baseline_p50": dict(sorted(self.baseline_p50.items())),
                "baseline_ratio": self.baseline_ratio, "baseline_ts": self.baseline_ts,
                "baseline_signal": self.baseline_signal,
                "baseline_ticks": dict(sorted(self.baseline_ticks.items())),
                "load_event": self.load_event, "shifted": self.shifted,
                "error_storm": self.error_storm,
                "elevated": dict(sorted(self.elevated.items())),
                "advanced_ts": dict(sorted(self.advanced_ts.items())),
                "rate_per_s": dict(sorted(self.rate_per_s.items())),
                "retired_seen": dict(sorted(self.retired_seen.items())),
                "counts": {n: list(c) for n, c in sorted(self.counts.items())},
                "live": self.live.to_dict(), "own": self.own.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _ModelState:
        pairs = {n: PairState.from_dict(p) for n, p in d.get("pairs", {}).items()}
        seen = d.get("retired_seen")
        if seen is None:   # a snapshot from before forgetting: retired since their retirement
            seen = {n: p.since_ts for n, p in pairs.items() if p.state is HealthState.RETIRED}
        return cls(pairs=pairs,
                   baseline_p50={str(k): float(v) for k, v in d.get("baseline_p50", {}).items()},
                   baseline_ratio=d.get("baseline_ratio"), baseline_ts=d.get("baseline_ts"),
                   baseline_signal=d.get("baseline_signal"),
                   baseline_ticks={str(k): int(v) for k, v in d.get("baseline_ticks", {}).items()},
                   load_event=bool(d.get("load_event", False)), shifted=bool(d.get("shifted", False)),
                   error_storm=bool(d.get("error_storm", False)),
                   elevated={str(k): float(v) for k, v in d.get("elevated", {}).items()},
                   advanced_ts={str(k): float(v) for k, v in d.get("advanced_ts", {}).items()},
                   rate_per_s={str(k): float(v) for k, v in d.get("rate_per_s", {}).items()},
                   retired_seen={str(k): float(v) for k, v in seen.items()},
                   counts={str(k): (int(v[0]), int(v[1])) for k, v in d.get("counts", {}).items()},
                   live=liveness.Liveness.from_dict(d["live"]) if "live" in d else liveness.Liveness(),
                   own=OwnBaselines.from_dict(d["own"]) if "own" in d else OwnBaselines())


def _cls(hardware: str | None) -> str:
    return hardware if hardware is not None else ""


@dataclass(frozen=True, slots=True)
class _Norms:
    """The model's reference numbers at one tick."""

    enough_peers: bool
    fleet_p50: float | None
    class_p50: dict[str, float]       # classes whose median is trusted
    multi_class: bool
    tail_limit: float                 # max(ratio_threshold, fleet_ratio_factor × median ratio)
    fleet_p99: float | None = None
    class_p99: dict[str, float] = field(default_factory=dict)
    movement: float | None = None     # median of P50 / own class baseline over the peers
    fleet_ratio: float | None = None  # the peers' median P99/P50 (with enough peers)

    def p50_ref(self, hardware: str | None) -> float | None:
        if not self.enough_peers:
            return None
        if self.multi_class:
            return self.class_p50.get(_cls(hardware))
        return self.fleet_p50

    def p99_ref(self, hardware: str | None) -> float | None:
        if not self.enough_peers:
            return None
        if self.multi_class:
            return self.class_p99.get(_cls(hardware))
        return self.fleet_p99


@dataclass(frozen=True, slots=True)
class _Limits:
    """One hardware class's references at one tick and the relative rules' denominators
    (``relative_p50_factor ×`` the reference; 0 when there is none: the rule does not apply).
    Computed once per class per tick: every pair of the class shares them."""

    ref: float | None
    d50: float
    ref99: float | None
    d99: float
    fresh_ref: float | None
    dfresh: float


def _limits(norms: _Norms, fresh: _Norms | None, hardware: str | None,
            factor: float) -> _Limits:
    ref = norms.p50_ref(hardware)
    ref99 = norms.p99_ref(hardware)
    fresh_ref = None if fresh is None else fresh.p50_ref(hardware)
    return _Limits(ref, factor * ref if ref is not None and ref > 0 else 0.0,
                   ref99, factor * ref99 if ref99 is not None and ref99 > 0 else 0.0,
                   fresh_ref, factor * fresh_ref if fresh_ref is not None and fresh_ref > 0 else 0.0)


def _p50_over(s: WindowSummary, p50: float, lim: _Limits) -> bool:
    """P50 (of the window or of its fresh samples) beyond the relative limit."""
    fresh = s.fresh_p50
    return (lim.d50 > 0 and p50 > lim.d50) or (
        fresh is not None and lim.dfresh > 0 and fresh > lim.dfresh)


class FleetEvaluator:
    """Stage 2 over any number of models. Not thread-safe; one owner per model."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self._models: dict[str, _ModelState] = {}

    # ---- queries -------------------------------------------------------------------------
    def models(self) -> list[str]:
        return sorted(self._models)

    def pair(self, model: str, node_id: str) -> PairState | None:
        ms = self._models.get(model)
        return None if ms is None else ms.pairs.get(node_id)

    def judge_since(self, model: str, now_s: float) -> dict[tuple[str, str], float]:
        """``{(node, model): ts}``: judge only samples at or after ``ts`` (see health.judge_since).

        Every pair with a cut-off gets it: out-of-routing pairs (the current probe round),
        warm-up just over, and a re-admitted pair (the round that passed: its slow samples
        from before ejection, still in its window, are never judged again). The window
        store keeps routed pairs with a cut-off in the fleet-wide fit (see :meth:`out_of_fit`).
        """
        ms = self._models.get(model)
        if ms is None:
            return {}
        out: dict[tuple[str, str], float] = {}
        st = self.settings
        max_age_s = st.max_sample_age_s
        warming = HealthState.WARMING
        for node, p in ms.pairs.items():
            # Inlined fast path of health.judge_since: no cut-off, or a routed pair's cut-off
            # that the age bound already covers (most pairs, every tick).
            since = p.judge_since_ts
            if p.state is not warming and (since is None or (p.routed and now_s - since > max_age_s)):
                continue
            since = health.judge_since(p, now_s, st)
            if since is not None:
                out[(node, model)] = since
        return out

    def out_of_fit(self, model: str) -> set[tuple[str, str]]:
        """Pairs out of routing: left out of the fleet-wide ``normalized`` fit by the window
        store (a slow node must not vote in its own reference)."""
        ms = self._models.get(model)
        if ms is None:
            return set()
        return {(node, model) for node, p in ms.pairs.items() if not p.routed}

    def out_of_fit_all(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for m in self._models:
            out |= self.out_of_fit(m)
        return out

    def waiting_on_time(self, now_s: float) -> bool:
        """True when some pair may change after ``now_s`` with no new samples at all.

        Warming pairs (warm-up ends), ejected-unhealthy ones (quarantine starts)
        and quarantined ones whose back-off has not passed. A quarantined pair
        past its back-off that got no verdict lacks probe samples, and only new
        samples can change that.
        """
        for ms in self._models.values():
            for p in ms.pairs.values():
                s = p.state
                if s is HealthState.WARMING or (s is HealthState.UNHEALTHY and not p.routed):
                    return True
                if s is HealthState.QUARANTINED and (p.probe_after_ts or 0.0) > now_s:
                    return True
            if liveness.waiting(ms.pairs, ms.live, now_s, self.settings):
                return True
        return False

    def judge_since_all(self, now_s: float) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for m in self._models:
            out.update(self.judge_since(m, now_s))
        return out

    # ---- the tick ------------------------------------------------------------------------
    def evaluate(self, model: str, summaries: Iterable[WindowSummary], now_s: float,
                 *, with_statuses: bool = True) -> ModelTick:
        st = self.settings
        ms = self._models.setdefault(model, _ModelState())
        by_node: dict[str, WindowSummary] = {s.node_id: s for s in summaries}
        transitions: list[Transition] = []
        pairs = ms.pairs
        if st.forget_after_s > 0:
            self._forget_retired(model, ms, by_node, now_s, transitions)
        for node in sorted(by_node.keys() - pairs.keys()):
            s = by_node[node]
            if st.forget_after_s > 0 and (s.last_seen_ts or now_s) < now_s - st.forget_after_s:
                del by_node[node]     # what is left of a forgotten pair: no sign of life since
                continue
            first = s.first_seen_ts if s.first_seen_ts is not None else now_s
            p, t = health.first_seen(node, model, first, now_s, st, s.hardware)
            pairs[node] = p
            transitions.append(t)
        live = liveness.step(model, pairs, ms.live, by_node, now_s, st)
        transitions += live.transitions
        for node in live.forgotten:
            by_node.pop(node, None)
            for d in (ms.advanced_ts, ms.rate_per_s, ms.elevated, ms.counts, ms.retired_seen):
                d.pop(node, None)
            ms.own.drop(node)

        # Peers: routed, past warm-up, with judged data.
        min_samples = st.min_samples
        peers: list[tuple[str, WindowSummary, float, float]] = []   # node, summary, p50, ratio
        for node, s in by_node.items():
            p = pairs[node]
            if not p.routed or p.state is HealthState.WARMING:
                continue
            if s.samples >= min_samples and s.p50 is not None and s.p99 is not None and s.p50 > 0:
                peers.append((node, s, s.p50, s.p99 / s.p50))
        errors, failing, counted, error_ref = self._error_judgements(ms, by_node, pairs)
        signal = _signal(peers)
        if peers and signal != ms.baseline_signal:
            # A baseline is in the units of its signal: a new signal starts a new baseline.
            ms.baseline_p50, ms.baseline_ratio, ms.baseline_ts = {}, None, None
            ms.baseline_ticks = {}
            ms.own.clear()
            ms.baseline_signal, ms.shifted = signal, False
        norms = self._norms(peers, ms)
        fresh = self._fresh_norms(peers, ms)
        judgements: dict[str, Judgement] = {}
        abnormal = 0
        base_p50, base_ratio = self._baseline_limits(ms)
        healthy = HealthState.HEALTHY
        credit = st.confirm_windows >= 3
        was_elevated, elevated = ms.elevated, {}
        tail_samples = min(st.window_size, math.ceil(TAIL_SUPPORT / 0.01))
        factor = st.relative_p50_factor
        limits: dict[str | None, _Limits] = {}
        # Too few peers for a median: each pair's P50 against its own history (own_history).
        own_p50 = {p[0]: p[2] for p in peers} if not norms.enough_peers else None
        for node, s, p50, ratio in peers:
            lim = limits.get(s.hardware)
            if lim is None:
                lim = limits[s.hardware] = _limits(norms, fresh, s.hardware, factor)
            j = self._judge(s, p50, ratio, s.samples, norms, tail=s.samples >= tail_samples,
                            fresh=fresh, lim=lim)
            new_fraction = self._new_fraction(ms, node, s, now_s)
            if own_p50 is not None and j.verdict is not Verdict.ABNORMAL:
                j = self._judge_own(ms, s, p50, ratio, own_p50) or j
            if j.verdict is not Verdict.ABNORMAL and node in errors:
                j = errors[node]      # failed requests since the last tick: new evidence each tick
            if j.verdict is Verdict.ABNORMAL:
                abnormal += 1
                p = pairs[node]
                if j.reason == Reason.ERROR_RATE:
                    judgements[node] = j
                    continue
                if (p.abnormal_streak and node in ms.advanced_ts and new_fraction < NEW_EVIDENCE_FRACTION
                        and not _p50_over(s, p50, lim) and own_p50 is None):
                    # A tail verdict on a window mostly made of the one already counted: its few
                    # slowest samples are likely the same ones. It holds the streak, no more.
                    judgements[node] = dataclasses.replace(
                        j, verdict=Verdict.NONE, detail=f"{j.detail}; only {new_fraction:.0%} of the "
                        "window is new since the last counted one: held, not counted")
                    continue
                if credit and node in was_elevated and p.abnormal_streak == 0:
                    j = dataclasses.replace(j, windows=2, detail=(
                        f"{j.detail}; the previous window counts too (it was at "
                        f"{was_elevated[node]:.2f} of the limit: the onset of a slow-down)"))
                judgements[node] = j
                continue
            if j.severity:
                elevated[node] = j.severity
            p = pairs[node]
            if p.state is not healthy or p.abnormal_streak:
                judgements[node] = j
            # Abnormal against the slow baseline: counts towards a load event only.
            if ratio > base_ratio or p50 > base_p50.get(_cls(s.hardware), math.inf):
                abnormal += 1
        # A routed pair with too few judged samples to be a peer may still be failing fast.
        # (Not counted towards a load event, whose denominator is the peers; the ejection cap
        # still bounds how many leave.)
        judged = {p[0] for p in peers}
        for node, j in errors.items():
            p = pairs[node]
            if node not in judged and p.routed and p.state is not HealthState.WARMING:
                judgements[node] = j
        n_peers = len(peers)
        fleet_events: list[FleetEvent] = list(live.fleet_events)
        load = n_peers >= st.min_peers and abnormal >= st.load_event_fraction * n_peers
        fleet_p50 = norms.fleet_p50
        if load != ms.load_event:
            ms.load_event = load
            fleet_events.append(FleetEvent(
                ts=now_s, model=model, kind="load_event" if load else "load_event_end",
                abnormal_nodes=abnormal, judged_nodes=n_peers, fleet_p50=fleet_p50,
                baseline_p50=self._baseline_fleet_p50(ms), signal=_signal(peers),
                detail=(f"{abnormal} of {n_peers} judged nodes abnormal in one tick: "
                        "nobody is ejected while it lasts") if load else None))
        if load:
            judgements = {}
            elevated = {}
        ms.elevated = elevated
        storm = counted >= st.min_peers and failing >= st.load_event_fraction * counted
        if storm != ms.error_storm:
            ms.error_storm = storm
            fleet_events.append(FleetEvent(
                ts=now_s, model=model, kind="error_storm" if storm else "error_storm_end",
                abnormal_nodes=failing, judged_nodes=counted, signal=_signal(peers),
                detail=(f"{failing} of {counted} nodes failed more than "
                        f"{st.max_error_share:.0%} of their requests since the last tick "
                        f"(median share {error_ref:.1%}): nobody is ejected for it")
                if storm and error_ref is not None else None))
        if len(peers) <= OWN_HISTORY_MAX_PEERS:
            for node, _, p50, _ in peers:
                p = pairs[node]
                verdict = judgements[node].verdict if node in judgements else Verdict.NORMAL
                if p.state is healthy and not p.abnormal_streak and verdict is not Verdict.ABNORMAL:
                    ms.own.update(node, p50, now_s, st.tick_interval_s)
        shift = self._baseline_shift(model, ms, peers, now_s, abnormal, fleet_p50, norms.movement)
        if shift is not None:
            fleet_events.append(shift)
        self._update_baseline(ms, peers, now_s)

        # Quarantined pairs whose back-off has passed: judge the probe round.
        for node, p in pairs.items():
            if p.state is HealthState.QUARANTINED and (p.probe_after_ts is None
                                                       or now_s >= p.probe_after_ts):
                qs = by_node.get(node)
                if qs is not None:
                    judgements[node] = errors.get(node) or self._judge_probe(qs, norms, ms, own_p50)

        # Step every pair that can move (sorted: deterministic transition order).
        candidates: list[PairState] = []
        retired = HealthState.RETIRED
        confirm = st.confirm_windows
        for node in sorted(pairs):
            p = pairs[node]
            state = p.state
            if (state is healthy and node not in judgements) or state is retired:
                continue
            new, tr = health.step(p, judgements.get(node, health.NO_VERDICT), now_s, st)
            if new.abnormal_streak > p.abnormal_streak:
                ms.advanced_ts[node] = now_s
            elif new.abnormal_streak == 0:
                ms.advanced_ts.pop(node, None)
            if new is not p:
                pairs[node] = new
            if tr is not None:
                transitions.append(tr)
            if new.abnormal_streak >= confirm and health.wants_out(new, st):
                candidates.append(new)

        diagnostics: list[DiagnosticsRequest] = []
        if not load and not live.telemetry_lost and candidates:
            self._guard(model, pairs, candidates, now_s, transitions, diagnostics)

        routing = frozenset(n for n, p in pairs.items() if p.routed)
        # The contract: ``routed`` is membership of the routing set after the tick, also for
        # a pair that moved twice in one tick (first seen, then confirmed at once).
        transitions = [t if t.routed == (t.node_id in routing)
                       else dataclasses.replace(t, routed=t.node_id in routing)
                       for t in transitions]
        quarantine = {n: (p.probe_after_ts if p.probe_after_ts is not None else now_s)
                      for n, p in pairs.items()
                      if not p.routed and p.state is not HealthState.RETIRED and p.state is not HealthState.GONE}
        for t in transitions:
            if t.to_state is HealthState.RETIRED:
                ms.retired_seen[t.node_id] = now_s
        statuses = self._statuses(model, pairs, by_node) if with_statuses else ()
        return ModelTick(model=model, ts=now_s, transitions=tuple(transitions), routing=routing,
                         quarantine=quarantine, statuses=statuses,
                         fleet_events=tuple(fleet_events), diagnostics=tuple(diagnostics))

    # ---- rules ---------------------------------------------------------------------------
    def _norms(self, peers: list[tuple[str, WindowSummary, float, float]],
               ms: _ModelState) -> _Norms:
        st = self.settings
        enough = len(peers) >= st.min_peers
        if not enough:
            return _Norms(False, median([p[2] for p in peers]) if peers else None, {}, False,
                          st.ratio_threshold)
        fleet_p50 = median([p[2] for p in peers])
        ratios = [p[3] for p in peers]
        tail_limit = _tail_limit(ratios, st)
        classes: dict[str, list[float]] = {}
        classes99: dict[str, list[float]] = {}
        for _, s, p50, ratio in peers:
            c = _cls(s.hardware)
            classes.setdefault(c, []).append(p50)
            classes99.setdefault(c, []).append(p50 * ratio)
        multi = len(classes) > 1
        movement = self._movement(peers, ms)
        class_p50: dict[str, float] = {}
        class_p99: dict[str, float] = {}
        if multi:
            class_p50 = self._class_p50_refs(classes, movement, ms)
            class_p99 = {c: median(v) for c, v in classes99.items() if len(v) >= st.min_peers}
        return _Norms(True, fleet_p50, class_p50, multi, tail_limit,
                      median([p[2] * p[3] for p in peers]), class_p99, movement, median(ratios))

    def _movement(self, peers: list[tuple[str, WindowSummary, float, float]],
                  ms: _ModelState) -> float | None:
        """Median over the peers of P50 / own class baseline (None below min_peers of them)."""
        base = ms.baseline_p50
        rel = [p[2] / math.exp(base[c]) for p in peers if (c := _cls(p[1].hardware)) in base]
        return median(rel) if len(rel) >= self.settings.min_peers else None

    def _class_p50_refs(self, classes: dict[str, list[float]], movement: float | None,
                        ms: _ModelState) -> dict[str, float]:
        """Per hardware class, the P50 reference of its pairs: the median of its ``classes``
        values when it has at least ``min_peers``; else its slow baseline moved by
        ``movement``, once that baseline has ``SMALL_CLASS_MIN_TICKS`` ticks; else none."""
        base = ms.baseline_p50
        out: dict[str, float] = {}
        for c, v in classes.items():
            if len(v) >= self.settings.min_peers:
                out[c] = median(v)
            elif (movement is not None and c in base
                  and ms.baseline_ticks.get(c, 0) >= SMALL_CLASS_MIN_TICKS):
                # Too few peers for a class median: the class's own slow baseline, moved
                # as the whole fleet moved since (so a fleet-wide change cancels out).
                out[c] = math.exp(base[c]) * movement
        return out

    def _fresh_norms(self, peers: list[tuple[str, WindowSummary, float, float]],
                     ms: _ModelState) -> _Norms | None:
        """The reference for fresh P50s: the same choice as for window P50s (fleet median,
        class median, small class's moved baseline), made over the peers' fresh P50s.
        ``None`` when fewer than ``min_peers`` peers have one. P50 references only."""
        min_peers = self.settings.min_peers
        fresh = [(n, s, s.fresh_p50, r) for n, s, _, r in peers
                 if s.fresh_p50 is not None and s.fresh_p50 > 0]
        if len(fresh) < min_peers:
            return None
        classes: dict[str, list[float]] = {}
        for _, s, p50, _ in fresh:
            classes.setdefault(_cls(s.hardware), []).append(p50)
        multi = len(classes) > 1
        class_p50: dict[str, float] = {}
        if multi:
            small = any(len(v) < min_peers for v in classes.values())
            class_p50 = self._class_p50_refs(classes, self._movement(fresh, ms) if small else None, ms)
        return _Norms(True, median([p[2] for p in fresh]), class_p50, multi, math.inf)

    def _judge(self, s: WindowSummary, p50: float, ratio: float, samples: int,
               norms: _Norms, p99: float | None = None, *, tail: bool = True,
               fresh: _Norms | None = None, lim: _Limits | None = None) -> Judgement:
        """One pair's verdict. ``lim``: its class's :class:`_Limits` for this tick (computed
        from ``norms``/``fresh`` when not given)."""
        st = self.settings
        factor = st.relative_p50_factor
        if lim is None:
            lim = _limits(norms, fresh, s.hardware, factor)
        sev_tail = ratio / norms.tail_limit if tail else 0.0
        sev_p50 = p50 / lim.d50 if lim.d50 > 0 else 0.0
        # Fresh P50: the samples since the previous tick against the peers' fresh P50s. After an
        # onset it moves a tick before the window's P50 (whose older samples hold it back).
        fresh_p50 = s.fresh_p50
        sev_fresh = fresh_p50 / lim.dfresh if fresh_p50 is not None and lim.dfresh > 0 else 0.0
        # Relative tail: P99 far above the peers' P99. Catches a degrading node while its
        # window still mixes old and new samples (P50 not yet past the factor), on signals
        # whose healthy spread is far below ratio_threshold (TPOT: ~1.1).
        sev_p99 = p50 * ratio / lim.d99 if tail and lim.d99 > 0 else 0.0
        # Shift: on a heavy-tailed model, P50, P99 and fresh P50 all past shift_factor × the
        # peers'. Request sizes dilute a per-token slowdown in raw latency (2.5x per token is
        # ~1.6x at P50 on code-completion traffic); three statistics agreeing is not noise.
        sev_shift = 0.0
        if (st.shift_factor and tail and sev_p50 and sev_p99 and norms.fleet_ratio is not None
                and norms.fleet_ratio > st.ratio_threshold):
            low = min(sev_p50, sev_p99, sev_fresh) if sev_fresh else min(sev_p50, sev_p99)
            sev_shift = low * factor / st.shift_factor
        if (sev_tail <= 1.0 and sev_p50 <= 1.0 and sev_p99 <= 1.0 and sev_fresh <= 1.0
                and sev_shift <= 1.0):
            rel = max(sev_p50, sev_p99, sev_fresh, sev_shift)
            if rel < ONSET_CREDIT_FRACTION:
                return health.NORMAL
            return Judgement(Verdict.NORMAL, str(Reason.NORMAL), severity=rel)
        ref = lim.ref
        ev = Evidence(signal=s.signal, p50=p50, p99=p99 if p99 is not None else s.p99, ratio=ratio,
                      samples=samples, peers_p50=ref, latency_p50_us=s.latency_p50_us,
                      latency_p99_us=s.latency_p99_us, hardware=s.hardware,
                      fresh_p50=fresh_p50 if sev_fresh else None,
                      peers_fresh_p50=lim.fresh_ref if sev_fresh else None)
        # The reason names the most telling rule (a whole-node slowdown is relative_p50 even
        # though its P99 moved as much); the severity that orders ejections is the largest.
        sev = max(sev_tail, sev_p50, sev_p99, sev_fresh, sev_shift)
        if sev_tail > 1.0 and sev_tail >= max(sev_p50, sev_fresh):
            return Judgement(Verdict.ABNORMAL, str(Reason.P99_P50_RATIO), ev, sev,
                             f"p99/p50 {ratio:.2f} > limit {norms.tail_limit:.2f}")
        if sev_p50 > 1.0:
            return Judgement(Verdict.ABNORMAL, str(Reason.RELATIVE_P50), ev, sev,
                             f"p50 {p50:.1f} > {factor:g} x peers' {ref:.1f}")
        if sev_fresh > 1.0:
            return Judgement(Verdict.ABNORMAL, str(Reason.RELATIVE_P50), ev, sev,
                             f"p50 of the last {st.tick_interval_s:g} s {fresh_p50:.1f} "
                             f"({s.fresh_samples} samples) > {factor:g} x peers' "
                             f"{lim.fresh_ref:.1f}")
        if sev_p99 > 1.0:
            return Judgement(Verdict.ABNORMAL, str(Reason.RELATIVE_P99), ev, sev,
                             f"p99 {p50 * ratio:.1f} > {factor:g} x peers' {lim.ref99:.1f}")
        fresh_part = (f", p50 of the last {st.tick_interval_s:g} s {fresh_p50:.1f}"
                      if sev_fresh and fresh_p50 is not None else "")
        return Judgement(Verdict.ABNORMAL, str(Reason.RELATIVE_P50), ev, sev,
                         f"p50 {p50:.1f}, p99 {p50 * ratio:.1f}{fresh_part} all > "
                         f"{st.shift_factor:g} x peers' on a heavy-tailed model (peers' "
                         f"p99/p50 {norms.fleet_ratio:.1f} > {st.ratio_threshold:g})")

    def _error_judgements(self, ms: _ModelState, by_node: Mapping[str, WindowSummary],
                          pairs: Mapping[str, PairState],
                          ) -> tuple[dict[str, Judgement], int, int, float | None]:
        """Abnormal verdicts (reason ``error_rate``) from the failed requests since the last
        tick, and the counters kept for the next one (see the module docstring). Also: of the
        routed pairs with a share this tick, how many are past ``max_error_share``, how many
        there are, and their median share (None below ``min_peers`` of them)."""
        st = self.settings
        shares: dict[str, tuple[float, int, int]] = {}     # node -> share, requests, failed
        counts = ms.counts
        for node, s in by_node.items():
            cur = (s.requests_total, s.failed_total)
            prev = counts.get(node)
            counts[node] = cur
            if prev is None:
                continue
            n, failed = cur[0] - prev[0], cur[1] - prev[1]
            # Fewer than min_samples requests, or counters that went back (a new stage 1).
            if n >= st.min_samples and 0 <= failed <= n:
                shares[node] = (failed / n, n, failed)
        limit = st.max_error_share
        if limit <= 0:
            return {}, 0, 0, None
        peers = [sh for node, (sh, _, _) in shares.items()
                 if (p := pairs.get(node)) is not None and p.routed
                 and p.state is not HealthState.WARMING]
        ref = median(peers) if len(peers) >= st.min_peers else None
        failing = sum(1 for sh in peers if sh > limit)
        factor = st.relative_p50_factor
        out: dict[str, Judgement] = {}
        for node, (share, n, failed) in shares.items():
            if share <= limit or (ref is not None and share <= factor * ref):
                continue
            s = by_node[node]
            ratio = s.p99 / s.p50 if s.p50 and s.p99 is not None else None
            ev = Evidence(signal=s.signal, p50=s.p50, p99=s.p99, ratio=ratio, samples=s.samples,
                          latency_p50_us=s.latency_p50_us, latency_p99_us=s.latency_p99_us,
                          hardware=s.hardware)
            peers_part = "" if ref is None else f" and > {factor:g} x peers' {ref:.1%}"
            out[node] = Judgement(Verdict.ABNORMAL, str(Reason.ERROR_RATE), ev, share / limit,
                                  f"{failed} of {n} requests since the last tick failed "
                                  f"({share:.1%} > {limit:.0%}{peers_part})")
        return out, failing, len(peers), ref

    def _new_fraction(self, ms: _ModelState, node: str, s: WindowSummary, now_s: float) -> float:
        """The fraction of this window's judged samples newer than the window that last
        advanced the pair's abnormal streak (1.0 when none did).

        The window holds the newest ``window_size`` judged samples no older than its time bound
        ``lo`` (age bound, cut-off, first sample): it spans ``min(now_s - lo, window_size /
        rate)``. The rate is at least ``samples / (now_s - lo)``, exactly that when the window
        is at most half full; fuller (maybe full), the highest rate measured since is kept. A
        rate that falls while windows stay over half full is over-estimated: more of the window
        counts as new (the check loosens, never delays more). Arrivals are taken as even.
        """
        st = self.settings
        lo = now_s - st.max_sample_age_s       # the latest of: age bound, cut-off, first sample
        since = s.extra.get("judged_since") if s.extra else None
        if since is not None and since > lo:
            lo = float(since)
        first = s.first_seen_ts
        if first is not None and first > lo:
            lo = first
        bound_s = now_s - lo
        samples = s.samples
        if bound_s <= 0 or samples <= 0:
            return 1.0
        rate = samples / bound_s               # at least: every judged sample is within the bound
        window = st.window_size
        if 2 * samples > window:
            # Maybe full (a full ring can count fewer judged samples: failed, probes): the rate
            # is at least this; keep the higher rate measured before.
            before = ms.rate_per_s.get(node, 0.0)
            if before > rate:
                rate = before
        ms.rate_per_s[node] = rate
        last = ms.advanced_ts.get(node)
        if last is None:
            return 1.0
        span_s = min(bound_s, window / rate)
        return min(1.0, (now_s - last) / span_s)

    def _judge_own(self, ms: _ModelState, s: WindowSummary, p50: float, ratio: float,
                   p50s: Mapping[str, float]) -> Judgement | None:
        """Abnormal when the pair's P50 is above ``relative_p50_factor ×`` its own baseline moved
        as the model's other pairs moved (too few peers for a median); else None."""
        ref = ms.own.reference(s.node_id, p50s)
        if ref is None:
            return None
        r, moved = ref
        limit = self.settings.relative_p50_factor * r
        if p50 <= limit:
            return None
        ev = Evidence(signal=s.signal, p50=p50, p99=s.p99, ratio=ratio, samples=s.samples, peers_p50=r,
                      latency_p50_us=s.latency_p50_us, latency_p99_us=s.latency_p99_us,
                      hardware=s.hardware)
        return Judgement(Verdict.ABNORMAL, str(Reason.RELATIVE_P50), ev, p50 / limit,
                         f"p50 {p50:.1f} > {self.settings.relative_p50_factor:g} x its own baseline "
                         f"moved as the other nodes moved (x{moved:.2f}): {r:.1f}")

    def _judge_probe(self, s: WindowSummary, norms: _Norms, ms: _ModelState | None = None,
                     own_p50: Mapping[str, float] | None = None) -> Judgement:
        need = self.settings.probe_min_samples
        if s.samples >= need and s.p50 is not None and s.p99 is not None and s.p50 > 0:
            p50, p99, n = s.p50, s.p99, s.samples
        elif ("judged_since" not in s.extra and s.probe_samples >= need
              and s.probe_p50 is not None and s.probe_p99 is not None and s.probe_p50 > 0):
            # Only for a window cut by no one (stage 1 did not know the round yet): a cut
            # window's judged samples already hold every probe since the round began, while
            # probe_* span the whole age bound — probes from before the round (from while the
            # node was still slow) would fail a round that has no sample of its own yet.
            p50, p99, n = s.probe_p50, s.probe_p99, s.probe_samples
        else:
            return health.NO_VERDICT
        j = self._judge(s, p50, p99 / p50, n, norms, p99)
        if j.verdict is Verdict.NORMAL and own_p50 is not None and ms is not None:
            j = self._judge_own(ms, s, p50, p99 / p50, {**own_p50, s.node_id: p50}) or j
        if j.verdict is Verdict.NORMAL:
            ev = Evidence(signal=s.signal, p50=p50, p99=p99, ratio=p99 / p50, samples=n,
                          peers_p50=norms.p50_ref(s.hardware), latency_p50_us=s.latency_p50_us,
                          latency_p99_us=s.latency_p99_us, hardware=s.hardware)
            return Judgement(Verdict.NORMAL, str(Reason.NORMAL), ev)
        return j

    # ---- baseline ------------------------------------------------------------------------
    def _baseline_limits(self, ms: _ModelState) -> tuple[dict[str, float], float]:
        """Per class, the P50 above which a node is off the model's slow baseline; the ratio too."""
        st = self.settings
        p50 = {c: st.relative_p50_factor * math.exp(b) for c, b in ms.baseline_p50.items()}
        ratio = (math.inf if ms.baseline_ratio is None else
                 max(st.ratio_threshold, st.fleet_ratio_factor * math.exp(ms.baseline_ratio)))
        return p50, ratio

    def _baseline_fleet_p50(self, ms: _ModelState) -> float | None:
        if not ms.baseline_p50:
            return None
        return math.exp(median(list(ms.baseline_p50.values())))

    def _baseline_shift(self, model: str, ms: _ModelState,
                        peers: list[tuple[str, WindowSummary, float, float]], now_s: float,
                        abnormal: int, fleet_p50: float | None,
                        factor: float | None) -> FleetEvent | None:
        if factor is None:
            return None
        off = max(factor, 1.0 / factor)
        if not ms.shifted and off > BASELINE_SHIFT_FACTOR:
            ms.shifted = True
            kind = "baseline_shift"
            detail = f"fleet median P50 is {factor:.2f}x its baseline"
        elif ms.shifted and off < BASELINE_CLEAR_FACTOR:
            ms.shifted = False
            kind = "baseline_shift_end"
            detail = f"fleet median P50 back to {factor:.2f}x its baseline"
        else:
            return None
        return FleetEvent(ts=now_s, model=model, kind=kind, abnormal_nodes=abnormal,
                          judged_nodes=len(peers), fleet_p50=fleet_p50,
                          baseline_p50=self._baseline_fleet_p50(ms), signal=_signal(peers),
                          detail=detail)

    def _update_baseline(self, ms: _ModelState, peers: list[tuple[str, WindowSummary, float, float]],
                         now_s: float) -> None:
        if not peers:
            return
        dt = self.settings.tick_interval_s if ms.baseline_ts is None else max(0.0, now_s - ms.baseline_ts)
        alpha = 1.0 - 0.5 ** (dt / BASELINE_HALF_LIFE_S)
        ms.baseline_ts = now_s
        classes: dict[str, list[float]] = {}
        ratios: list[float] = []
        for _, s, p50, ratio in peers:
            classes.setdefault(_cls(s.hardware), []).append(p50)
            ratios.append(ratio)
        for c, values in classes.items():
            cur = math.log(median(values))
            old = ms.baseline_p50.get(c)
            ms.baseline_p50[c] = cur if old is None else old + alpha * (cur - old)
            ms.baseline_ticks[c] = ms.baseline_ticks.get(c, 0) + 1
        cur_r = math.log(median(ratios))
        ms.baseline_ratio = cur_r if ms.baseline_ratio is None else (
            ms.baseline_ratio + alpha * (cur_r - ms.baseline_ratio))

    # ---- guards --------------------------------------------------------------------------
    def _guard(self, model: str, pairs: dict[str, PairState], candidates: list[PairState],
               now_s: float, transitions: list[Transition],
               diagnostics: list[DiagnosticsRequest]) -> None:
        st = self.settings
        # Gone pairs are in no count: the cap is a share of the nodes that are there.
        gone = HealthState.GONE
        n_nodes = sum(1 for p in pairs.values() if p.state is not gone)
        allowed_out = math.floor(st.max_ejected_fraction * n_nodes + 1e-9)
        out = sum(1 for p in pairs.values() if not p.routed and p.state is not gone)
        routed = n_nodes - out
        candidates.sort(key=lambda p: (-p.severity, p.node_id))
        for p in candidates:
            if out < allowed_out and routed > 1:
                new, t = health.eject(p, now_s, st)
                out += 1
                routed -= 1
                diagnostics.append(DiagnosticsRequest(ts=now_s, node_id=p.node_id, model=model,
                                                      reason=new.reason))
            else:
                why = ("the last routed node" if routed <= 1 else
                       f"{out} of {n_nodes} out already (max_ejected_fraction="
                       f"{st.max_ejected_fraction:g})")
                new, t2 = health.keep_in(p, now_s, f"confirmed abnormal, kept in: {why}")
                if t2 is None:
                    pairs[p.node_id] = new
                    continue
                t = t2
            pairs[p.node_id] = new
            transitions.append(t)

    # ---- diagnostics ---------------------------------------------------------------------
    def apply_diagnostics(self, model: str, node_id: str, recoverable: bool,
                          now_s: float) -> list[Transition]:
        """Apply a diagnostics result for an out-of-routing pair (see health.diagnostics)."""
        ms = self._models.get(model)
        p = None if ms is None else ms.pairs.get(node_id)
        if ms is None or p is None:
            return []
        new, t = health.diagnostics(p, recoverable, now_s)
        ms.pairs[node_id] = new
        if new.state is HealthState.RETIRED and p.state is not HealthState.RETIRED:
            ms.retired_seen[node_id] = now_s
        return [] if t is None else [t]

    def _forget_retired(self, model: str, ms: _ModelState, by_node: dict[str, WindowSummary],
                        now_s: float, transitions: list[Transition]) -> None:
        """Forget retired pairs with no sign of life for ``forget_after_s``.

        A retired node is to be replaced: while it still sends samples or heartbeats
        it stays retired (and counts against ``max_ejected_fraction``); once it has been
        silent for ``forget_after_s`` since its retirement and its last sample or
        heartbeat, its pair is dropped (``retired → unknown``, reason ``forgotten``), so
        it no longer holds a place under the ejection cap, and a node that later comes
        back under that id starts over as a new pair (warming).
        """
        seen = ms.retired_seen
        if not seen:
            return
        horizon = now_s - self.settings.forget_after_s
        for node in sorted(seen):
            p = ms.pairs.get(node)
            if p is None or p.state is not HealthState.RETIRED:
                del seen[node]
                continue
            s = by_node.get(node)
            if s is not None and s.last_seen_ts is not None and s.last_seen_ts > seen[node]:
                seen[node] = s.last_seen_ts
            last = seen[node]
            if last >= horizon:
                continue
            del ms.pairs[node], seen[node]
            by_node.pop(node, None)
            for d in (ms.advanced_ts, ms.rate_per_s, ms.elevated, ms.counts):
                d.pop(node, None)
            transitions.append(Transition(
                ts=now_s, node_id=node, model=model, from_state=HealthState.RETIRED,
                to_state=HealthState.UNKNOWN, routed=False, reason=str(Reason.FORGOTTEN),
                hardware=p.hardware, detail=(
                    f"retired at {p.since_ts:.0f}, no sample or heartbeat for {now_s - last:.0f} s "
                    f"(forget_after_s={self.settings.forget_after_s:g})")))

    # ---- statuses ------------------------------------------------------------------------
    def _statuses(self, model: str, pairs: dict[str, PairState],
                  by_node: dict[str, WindowSummary]) -> tuple[NodeStatus, ...]:
        out: list[NodeStatus] = []
        for node in sorted(pairs):
            p = pairs[node]
            s = by_node.get(node)
            if s is not None:
                out.append(NodeStatus(
                    node_id=node, model=model, state=p.state, routed=p.routed, since_ts=p.since_ts,
                    reason=p.reason, p50=s.p50, p99=s.p99, ratio=s.ratio, samples=s.samples,
                    latency_p50_us=s.latency_p50_us, latency_p99_us=s.latency_p99_us,
                    signal=s.signal, hardware=s.hardware or p.hardware,
                    probe_after_ts=p.probe_after_ts))
            else:
                out.append(NodeStatus(node_id=node, model=model, state=p.state, routed=p.routed,
                                      since_ts=p.since_ts, reason=p.reason, hardware=p.hardware,
                                      probe_after_ts=p.probe_after_ts))
        return tuple(out)

    # ---- persistence ---------------------------------------------------------------------
    def snapshot_model(self, model: str) -> dict[str, Any]:
        ms = self._models.get(model)
        return _ModelState().to_dict() if ms is None else ms.to_dict()

    def restore_model(self, model: str, data: dict[str, Any]) -> None:
        self._models[model] = _ModelState.from_dict(data)

    def snapshot(self) -> dict[str, Any]:
        return {"version": 1, "models": {m: self._models[m].to_dict() for m in sorted(self._models)}}

    def restore(self, data: dict[str, Any]) -> None:
        if data.get("version") != 1:
            raise ValueError(f"evaluator snapshot version {data.get('version')!r} is not supported (1)")
        self._models = {m: _ModelState.from_dict(d) for m, d in data.get("models", {}).items()}


def _tail_limit(ratios: Sequence[float], st: DetectorSettings) -> float:
    """The tail rule's limit on P99/P50 given the peers' ratios (see the module docstring).

    ``max(ratio_threshold, fleet_ratio_factor x median, noise limit)``; the noise limit is
    ``median x exp(TAIL_NOISE_K x 1.4826 x MAD)`` of the log ratios: the spread the peers'
    own windows show. The P99 of a window of a heavy-tailed workload is a noisy estimate
    (a few requests set it); among many nodes some healthy one sits far above the median,
    and at low rates its consecutive windows share most samples, so the excursion lasts.
    """
    logs = [math.log(r) for r in ratios]
    mid = median(logs)
    mad = median([abs(x - mid) for x in logs])
    noise = math.exp(mid + TAIL_NOISE_K * 1.4826 * mad)
    return max(st.ratio_threshold, st.fleet_ratio_factor * median(ratios), noise)


def _signal(peers: list[tuple[str, WindowSummary, float, float]]) -> str | None:
    return peers[0][1].signal if peers else None
