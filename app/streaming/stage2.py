"""Stage 2: per model, window summaries → health verdict, state kept in a changelog table.

:class:`Stage2` is the Kafka-free logic of the stage-2 agent and timer: it collects the newest
summary per node of each model, the workers' cluster digests (``on_cluster``) and diagnostics
results, and at each tick turns every model this worker owns into a :class:`ModelOutput` with
the core's ``FleetEvaluator`` (the verdict, plus the summaries and streaks it was made from).
Guarantees (in full: docs/operations.md, "Stage 2's state"):

* **Durable state.** A model's changed state goes to ``state``, its stage-1 hints to ``hints``
  (by :meth:`Stage2.persist`, before its next evaluation); a model is restored from ``state``
  before its first evaluation after an (re)assignment. A failed table write is logged, counted
  (``write_failures``) and retried next tick; the verdict is still returned. Large values are
  packed (:mod:`tailguard.streaming.table_values`); one still above ``max_value_bytes`` is counted, not written.
* **Cluster-wide P50/P99** of the workers' fresh digests, in ``ModelTick``; unresolvable buckets warned once.
* **Diagnostics of the current episode only** (its ``request_id``, arrived after it); others
  are dropped, counted by reason (``diagnostics_dropped``), logged once.
* **Only owned models, bounded**: one pending summary per pair, stale ones ignored, at most
  ``max_models`` models judged, every summary left unevaluated counted in ``dropped``.
* **Models are forgotten** with no pair left (the last routed never are) and no sign of life
  for ``forget_after_s``: entries deleted, the last tick (``forgotten``) deletes their keys.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable, Generator, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeAlias

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import ModelTick, Transition, WindowSummary
from tailguard.core.judge.health import diagnostics_refusal
from tailguard.core.judge.hist_resolution import advice
from tailguard.core.judge.signal_choice import choose_for_model
from tailguard.core.replay.detector import FLEET_QUANTILES
from tailguard.core.window.quantiles import digest_quantiles, merge_digests
from tailguard.core.window.signals import ModelChoice
from tailguard.streaming.hints import encode_hints, hints_changed
from tailguard.streaming.memory import GIVE_BACK_MIN, give_back
from tailguard.streaming.summary_batch import SummaryBatch
from tailguard.streaming.table_values import MAX_VALUE_BYTES, PLAIN_MAX_BYTES, pack_value, unpack_value, value_json
from tailguard.streaming.wire import ClusterDigest, DiagnosticsResult, Stage2Message

SeriesKey: TypeAlias = tuple[str, str]

#: Why a diagnostics result was dropped (reason of ``health.diagnostics_refusal`` → log text).
DROP_TEXT = {
    "no_episode": "the node is not out of routing for this model (no open quarantine episode)",
    "no_request_id": "it carries no request_id (an agent older than the request check?)",
    "wrong_request": "its request_id is not the current episode's request (an earlier "
                     "episode's result, or forged)",
    "before_request": "it arrived before the current episode's request was made",
}

log = logging.getLogger(__name__)


class EvaluatorLike(Protocol):
    """What stage 2 needs of ``tailguard.core.judge.evaluate.FleetEvaluator``."""

    def evaluate(self, model: str, summaries: list[WindowSummary], now_s: float) -> ModelTick: ...

    def apply_diagnostics(self, model: str, node_id: str, recoverable: bool,
                          now_s: float) -> list[Transition]: ...

    def judge_since(self, model: str, now_s: float) -> dict[tuple[str, str], float]: ...

    def out_of_fit(self, model: str) -> set[tuple[str, str]]: ...

    def tail_ref(self, model: str) -> float | None: ...

    def snapshot_model(self, model: str) -> dict[str, Any]: ...

    def restore_model(self, model: str, snapshot: dict[str, Any]) -> Any: ...

    def forget_model(self, model: str) -> None: ...

    def pair(self, model: str, node_id: str) -> Any: ...


def state_key(model: str) -> bytes:
    """Key of a model in the state table and on ``node-window-stats`` (raw UTF-8)."""
    return model.encode()


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """What one model's tick produced: the verdict, plus transitions from diagnostics."""

    tick: ModelTick
    diagnostics_transitions: tuple[Transition, ...] = ()
    # What the verdict was made from, for the operator edge (tailguard.streaming.edge): the
    # summaries judged and each node's abnormal streak after the tick.
    summaries: tuple[WindowSummary, ...] = ()
    streaks: Mapping[str, int] = field(default_factory=dict)

    @property
    def transitions(self) -> tuple[Transition, ...]:
        return self.diagnostics_transitions + self.tick.transitions


class Stage2:
    """Per-model evaluation over buffered summaries (see the module docstring)."""

    def __init__(self, evaluator: EvaluatorLike, state: MutableMapping[bytes, Any], *,
                 stale_after_s: float, hints: MutableMapping[bytes, Any] | None = None,
                 max_pending_diagnostics: int = 10_000,
                 max_value_bytes: int = MAX_VALUE_BYTES,
                 plain_max_bytes: int = PLAIN_MAX_BYTES,
                 on_diagnostics_dropped: Callable[[str], None] | None = None,
                 max_models: int | None = None, forget_after_s: float | None = None) -> None:
        """``max_models``/``forget_after_s``: None takes the evaluator's settings (0 = off)."""
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s!r}")
        det = getattr(evaluator, "settings", None)
        self.max_models = int(getattr(det, "max_models", 0) if max_models is None else max_models)
        self.forget_after_s = float(getattr(det, "forget_after_s", 0.0)
                                    if forget_after_s is None else forget_after_s)
        self._held: set[str] = set()            # models judged here (max_models)
        self._heard: dict[str, float] = {}      # model -> the last tick with a summary of it
        self.evaluator = evaluator
        self.state = state
        self.hints = hints
        self._hints_written: dict[str, Any] = {}
        self._signals: dict[str, ModelChoice] = {}   # model -> the last signal choice
        self.stale_after_s = stale_after_s
        self.max_pending_diagnostics = max_pending_diagnostics
        self._pending: dict[str, dict[str, WindowSummary]] = {}
        self._diagnostics: dict[str, collections.deque[DiagnosticsResult]] = {}
        self._restored: set[str] = set()
        # model -> the JSON of its last state written: bytes, not the snapshot's dicts, which
        # would keep ~700 B of small objects a pair between ticks (docs/operating.md#floods).
        self._written: dict[str, bytes] = {}
        self.write_failures = 0
        self.max_value_bytes = max_value_bytes
        self.plain_max_bytes = plain_max_bytes
        self.oversized = 0          # writes refused for size (in write_failures too)
        self._oversized_logged: set[tuple[str, str]] = set()
        self._unresolved_logged: dict[str, frozenset[str]] = {}   # model -> metrics warned of
        self.refused_states = 0     # stored model states that could not be restored
        # Summaries never evaluated, by reason: "superseded" (a newer one of the same pair came
        # first), "stale" (older than stale_after_s at the tick), "not_owned" (another worker's),
        # "forgotten" (of a pair the evaluator dropped or did not take: silent past forget_after_s),
        # "model_limit" (of a new model while max_models are judged).
        self.dropped: collections.Counter[str] = collections.Counter()
        self._cluster: dict[str, dict[str, ClusterDigest]] = {}
        # Diagnostics results that answer no current request (health.diagnostics_refusal), by
        # reason; each reason is logged once, and reported to ``on_diagnostics_dropped``.
        self.diagnostics_dropped: collections.Counter[str] = collections.Counter()
        self.on_diagnostics_dropped = on_diagnostics_dropped
        self._peak_pairs: dict[str, int] = {}    # per model, since its state was last rebuilt

    # --- input ---------------------------------------------------------------
    def on_summary(self, s: WindowSummary) -> None:
        nodes = self._pending.setdefault(s.model, {})
        old = nodes.get(s.node_id)
        if old is None or s.tick_ts >= old.tick_ts:
            nodes[s.node_id] = s
        if old is not None:
            self.dropped["superseded"] += 1

    def on_message(self, msg: Stage2Message) -> int:
        """Take one decoded ``node-window-stats`` message; how many summaries it held."""
        if isinstance(msg, SummaryBatch):
            for s in msg.summaries:
                self.on_summary(s)
            return len(msg.summaries)
        if isinstance(msg, DiagnosticsResult):
            self.on_diagnostics(msg)
        elif isinstance(msg, ClusterDigest):
            self.on_cluster(msg)
        else:
            self.on_summary(msg)
            return 1
        return 0

    def on_cluster(self, c: ClusterDigest) -> None:
        sources = self._cluster.setdefault(c.model, {})
        old = sources.get(c.source)
        if old is None or c.tick_ts >= old.tick_ts:
            sources[c.source] = c

    def on_diagnostics(self, d: DiagnosticsResult) -> None:
        q = self._diagnostics.get(d.model)
        if q is None:
            q = self._diagnostics[d.model] = collections.deque(maxlen=self.max_pending_diagnostics)
        q.append(d)

    def on_assignment_changed(self) -> None:
        """Call after a rebalance: every model is restored from ``state`` before its next tick."""
        self._restored.clear()
        self._written.clear()
        self._hints_written.clear()

    def hinted_models(self) -> set[str]:
        """The models whose hints this worker wrote since its last (re)assignment."""
        return set(self._hints_written)

    def pending_summaries(self) -> int:
        return sum(len(v) for v in self._pending.values())

    # --- the tick ------------------------------------------------------------
    def known_models(self) -> set[str]:
        models = set(self._pending) | set(self._diagnostics)
        for k in list(self.state.keys()):
            models.add(k.decode() if isinstance(k, bytes) else str(k))
        return models

    def tick(self, now_s: float, owns: Callable[[str], bool],
             hints_for_s: float | None = None) -> list[ModelOutput]:
        """Every known model this worker owns judged (:meth:`tick_models`), then each one's
        table writes (:meth:`persist`): the stage-2 ticker's order, without the edge and Redis.

        ``hints_for_s``: the stage-1 tick the ``judge_since`` hints are for (default ``now_s``).
        """
        outs = list(self.tick_models(now_s, owns))
        for o in outs:
            self.persist(o, now_s if hints_for_s is None else hints_for_s)
        return outs

    def tick_models(self, now_s: float, owns: Callable[[str], bool]) -> Generator[ModelOutput, None, None]:
        """Each owned model judged, its output as soon as it is made, so that a caller on an
        event loop lets other work run between models; input of models it does not own is
        dropped. The models are those known when it starts; input that arrives meanwhile is
        kept for the models not yet judged (as it would be before the tick). The model's
        state and hints are not written here: the caller passes each output to
        :meth:`persist` before the model's next evaluation (the ticker does so after every
        model's routing write)."""
        for model in sorted(self.known_models()):
            if not owns(model):
                self.dropped["not_owned"] += len(self._pending.pop(model, {}))
                self._signals.pop(model, None)
                self._diagnostics.pop(model, None)
                self._cluster.pop(model, None)
                self._restored.discard(model)
                self._held.discard(model)
                continue
            if (model not in self._held and self.max_models
                    and len(self._held) >= self.max_models):
                self.dropped["model_limit"] += len(self._pending.pop(model, {}))
                self._diagnostics.pop(model, None)
                self._cluster.pop(model, None)
                continue
            self._held.add(model)
            o = self._evaluate(model, now_s)
            self._warn_unresolved(o.tick)
            # Only a model with no pair left: liveness forgets a pair silent for forget_after_s
            # but keeps the last routed ones, so a lagging stage 1 or a lost telemetry never
            # makes a model with a routing set vanish.
            if (not o.tick.statuses and self.forget_after_s > 0
                    and now_s - self._heard[model] >= self.forget_after_s):
                self._forget(model)
                gone = replace(o.tick, transitions=(), routing=frozenset(), quarantine={},
                               statuses=(), fleet_events=(), diagnostics=(), forgotten=True)
                yield ModelOutput(gone)
                continue
            yield o

    def persist(self, out: ModelOutput, hints_for_s: float) -> None:
        """The table writes of one judged model: its state snapshot (when changed) and its
        stage-1 hints for ``hints_for_s``; the same whenever they are made before the
        model's next evaluation (nothing of the model changes in between)."""
        model = out.tick.model
        if out.tick.forgotten or model not in self._held:
            return
        ev = self.evaluator
        snap = ev.snapshot_model(model)
        self._compact(model, len(out.tick.statuses), snap)
        raw = value_json(snap)
        if self._written.get(model) != raw and self._write(self.state, state_key(model), snap,
                                                           model, "state", raw):
            self._written[model] = raw
        self._write_hints(model, hints_for_s, out.summaries)

    def _warn_unresolved(self, tick: ModelTick) -> None:
        """A warning for each metric the model's buckets cannot resolve (hist_resolution): once,
        and again only after a tick that found it resolved."""
        warned = self._unresolved_logged.get(tick.model, frozenset())
        for metric, bound_s in tick.unresolved:
            if metric not in warned:
                log.warning("%s", advice(tick.model, metric, bound_s))
        if tick.unresolved:
            self._unresolved_logged[tick.model] = frozenset(m for m, _b in tick.unresolved)
        else:
            self._unresolved_logged.pop(tick.model, None)

    def _forget(self, model: str) -> None:
        """Drop everything of ``model``: the evaluator's state, its table entries."""
        self.evaluator.forget_model(model)
        self._unresolved_logged.pop(model, None)
        key = state_key(model)
        for table in (self.state, self.hints):
            if table is None:
                continue
            try:
                del table[key]
            except KeyError:
                pass
            except Exception:  # a table write failed: the model is restored (empty) and retried
                self.write_failures += 1
                log.exception("deleting the state of forgotten model %r failed", model)
        for d in (self._written, self._hints_written, self._signals, self._peak_pairs, self._heard,
                  self._cluster, self._diagnostics, self._pending):
            d.pop(model, None)
        self._restored.discard(model)
        self._held.discard(model)
        log.info("model %r forgotten: no node of it for %.0f s", model, self.forget_after_s)

    def _write_hints(self, model: str, at_s: float, summaries: Iterable[WindowSummary]) -> None:
        if self.hints is None:
            return
        ev = self.evaluator
        det = getattr(ev, "settings", None) or DetectorSettings()
        # The model's signal from every worker's summaries (a tick without any keeps the last).
        choice = choose_for_model(det.signal_for(model), summaries, det.min_samples)
        if choice is None:
            choice = self._signals.get(model)
        else:
            self._signals[model] = choice
        value = encode_hints({node: ts for (node, _m), ts in ev.judge_since(model, at_s).items()},
                             (node for node, _m in ev.out_of_fit(model)), ev.tail_ref(model), choice)
        if hints_changed(self._hints_written.get(model), value) and self._write(
                self.hints, state_key(model), value, model, "hints"):
            self._hints_written[model] = value

    def _write(self, table: MutableMapping[Any, Any], key: bytes, value: Any, model: str,
               what: str, raw: bytes | None = None) -> bool:
        stored, size = pack_value(value, self.plain_max_bytes, raw)
        if size > self.max_value_bytes:
            self.write_failures += 1
            self.oversized += 1
            if (model, what) not in self._oversized_logged:
                self._oversized_logged.add((model, what))
                log.error("the %s of model %r is %d bytes compressed, above the %d bytes a Kafka "
                          "message may carry here: not written (a new stage-2 owner would start from "
                          "an older one) until it fits; it grows with the model's pairs (a flood of "
                          "node ids, or a model of ~9,000 nodes or more: split it)", what, model,
                          size, self.max_value_bytes)
            return False
        self._oversized_logged.discard((model, what))
        try:
            table[key] = stored
        except Exception:  # retried next tick: the caller keeps its last-written marker
            self.write_failures += 1
            log.exception("writing the %s of model %r failed; retried at the next tick",
                          what, model)
            return False
        return True

    def _with_cluster_quantiles(self, tick: ModelTick, horizon: float) -> ModelTick:
        sources = self._cluster.get(tick.model)
        if not sources:
            return tick
        for src in [k for k, c in sources.items() if c.tick_ts < horizon]:
            del sources[src]
        if not sources:
            del self._cluster[tick.model]
            return tick
        q = digest_quantiles(merge_digests(c.digest for c in sources.values()),
                             FLEET_QUANTILES)
        if q is None:
            return tick
        return replace(tick, fleet_latency_p50_us=q[0], fleet_latency_p99_us=q[1])

    def _compact(self, model: str, pairs: int, snap: dict[str, Any]) -> None:
        """After a model lost most of its pairs at once, rebuild its state from ``snap`` (the
        same state, in dicts sized for what is left) and give the memory back."""
        peak = max(self._peak_pairs.get(model, 0), pairs)
        if 2 * pairs <= peak and peak - pairs >= GIVE_BACK_MIN:
            self.evaluator.restore_model(model, snap)
            self._written.pop(model, None)      # the large last-written state: written anew
            give_back()
            peak = pairs
        self._peak_pairs[model] = peak

    def _drop_diagnostics(self, d: DiagnosticsResult, why: str) -> None:
        self.diagnostics_dropped[why] += 1
        if self.on_diagnostics_dropped is not None:
            self.on_diagnostics_dropped(why)
        if self.diagnostics_dropped[why] == 1:
            log.warning("dropping a diagnostics result for %r/%r (request %r, recoverable=%s): "
                        "%s; counted in tailguard_diagnostics_dropped_total{reason=%r}, logged once "
                        "per reason", d.node_id, d.model, d.request_id, d.recoverable,
                        DROP_TEXT[why], why)

    def _evaluate(self, model: str, now_s: float) -> ModelOutput:
        ev = self.evaluator
        key = state_key(model)
        if model not in self._restored:
            snap = self.state.get(key)
            if snap is not None:
                try:
                    snap = unpack_value(snap)
                    ev.restore_model(model, snap)
                except ValueError as e:   # another version or malformed: overwritten this tick
                    self.refused_states += 1
                    ev.forget_model(model)
                    log.warning("the stored state of model %r cannot be restored (%s); "
                                "the model starts fresh", model, e)
                else:
                    self._written[model] = value_json(snap)
            self._restored.add(model)
        diag: list[Transition] = []
        for d in self._diagnostics.pop(model, ()):
            why = diagnostics_refusal(ev.pair(model, d.node_id), d.request_id, d.arrived_ts)
            if why is None:
                diag.extend(ev.apply_diagnostics(model, d.node_id, d.recoverable, now_s))
            else:
                self._drop_diagnostics(d, why)
        horizon = now_s - self.stale_after_s
        pending = self._pending.pop(model, {})
        # The model's last sign of life: its nodes' (stage 1 still reports a silent series
        # until it forgets it), or the first tick here.
        heard = max((s.last_seen_ts if s.last_seen_ts is not None else now_s
                     for s in pending.values()), default=None)
        if heard is not None or model not in self._heard:
            self._heard[model] = max(self._heard.get(model, -math.inf),
                                     now_s if heard is None else heard)
        summaries = [s for s in pending.values() if s.tick_ts >= horizon]
        if len(summaries) < len(pending):
            self.dropped["stale"] += len(pending) - len(summaries)
        tick = self._with_cluster_quantiles(ev.evaluate(model, summaries, now_s), horizon)
        forgotten = sum(1 for s in summaries if ev.pair(model, s.node_id) is None)
        if forgotten:
            self.dropped["forgotten"] += forgotten
        streaks = {}
        for st in tick.statuses:
            p = ev.pair(model, st.node_id)
            if p is not None and p.abnormal_streak:
                streaks[st.node_id] = int(p.abnormal_streak)
        return ModelOutput(tick, tuple(diag), tuple(summaries), streaks)
