"""Stage 1: latency events → per-(node, model) windows → one summary per series per tick.

:class:`Stage1` is the Kafka-free logic; :mod:`tailguard.streaming.ingest` feeds it records from
the ``latency-events`` partitions this worker owns. Entry points: :meth:`Stage1.ingest` (one
poll), :meth:`Stage1.summaries`, :meth:`Stage1.cluster_digests`, :meth:`Stage1.forget_silent`.
In full: docs/operations.md ("Stage 1's windows"), docs/operating.md ("Floods").

Guarantees:

* Every record reaches the windows or comes back as a
  :class:`~tailguard.streaming.deadletter.DeadLetter`; a bad record never stops the others of
  its poll. Keys and headers are not read here.
* :meth:`Stage1.summaries` covers only series last seen on a partition this worker still
  owns, oldest-admitted series first.
* At most ``max_new_pairs_per_tick`` new pairs per model enter between two ticks, and at most
  ``max_models`` models are held; the rest are dropped and counted (``new_pair_limit``,
  ``model_limit``). Both limits fall on new ids only: a pair already held is never refused.
* A sample older than ``max_sample_age_s`` on arrival is kept (never judged), counted and
  logged (at most once per :data:`LATE_LOG_INTERVAL_S`). Memory is bounded by the number of
  series; silent series are forgotten after ``forget_after_s``, a large drop is given back.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import compress
from typing import Any, Protocol

from tailguard.core.contract import ids
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import Event, Heartbeat, SampleBatch
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.contract.ids import Allowlist
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window.accumulate import Accumulator
from tailguard.core.window.signals import ModelChoice
from tailguard.streaming import memory
from tailguard.streaming.deadletter import DeadLetter, RecordLike
from tailguard.streaming.memory import GIVE_BACK_MIN, give_back
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.wire import ClusterDigest

log = logging.getLogger(__name__)

_series_key = operator.itemgetter(0, 1)     # a WindowSummary's (node_id, model)

# Model names of a flood named in the once-per-tick warning.
MODEL_NAMES_LOGGED = 5
# How often at most stage 1 warns about samples that arrive too old to be judged.
LATE_LOG_INTERVAL_S = 60.0


class WindowStoreLike(Protocol):
    """What stage 1 needs of ``tailguard.core.window.window.WindowStore``."""

    def observe(self, batch: SampleBatch) -> Any: ...

    def observe_heartbeat(self, hb: Heartbeat) -> Any: ...

    def observe_histogram(self, ev: HistogramBatch) -> Any: ...

    def summaries(self, now_s: float,
                  judge_since: Mapping[tuple[str, str], float] | None = None,
                  *, out_of_fit: Collection[tuple[str, str]] = (),
                  tail_refs: Mapping[str, float] | None = None,
                  choices: Mapping[str, ModelChoice] | None = None,
                  evidence: bool = False) -> list[WindowSummary]: ...

    def model_digests(self, now_s: float) -> dict[str, dict[str, Any]]: ...

    def series_count(self) -> int: ...

    def forget(self, node_id: str, model: str) -> bool: ...

    def forget_silent(self, before_s: float) -> list[tuple[str, str]]: ...

    def compact(self) -> int: ...


class Stage1:
    """Windows of the series this worker owns (see the module docstring)."""

    def __init__(self, store: WindowStoreLike, settings: DetectorSettings,
                 metrics: WorkerMetrics | None = None) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self._partition_of: dict[tuple[str, str], int] = {}
        self._late = self._late_of = 0             # since the last warning: late, all samples
        self._late_newest_ts = 0.0
        self._late_logged_s = -LATE_LOG_INTERVAL_S
        #: Registered node ids (set by the ingest edge when an allowlist is configured).
        self.allowlist: Allowlist | None = None
        # New pairs admitted per model since the last tick, and what was dropped over the limit:
        # model -> [messages (samples or heartbeats) dropped, samples among them].
        self._admitted: dict[str, int] = {}
        self._refused: dict[str, list[int]] = {}
        self._full: set[bytes] = set()      # models (UTF-8) whose budget is used up this tick
        # Pairs held per model (max_models), and the new models refused since the last tick:
        # model -> [messages, samples or heartbeats].
        self._model_pairs: dict[str, int] = {}
        # Refused since the last tick: [messages, samples]; the first few model names (a flood
        # of names must not be stored one by one: that memory would outlive it).
        self._models_refused = [0, 0]
        self._models_refused_names: list[str] = []
        self._flooding = False              # the last tick refused a flood's messages

    def ingest(self, partition: int, records: Sequence[RecordLike], now_s: float) -> list[DeadLetter]:
        """Decode ``records`` (all from ``partition``) into the windows; return the bad ones."""
        acc = Accumulator(now_s=now_s, settings=self.settings, allow=self.allowlist)
        dead: list[DeadLetter] = []
        add = acc.add
        full = self._full
        skipped = skipped_models = 0
        for rec in records:
            raw = rec.value
            if (full or self._models_refused[0]) and rec.key is not None:
                over = self._over_limit(rec.key)
                if over is not None:
                    if over:
                        skipped_models += 1
                    else:
                        skipped += 1
                    continue
            if not raw:
                dead.append(DeadLetter.of(rec, "empty_message", "message has no value (tombstone)"
                                          if raw is None else "message value is empty"))
                continue
            try:
                add(raw)
            except BadEvent as e:
                dead.append(DeadLetter.of(rec, e.reason, str(e)))
            except Exception as e:  # a parser bug must not drop the rest of the poll
                dead.append(DeadLetter.of(rec, "internal_error", f"{type(e).__name__}: {e}"[:300]))
        samples = rejected = late = refused = over_models = 0
        late_before = now_s - self.settings.max_sample_age_s
        part = self._partition_of
        limit = self.settings.max_new_pairs_per_tick
        max_models = self.settings.max_models
        admitted = self._admitted
        model_pairs = self._model_pairs
        for ev in acc.drain():
            key = (ev.node_id, ev.model)
            if key not in part:
                held = model_pairs.get(ev.model)
                if held is None and max_models and len(model_pairs) >= max_models:
                    over_models += self._refuse_model(ev)
                    continue
                if limit:
                    n_new = admitted.get(ev.model, 0)
                    if n_new >= limit:
                        refused += self._refuse(ev)
                        self._full.add(ev.model.encode())
                        continue
                    admitted[ev.model] = n_new + 1
                model_pairs[ev.model] = (held or 0) + 1
            if isinstance(ev, Heartbeat):
                self.store.observe_heartbeat(ev)
            elif isinstance(ev, HistogramBatch):
                self.store.observe_histogram(ev)
                samples += ev.observations
            else:
                self.store.observe(ev)
                samples += len(ev)
                rejected += ev.rejected
                if ev.ts.min() < late_before:
                    old = ev.ts[ev.ts < late_before]
                    late += old.size
                    self._late_newest_ts = max(self._late_newest_ts, float(old.max()))
            part[key] = partition
        self._note_late(late, samples, now_s)
        m = self.metrics
        if m is not None:
            if refused or skipped:
                m.samples_dropped.labels(reason="new_pair_limit").inc(refused + skipped)
            if over_models or skipped_models:
                m.samples_dropped.labels(reason="model_limit").inc(over_models + skipped_models)
            m.events_in.inc(len(records))
            m.samples_in.inc(samples)
            if rejected:
                m.rejected_samples.inc(rejected)
            if late:
                m.late_samples.inc(late)
            for d in dead:
                m.bad_events.labels(topic=d.topic, reason=d.reason).inc()
        return dead

    def _over_limit(self, key: bytes) -> bool | None:
        """Whether a record keyed ``node|model`` (the recommended key) is of a new pair of a
        model whose new-pair budget is used up this tick, or of a new model while
        ``max_models`` are held: then it is dropped (and counted as one) without decoding
        its value, so a flood costs little more than reading it. None: not dropped; False:
        dropped by the new-pair limit; True: by the model limit."""
        node, sep, model = key.partition(b"|")
        if not sep:
            return None
        full = model in self._full
        if not full and not self._models_refused[0]:
            return None
        try:
            pair = (node.decode(), model.decode())
        except UnicodeDecodeError:
            return None
        if pair in self._partition_of:
            return None
        if full:
            r = self._refused[pair[1]]
            r[0] += 1
            r[1] += 1
            return False
        if pair[1] in self._model_pairs:
            return None
        self._note_model_refused(pair[1], 1)
        return True

    def _refuse_model(self, ev: Event) -> int:
        """Drop ``ev`` of a new model over ``max_models``; how many samples."""
        n = len(ev) if isinstance(ev, SampleBatch) else 1
        self._note_model_refused(ev.model, n)
        return n

    def _note_model_refused(self, model: str, samples: int) -> None:
        r = self._models_refused
        r[0] += 1
        r[1] += samples
        names = self._models_refused_names
        if len(names) < MODEL_NAMES_LOGGED and model not in names:
            names.append(model)

    def _refuse(self, ev: Event) -> int:
        """Drop ``ev`` of a new pair over the limit; how many samples (a heartbeat or a
        histogram interval: 1)."""
        n = len(ev) if isinstance(ev, SampleBatch) else 1
        r = self._refused.setdefault(ev.model, [0, 0])
        r[0] += 1
        r[1] += n
        return n

    def _end_admission_tick(self) -> None:
        """A new tick: every model may admit ``max_new_pairs_per_tick`` new pairs again; one
        warning per model that hit the limit since the last tick."""
        for model, (messages, samples) in sorted(self._refused.items()):
            log.warning(
                "model %r: %d new (node, model) pairs were admitted since the last tick, the"
                " limit (max_new_pairs_per_tick); %d more messages (%d samples or heartbeats) of"
                " further new pairs were dropped. A flood of node ids, or a fleet larger than the"
                " limit starting at once (it is admitted over the next ticks). Raise"
                " TAILGUARD_MAX_NEW_PAIRS_PER_TICK if the ids are real.",
                model, self._admitted.get(model, 0), messages, samples)
        messages, samples = self._models_refused
        if messages:
            log.warning(
                "%d models are held, the limit (max_models); %d messages (%d samples or"
                " heartbeats) of further models (%s, ...) were dropped. A flood of model names,"
                " or more models than the limit: raise TAILGUARD_MAX_MODELS if the models are"
                " real (a held model is released when its series are forgotten,"
                " TAILGUARD_FORGET_AFTER_S).", len(self._model_pairs), messages, samples,
                ", ".join(repr(m[:60]) for m in self._models_refused_names))
        # When a flood ends (a tick that refused many messages, then one that did not), what
        # reading and dropping its records cost is given back; not during it (a full
        # collection and a trim every tick would slow ingestion).
        flooding = messages + sum(r[0] for r in self._refused.values()) >= GIVE_BACK_MIN
        if self._flooding and not flooding:
            memory.give_back_soon()
        self._flooding = flooding
        self._admitted = {}
        self._refused = {}
        self._full = set()
        self._models_refused = [0, 0]
        self._models_refused_names = []

    def _note_late(self, late: int, samples: int, now_s: float) -> None:
        self._late += late
        self._late_of += samples
        if not self._late or now_s - self._late_logged_s < LATE_LOG_INTERVAL_S:
            return
        log.warning(
            "%d of %d samples received since the last report were older than max_sample_age_s"
            " = %g s on arrival (the newest of them has ts %.3f; this worker's clock reads %.3f):"
            " they are kept but never judged. Check that the producers' clocks are right and"
            " that ts is Unix seconds; a consumer catching up on a backlog shows this too."
            " TAILGUARD_MAX_SAMPLE_AGE_S sets the bound.", self._late, self._late_of,
            self.settings.max_sample_age_s, self._late_newest_ts, now_s)
        self._late = self._late_of = 0
        self._late_newest_ts = 0.0
        self._late_logged_s = now_s

    def revoke(self, partitions: Iterable[int]) -> int:
        """Forget the series last seen on ``partitions`` (moved to another worker)."""
        gone = set(partitions)
        keys = [k for k, p in self._partition_of.items() if p in gone]
        for node, model in keys:
            self.store.forget(node, model)
            del self._partition_of[(node, model)]
            self._release_pair(model)
        self._compact(len(keys), store=True)
        return len(keys)

    def _release_pair(self, model: str) -> None:
        """One pair of ``model`` is no longer held (a model with none left is released)."""
        n = self._model_pairs.get(model, 0) - 1
        if n > 0:
            self._model_pairs[model] = n
        else:
            self._model_pairs.pop(model, None)

    def _compact(self, gone: int, *, store: bool) -> None:
        """After ``gone`` series were dropped: when they were at least as many as are left,
        rebuild the per-series map (a dict keeps its largest table), compact the store if
        ``store``, and when they were many give the memory back to the system."""
        if not gone or gone < len(self._partition_of):
            return
        self._partition_of = dict(self._partition_of)    # keeps the admission order
        self._model_pairs = dict(self._model_pairs)
        if store:
            self.store.compact()
        if gone >= GIVE_BACK_MIN:
            ids.rule(self.settings.id_pattern).forget()    # it remembers the flood's ids
            give_back()

    def forget_silent(self, now_s: float) -> int:
        """Drop the windows of series silent for ``forget_after_s`` (0: never); how many."""
        after_s = self.settings.forget_after_s
        if after_s <= 0:
            return 0
        gone = self.store.forget_silent(now_s - after_s)
        for key in gone:
            if self._partition_of.pop(key, None) is not None:
                self._release_pair(key[1])
        self._compact(len(gone), store=False)   # WindowStore.forget_silent compacted itself
        return len(gone)

    def summaries(self, now_s: float, owned_partitions: Collection[int] | None = None,
                  judge_since: Mapping[tuple[str, str], float] | None = None,
                  out_of_fit: Collection[tuple[str, str]] = (),
                  tail_refs: Mapping[str, float] | None = None,
                  signals: Mapping[str, ModelChoice] | None = None,
                  ) -> list[WindowSummary]:
        """This tick's summary of every owned series (all series when ``owned_partitions`` is None),
        oldest-admitted series first; starts a new admission tick (``max_new_pairs_per_tick``).

        Stage 2's hints (``tailguard.streaming.hints.StageHints``): ``judge_since``
        ``{(node, model): ts}`` cut-offs of judged samples
        (``FleetEvaluator.judge_since``); ``out_of_fit`` the pairs out of
        routing, which do not vote in the fleet-wide ``normalized`` fit
        (``FleetEvaluator.out_of_fit``). The fit is made from every series
        this store holds, owned or not. ``tail_refs`` ``{model: threshold}``
        (``FleetEvaluator.tail_ref``): fresh samples above it are counted. ``signals``
        ``{model: ModelChoice}``: each model's signal as stage 2 chose it from every worker's
        summaries (:mod:`tailguard.core.judge.signal_choice`), which carry what it needs; a
        model without one is judged on this store's own choice, and its summaries say so.
        """
        self._end_admission_tick()
        out = self.store.summaries(now_s, judge_since, out_of_fit=out_of_fit, tail_refs=tail_refs,
                                   choices=signals, evidence=True)
        part = self._partition_of
        keys = list(map(_series_key, out))
        if owned_partitions is not None:
            owned = set(owned_partitions)
            keep = [part.get(k, -1) in owned for k in keys]
            out = list(compress(out, keep))
            keys = list(compress(keys, keep))
        # Known series first: a flood's new pairs were admitted last (dicts keep insertion order).
        rank = dict(zip(part, range(len(part)), strict=True))
        last = len(rank)
        ranks = [rank.get(k, last) for k in keys]
        out = [out[i] for i in sorted(range(len(out)), key=ranks.__getitem__)]   # stable
        if self.metrics is not None:
            self.metrics.series_tracked.set(self.store.series_count())
            self.metrics.summaries_out.inc(len(out))
        memory.after_tick()
        return out

    def cluster_digests(self, now_s: float, source: str) -> list[ClusterDigest]:
        """Per model, this worker's share of the cluster-wide raw latency at ``now_s``."""
        out = []
        for model, d in self.store.model_digests(now_s).items():
            nodes = int(d.pop("nodes", 0))
            out.append(ClusterDigest(model, now_s, source, nodes, d))
        return out
