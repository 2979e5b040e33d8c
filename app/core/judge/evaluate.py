"""Stage 2: per model and tick, window summaries → transitions, routing set, fleet events.

:class:`FleetEvaluator` owns the :class:`~tailguard.core.judge.model_state.ModelState` of
every model and runs one tick of a model as a fixed sequence of steps:
forget silent retired pairs, admit new pairs, pick the peers
(:mod:`tailguard.core.judge.peers`), judge each pair (:mod:`tailguard.core.judge.rules`), decide the
fleet events and hold every verdict on a load event (:mod:`tailguard.core.judge.guards`,
:mod:`tailguard.core.judge.baseline`), judge probe rounds, step each pair's state machine
(:mod:`tailguard.core.judge.health`), eject within the cap, and report.

Guarantees: the tick is deterministic (pairs stepped in node order); a
transition's ``routed`` is membership of the routing set after the tick;
a model with nodes always has a routing set; :meth:`FleetEvaluator.snapshot`/
:meth:`~FleetEvaluator.restore` (and the per-model pair) move all state as
plain data, a restored evaluator produces the same future, and a snapshot
of another version is refused with :class:`ValueError`.

Rationale: docs/rules.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import (
    DiagnosticsRequest,
    FleetEvent,
    HealthState,
    ModelTick,
    NodeStatus,
    Reason,
    Transition,
    WindowSummary,
    utc_text,
)
from tailguard.core.judge import health, liveness
from tailguard.core.judge.admission import admission_norms
from tailguard.core.judge.baseline import baseline_shift, fold_baseline, follow_signal
from tailguard.core.judge.fleet_slow import fleet_slow
from tailguard.core.judge.guards import eject_within_cap, error_storm, load_event, through_load
from tailguard.core.judge.health import Judgement, PairState, Verdict
from tailguard.core.judge.hist_mean import as_means
from tailguard.core.judge.hist_own import OwnHist, fold
from tailguard.core.judge.hist_resolution import unresolved
from tailguard.core.judge.hist_rules import HIST_SIGNAL, HistJudge
from tailguard.core.judge.hist_weights import targets as hist_targets
from tailguard.core.judge.model_state import SNAPSHOT_VERSION, ModelState, check_version
from tailguard.core.judge.peers import (
    PeerSet,
    gather_peers,
    norms_of,
    signal_of,
    summary_field,
)
from tailguard.core.judge.request_rules import error_judgements
from tailguard.core.judge.rules import FRESH_TAIL_MARGIN
from tailguard.core.judge.verdicts import Verdicts, judge_peers, judge_probes, judge_thin_failing
from tailguard.core.judge.weights import NO_WEIGHTS, WeightTick, weigh_model, weigh_statuses

_NODE_ID = summary_field("node_id")
_NO_METRICS: frozenset[str] = frozenset()

# Per-pair own baselines are kept for models with at most this many peers (a model may shrink
# below min_peers); larger models skip the cost.
OWN_HISTORY_MAX_PEERS = 16


class FleetEvaluator:
    """Stage 2 over any number of models. Not thread-safe; one owner per model."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self._models: dict[str, ModelState] = {}

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
        pairs = ms.pairs
        # Only pairs not healthy-and-routed, and routed ones whose cut-off the age bound may
        # not cover yet, can have one (most pairs, every tick, are neither).
        for node in pairs.in_order(pairs.rare.union(pairs.cut_candidates(now_s, st.max_sample_age_s))):
            since = health.judge_since(pairs[node], now_s, st)
            if since is not None:
                out[(node, model)] = since
        return out

    def out_of_fit(self, model: str) -> set[tuple[str, str]]:
        """Pairs out of routing: left out of the fleet-wide ``normalized`` fit by the window
        store (a slow node must not vote in its own reference)."""
        ms = self._models.get(model)
        if ms is None:
            return set()
        return {(node, model) for node in ms.pairs.unrouted}

    def out_of_fit_all(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for m in self._models:
            out |= self.out_of_fit(m)
        return out

    def waiting_on_time(self, now_s: float) -> bool:
        """True when some pair may change after ``now_s`` with no new samples at all.

        Warming pairs (warm-up ends), ejected-unhealthy ones (quarantine starts),
        quarantined ones whose back-off has not passed, and pairs that may still fall
        silent or be forgotten (:func:`tailguard.core.judge.liveness.waiting`). A quarantined pair
        past its back-off that got no verdict lacks probe samples, and only new
        samples can change that.
        """
        for ms in self._models.values():
            pairs = ms.pairs
            for node in pairs.rare:         # a healthy routed pair waits on nothing here
                p = pairs[node]
                s = p.state
                if s is HealthState.WARMING and (p.admitted or now_s < health.warmup_end(p, self.settings)):
                    return True     # past warm-up, a pair awaiting admission waits on samples
                if s is HealthState.UNHEALTHY and not p.routed:
                    return True
                if s is HealthState.QUARANTINED and (p.probe_after_ts or 0.0) > now_s:
                    return True
            if liveness.waiting(ms.pairs, ms.live, now_s, self.settings):
                return True
        return False

    def tail_ref(self, model: str) -> float | None:
        """``model``'s threshold for stage 1's fresh-tail count (see :meth:`tail_refs`)."""
        ms = self._models.get(model)
        return None if ms is None else ms.tail_ref

    def tail_refs(self) -> dict[str, float]:
        """``{model: threshold}``: stage 1 counts each series' fresh samples above it
        (``WindowSummary.fresh_over``, judged by :func:`tailguard.core.judge.rules.judge_fresh_tail`)."""
        return {m: ms.tail_ref for m, ms in self._models.items() if ms.tail_ref is not None}

    def judge_since_all(self, now_s: float) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for m in self._models:
            out.update(self.judge_since(m, now_s))
        return out

    # ---- the tick ------------------------------------------------------------------------
    def evaluate(self, model: str, summaries: Iterable[WindowSummary], now_s: float,
                 *, with_statuses: bool = True,
                 fleet_latency_us: tuple[float | None, float | None] = (None, None)) -> ModelTick:
        """One tick of ``model`` (the module docstring); ``fleet_latency_us``: the model's
        cluster-wide raw-latency P50/P99 the caller computed, carried in the tick."""
        st = self.settings
        ms = self._models.get(model)
        if ms is None:
            ms = self._models[model] = ModelState()
        by_node = _by_node(summaries)
        transitions: list[Transition] = []
        if st.forget_after_s > 0:
            self._forget_retired(model, ms, by_node, now_s, transitions)
        self._admit_new(model, ms, by_node, now_s, transitions)
        live = liveness.step(model, ms.pairs, ms.live, by_node, now_s, st)
        transitions += live.transitions
        for node in live.forgotten:
            by_node.pop(node, None)
            ms.forget_pair(node)

        peers = _gather(by_node, ms, st)
        # Histogram models whose buckets cannot resolve them: judged on means (hist_mean), and
        # their P50s are the window means too (the baselines and fleet events read them).
        unres: tuple[tuple[str, float], ...] = ()
        if _hist_model(signal_of(peers), by_node) and (unres := unresolved(peers.summaries)):
            by_node = as_means(by_node, {m for m, _b in unres}, HIST_SIGNAL)
            peers = _gather(by_node, ms, st)
        unres_metrics = frozenset(m for m, _b in unres) if unres else _NO_METRICS
        # Out of routing, failures from before the ejection are not pooled (rules).
        cut = {n: ts for n in ms.pairs.unrouted
               if (ts := ms.pairs[n].quarantined_at) is not None}
        errors = error_judgements(ms.counts, by_node, ms.pairs, st, cut, now_s)
        follow_signal(ms, peers)   # a baseline is in the units of its signal
        pn = norms_of(peers, ms.baseline_p50, ms.baseline_ticks, st)
        norms = pn.window
        signal = signal_of(peers)
        # Histogram pairs: bucket exceedance tests (hist_rules) instead of the sample rules.
        hist = peer_map = None
        if _hist_model(signal, by_node):
            peer_map = dict(zip(peers.nodes, peers.summaries, strict=True))
            hist = HistJudge.for_model(peers, by_node, ms.pairs, now_s, st,
                                       OwnHist(ms.hist_own, peer_map, st, unres_metrics),
                                       unres_metrics)
        # Too few peers for a median: each pair's P50 against its own history (own_history).
        own_p50 = (dict(zip(peers.nodes, peers.p50s, strict=True))
                   if not norms.enough_peers and hist is None else None)
        verdicts = (judge_peers(st, ms, peers, pn, errors, now_s, own_p50) if hist is None
                    else Verdicts(*hist.judge_peers(ms.pairs, peers, errors.judgements, ms.elevated)))
        if errors.judgements:
            judge_thin_failing(ms, peers, errors, verdicts)
        # Before the baselines fold this tick in: each node against where it was.
        slow_ev = fleet_slow(model, ms, by_node, signal, now_s, st,
                             len(peers) <= OWN_HISTORY_MAX_PEERS)
        load, load_ev = load_event(model, ms, verdicts.abnormal, len(peers), now_s,
                                   norms.fleet_p50, signal, st)
        if load:   # no streak moves while it lasts, but a node slower than its slowed peers'
            verdicts.judgements, verdicts.elevated = through_load(verdicts.judgements, st), {}
            kept = set(verdicts.judgements)
        elif len(peers) <= OWN_HISTORY_MAX_PEERS:
            self._update_own(ms, peers, verdicts.judgements, now_s)
            if peer_map is not None:
                fold(ms.hist_own, ms.pairs, peer_map, verdicts.judgements, now_s, st)
        ms.elevated = verdicts.elevated
        storm_ev = error_storm(model, ms, errors, now_s, signal, st)
        shift_ev = baseline_shift(model, ms, peers, now_s, verdicts.abnormal, norms.fleet_p50,
                                  norms.movement)
        if pn.ratio is not None:
            fold_baseline(ms, pn.class_p50, pn.ratio, now_s, st)
        # Next tick's threshold for stage 1's fresh-tail count (one class: its fleet P99), on a
        # 2-significant-digit grid: it needs no precision, and the hint changes less often.
        ms.tail_ref = (float(f"{norms.fleet_p99 * FRESH_TAIL_MARGIN:.2g}")
                       if norms.enough_peers and not norms.multi_class and norms.fleet_p99 else None)
        fleet_events = live.fleet_events + [e for e in (load_ev, storm_ev, shift_ev, slow_ev)
                                            if e is not None]

        if ms.pairs.rare:     # new pairs and quarantined ones are among them (most ticks: none)
            adm = admission_norms(ms, peers, by_node, norms, signal, now_s, st)
            judge_probes(st, ms, by_node, norms, errors, now_s, verdicts.judgements, own_p50,
                         signal, adm, pn.fresh)
        if hist is not None:
            hist.judge_rounds(ms.pairs, by_node, errors.judgements, now_s, verdicts.judgements)
        candidates = self._step_pairs(ms, verdicts.judgements, now_s, transitions)
        diagnostics: list[DiagnosticsRequest] = []
        if load:     # only those judged through it (a streak from before it waits)
            candidates = [p for p in candidates if p.node_id in kept]
        if not live.telemetry_lost and candidates:
            eject_within_cap(model, ms.pairs, candidates, now_s, st, transitions, diagnostics)
        wt = None
        if st.weights != "off":     # after the ejections: only the routed nodes have a weight
            # Histogram pairs: slow-downs estimated from the buckets, not from interpolated P50s.
            wt = weigh_model(model, ms.weights, peers, norms, ms.pairs.routing(), now_s, st,
                             hold=load or live.telemetry_lost,
                             evidence_of=None if hist is None else partial(
                                 hist_targets, peers, st, trend=ms.hist_trend, now_s=now_s,
                                 unresolved=unres_metrics))
        ms.weights = NO_WEIGHTS if wt is None else wt.state
        tick = self._report(model, ms, by_node, now_s, transitions, fleet_events, diagnostics,
                            with_statuses, wt, fleet_latency_us)
        # Histogram models: the metrics whose P50 their buckets cannot resolve (judged on means).
        return tick if hist is None else dataclasses.replace(tick, unresolved=unres)

    # ---- steps of the tick ---------------------------------------------------------------
    def _admit_new(self, model: str, ms: ModelState, by_node: dict[str, WindowSummary],
                   now_s: float, transitions: list[Transition]) -> None:
        """A pair for every node seen for the first time (warming); what is left of a
        forgotten pair with no sign of life since is dropped from ``by_node``."""
        st = self.settings
        pairs = ms.pairs
        if pairs.keys() >= by_node.keys():
            return                          # nobody new (most ticks)
        for node in sorted(by_node.keys() - pairs.keys()):
            s = by_node[node]
            if st.forget_after_s > 0 and (s.last_seen_ts or now_s) < now_s - st.forget_after_s:
                del by_node[node]
                continue
            first = s.first_seen_ts if s.first_seen_ts is not None else now_s
            p, t = health.first_seen(node, model, first, now_s, st, s.hardware)
            pairs[node] = p
            transitions.append(t)


    def _update_own(self, ms: ModelState, peers: PeerSet, judgements: Mapping[str, Judgement],
                    now_s: float) -> None:
        """Fold healthy pairs' normal windows into their own P50 baselines."""
        for node, p50 in zip(peers.nodes, peers.p50s, strict=True):
            p = ms.pairs[node]
            j = judgements.get(node)
            if (p.state is HealthState.HEALTHY and not p.abnormal_streak
                    and (j is None or j.verdict is not Verdict.ABNORMAL)):
                ms.own.update(node, p50, now_s, self.settings.tick_interval_s)

    def _step_pairs(self, ms: ModelState, judgements: dict[str, Judgement], now_s: float,
                    transitions: list[Transition]) -> list[PairState]:
        """Step every pair that can move (sorted: deterministic transition order); return
        the confirmed-abnormal pairs that want out of routing."""
        st = self.settings
        pairs = ms.pairs
        candidates: list[PairState] = []
        if not pairs.rare and not judgements:
            return candidates           # every pair healthy and routed, no verdict (most ticks)
        healthy, retired = HealthState.HEALTHY, HealthState.RETIRED
        confirm = st.confirm_windows
        # Not healthy (all in ``pairs.rare``), or healthy with a verdict; never retired.
        moving = {node for node in pairs.rare
                  if (s := pairs[node].state) is not healthy and s is not retired}
        for node in judgements:
            p = pairs.get(node)
            if p is not None and p.state is not retired:
                moving.add(node)
        for node in sorted(moving):
            p = pairs[node]
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
        return candidates

    def _report(self, model: str, ms: ModelState, by_node: dict[str, WindowSummary],
                now_s: float, transitions: list[Transition], fleet_events: list[FleetEvent],
                diagnostics: list[DiagnosticsRequest], with_statuses: bool,
                wt: WeightTick | None = None,
                fleet_latency_us: tuple[float | None, float | None] = (None, None)) -> ModelTick:
        pairs = ms.pairs
        routing = pairs.routing()
        # The contract: ``routed`` is membership of the routing set after the tick, also for
        # a pair that moved twice in one tick (first seen, then confirmed at once).
        transitions = [t if t.routed == (t.node_id in routing)
                       else dataclasses.replace(t, routed=t.node_id in routing)
                       for t in transitions]
        # Out of routing and present, not a new pair awaiting admission (warming): probe-able.
        away = (HealthState.RETIRED, HealthState.GONE, HealthState.WARMING)
        quarantine = ({n: (p.probe_after_ts if p.probe_after_ts is not None else now_s)
                       for n in pairs.in_order(pairs.unrouted)
                       if (p := pairs[n]).state not in away} if pairs.unrouted else {})
        for t in transitions:
            if t.to_state is HealthState.RETIRED:
                ms.retired_seen[t.node_id] = now_s
        statuses = self._statuses(model, pairs, by_node) if with_statuses else ()
        if wt is not None and statuses:
            statuses = weigh_statuses(statuses, wt)
        return ModelTick(model=model, ts=now_s, transitions=tuple(transitions), routing=routing,
                         quarantine=quarantine, statuses=statuses,
                         fleet_events=tuple(fleet_events), diagnostics=tuple(diagnostics),
                         weights=wt.weights if wt is not None else {},
                         weight_changes=wt.changes if wt is not None else (),
                         fleet_latency_p50_us=fleet_latency_us[0],
                         fleet_latency_p99_us=fleet_latency_us[1])

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

    def _forget_retired(self, model: str, ms: ModelState, by_node: dict[str, WindowSummary],
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
            ms.forget_pair(node)
            by_node.pop(node, None)
            transitions.append(Transition(
                ts=now_s, node_id=node, model=model, from_state=HealthState.RETIRED,
                to_state=HealthState.UNKNOWN, routed=False, reason=Reason.FORGOTTEN.value,
                hardware=p.hardware, from_since_ts=p.since_ts, detail=(
                    f"retired at {utc_text(p.since_ts)}, no sample or heartbeat for {now_s - last:.0f} s "
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
        return ModelState().to_dict() if ms is None else ms.to_dict()

    def restore_model(self, model: str, data: dict[str, Any]) -> None:
        """Replace ``model``'s state by ``data`` (from :meth:`snapshot_model`);
        :class:`ValueError` (nothing changed) when it is of another version or incomplete."""
        self._models[model] = ModelState.from_dict(data)

    def forget_model(self, model: str) -> None:
        """Drop all state of ``model``: its next tick starts it fresh."""
        self._models.pop(model, None)

    def snapshot(self) -> dict[str, Any]:
        return {"version": SNAPSHOT_VERSION,
                "models": {m: self._models[m].to_dict() for m in sorted(self._models)}}

    def restore(self, data: dict[str, Any]) -> None:
        """Replace all state by ``data``; :class:`ValueError` (nothing changed) when it is of
        another version or incomplete."""
        check_version(data, "evaluator")
        models = data.get("models")
        if not isinstance(models, dict):
            raise ValueError(f"evaluator snapshot has no 'models' mapping ({models!r}); "
                             "cannot restore")
        self._models = {str(m): ModelState.from_dict(d) for m, d in models.items()}


def _by_node(summaries: Iterable[WindowSummary]) -> dict[str, WindowSummary]:
    sums = summaries if isinstance(summaries, list) else list(summaries)
    return dict(zip(map(_NODE_ID, sums), sums, strict=True))


def _gather(by_node: Mapping[str, WindowSummary], ms: ModelState, st: DetectorSettings) -> PeerSet:
    return gather_peers(by_node, ms.pairs, st.min_samples, ms.pairs.rare, ms.pairs.streaked)


def _hist_model(signal: str | None, by_node: Mapping[str, WindowSummary]) -> bool:
    """Judged by the histogram rules: its peers are histogram pairs (or, with no peers yet,
    its pairs are)."""
    if signal is not None:
        return signal.endswith(HIST_SIGNAL)
    return any(s.signal.endswith(HIST_SIGNAL) for s in by_node.values())
