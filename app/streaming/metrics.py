"""Prometheus metrics of the worker, on an injected registry.

:class:`WorkerMetrics` owns every metric the worker exports. The
:class:`~prometheus_client.CollectorRegistry` is a constructor argument, so
each test (and each in-process worker) gets its own and nothing leaks
through the global default registry. :meth:`WorkerMetrics.serve` starts the
HTTP endpoint (``TAILGUARD_METRICS_PORT``; 0 disables it).

It also implements :class:`tailguard.routing.writer.WriterMetrics`, so the Redis
writer's failures land on the same registry.
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tailguard.core.contract.types import HealthState, ModelTick
from tailguard.core.window.hist_window import PREFERENCE as HIST_METRICS

_TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STAGE1_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0)


class WorkerMetrics:
    """The worker's metrics (names prefixed ``tailguard_``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.events_in = Counter("tailguard_events_in", "latency-event messages consumed "
                                 "(any form, good or bad)", registry=r)
        self.bad_events = Counter("tailguard_bad_events", "input messages rejected and "
                                  "dead-lettered", ["topic", "reason"], registry=r)
        self.samples_in = Counter("tailguard_samples_in", "latency samples added to windows "
                                  "(rate() of this is samples/s)", registry=r)
        self.rejected_samples = Counter("tailguard_rejected_samples", "bad samples dropped "
                                        "from otherwise good batch messages", registry=r)
        self.late_samples = Counter("tailguard_late_samples", "samples already older than "
                                    "max_sample_age_s (event time against this worker's "
                                    "clock) when they arrived: kept, never judged", registry=r)
        self.series_tracked = Gauge("tailguard_series_tracked", "(node, model) windows held "
                                    "by this worker's stage 1", registry=r)
        self._handoff_metrics(r)
        self.tick_seconds = Histogram("tailguard_evaluation_seconds", "stage-2 evaluation "
                                      "time per tick (all owned models)", registry=r,
                                      buckets=_TICK_BUCKETS_S)
        self.nodes = Gauge("tailguard_nodes", "nodes per health state per model (owned "
                           "models only)", ["model", "state"], registry=r)
        self.cluster_latency = Gauge("tailguard_cluster_latency_us", "cluster-wide raw "
                                     "latency quantile per model (µs), merged from every "
                                     "worker's t-digest at the last tick", ["model", "quantile"],
                                     registry=r)
        self.transitions = Counter("tailguard_transitions", "health transitions published",
                                   ["to"], registry=r)
        self.redis_write_failures = Counter("tailguard_redis_write_failures", "failed writes "
                                            "of a routing verdict to Redis (retried)",
                                            ["model"], registry=r)
        self.redis_model_rejections = Counter("tailguard_redis_model_rejections", "routing "
                                              "writes Redis refused for one model's keys "
                                              "(e.g. WRONGTYPE): that model backs off, the "
                                              "others are written", ["model"], registry=r)
        self.summaries_dropped = Counter("tailguard_summaries_dropped", "stage-1 summaries stage 2 "
                                         "did not evaluate, by reason (superseded by a newer one, "
                                         "stale, another worker's model, forgotten pair; "
                                         "send_deadline: not sent by stage 1 within its tick "
                                         "budget; model_limit: a new model over max_models)",
                                         ["reason"], registry=r)
        self.diagnostics_dropped = Counter("tailguard_diagnostics_dropped", "diagnostics "
                                           "results that answer no current request, by reason "
                                           "(no_episode, no_request_id, wrong_request, "
                                           "before_request): not applied", ["reason"], registry=r)
        self.publish_dropped = Counter("tailguard_publish_dropped", "stage-2 messages (health "
                                       "changes, fleet events, diagnostics requests) dropped "
                                       "unpublished: the oldest, when the backlog of a failing "
                                       "topic outgrew TAILGUARD_PUBLISH_BACKLOG_BYTES",
                                       ["topic"], registry=r)
        self.publish_backlog_bytes = Gauge("tailguard_publish_backlog_bytes", "bytes of stage-2 "
                                           "messages waiting to be published (retried every "
                                           "tick; routing is written to Redis meanwhile)",
                                           registry=r)
        self.samples_dropped = Counter("tailguard_samples_dropped", "samples (and heartbeats) "
                                       "stage 1 did not add to a window, by reason "
                                       "(new_pair_limit: a new pair over "
                                       "max_new_pairs_per_tick; model_limit: a new model "
                                       "over max_models)", ["reason"], registry=r)
        self.table_write_failures = Counter("tailguard_table_write_failures", "failed "
                                            "writes of stage-2 state or hints to their "
                                            "changelog tables (retried next tick)", registry=r)
        self.routing_empty_refused = Counter("tailguard_routing_empty_refused", "verdicts "
                                             "not written because they would empty a "
                                             "routing set", ["model"], registry=r)
        self.consumer_lag = Gauge("tailguard_consumer_lag", "messages behind the end of "
                                  "the partition (latency-events, per owned partition)",
                                  ["topic", "partition"], registry=r)
        self.owned_models = Gauge("tailguard_owned_models", "models whose stage-2 partition "
                                  "this worker owns", registry=r)
        self.last_tick_ts = Gauge("tailguard_last_tick_timestamp_seconds", "Unix time of "
                                  "this worker's last stage-2 tick (alert when it stops)",
                                  registry=r)
        self.fleet_events = Counter("tailguard_fleet_events", "fleet events published, by "
                                    "kind (load_event, error_storm, baseline_shift, …_end)",
                                    ["model", "kind"], registry=r)
        self.observe_mode = Gauge("tailguard_observe_mode", "1 while the model is in observe "
                                  "mode (verdicts published, not enforced), else 0",
                                  ["model"], registry=r)
        self.overrides = Gauge("tailguard_operator_overrides", "operator overrides in force "
                               "per model", ["model", "action"], registry=r)
        self.routed_nodes = Gauge("tailguard_routed_nodes", "nodes in the routing set "
                                  "written for the model", ["model"], registry=r)
        self.ejection_cap = Gauge("tailguard_ejection_cap_nodes", "how many of the model's "
                                  "nodes the rules may take out (max_ejected_fraction)",
                                  ["model"], registry=r)
        self.rules_out = Gauge("tailguard_rules_out_nodes", "nodes the rules keep out of "
                               "routing (ejected, quarantined, retired)", ["model"], registry=r)
        self.held_by_cap = Gauge("tailguard_held_by_cap_nodes", "confirmed abnormal nodes "
                                 "kept in routing because the model is at its ejection cap "
                                 "(or it is the last routed node)", ["model"], registry=r)
        self.unresolved = Gauge("tailguard_unresolved_first_bound_seconds", "first bucket bound below which most "
                                "peers' P50 lie: unresolved (docs/scrape.md)", ["model", "metric"], registry=r)
        self.operator_read_failures = Counter("tailguard_operator_read_failures", "failed "
                                              "reads of operator overrides/modes from Redis "
                                              "(the last ones read stay in force)", registry=r)
        self._weight_metrics(r)
        self._weighted: dict[str, set[str]] = {}      # model -> nodes with a node_weight series
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def _handoff_metrics(self, r: CollectorRegistry) -> None:
        """Stage 1's summaries on their way to stage 2 (tailguard.streaming.summary_batch), and
        stage 2's hints back (tailguard.streaming.hints_feed)."""
        self.bad_hints = Counter("tailguard_bad_hints", "stage-2 hints records (or parts of "
                                 "them) stage 1 could not read and skipped, by reason (not_json, "
                                 "packed, not_object, signal, judge_since)", ["reason"], registry=r)
        self.summaries_out = Counter("tailguard_summaries_out", "window summaries sent to "
                                     "stage 2", registry=r)
        self.summaries_in = Counter("tailguard_summaries_in", "window summaries stage 2 "
                                    "received (from every worker's stage 1)", registry=r)
        self.stage1_tick_seconds = Histogram("tailguard_stage1_tick_seconds", "stage-1 tick "
                                             "time: from the tick's boundary until its "
                                             "summaries were sent to stage 2", registry=r,
                                             buckets=_STAGE1_BUCKETS_S)

    def _weight_metrics(self, r: CollectorRegistry) -> None:
        """The routing-weight metrics (tailguard.core.judge.weights)."""
        self.node_weight = Gauge("tailguard_node_weight", "routing weight the rules gave a routed node "
                                 "(0..1] for nodes that were weighted below 1.0 while routed "
                                 "(1.0 once back; no series for the others: weight 1.0)",
                                 ["model", "node"], registry=r)
        self.weighted_nodes = Gauge("tailguard_weighted_nodes", "routed nodes below weight "
                                    "1.0 per model", ["model"], registry=r)
        self.weight_changes = Counter("tailguard_weight_changes", "routing-weight events "
                                      "published (rate-limited)", ["model"], registry=r)

    # --- WriterMetrics (tailguard.routing.writer) ---------------------------------
    def write_failed(self, model: str, error: BaseException) -> None:
        self.redis_write_failures.labels(model=model).inc()

    def model_rejected(self, model: str, error: BaseException) -> None:
        self.redis_model_rejections.labels(model=model).inc()

    def empty_refused(self, model: str) -> None:
        self.routing_empty_refused.labels(model=model).inc()

    def written(self, model: str, *, changed: bool, version: int) -> None:
        pass

    # --- helpers -------------------------------------------------------------
    def set_node_states(self, model: str, counts: dict[HealthState, int]) -> None:
        for state in HealthState:
            self.nodes.labels(model=model, state=str(state)).set(counts.get(state, 0))

    def set_cluster_latency(self, model: str, p50_us: float | None,
                            p99_us: float | None) -> None:
        for q, v in (("0.5", p50_us), ("0.99", p99_us)):
            if v is None:
                with contextlib.suppress(KeyError):
                    self.cluster_latency.remove(model, q)
            else:
                self.cluster_latency.labels(model=model, quantile=q).set(v)

    def set_operator_view(self, model: str, mode: str, overrides: Iterable[Any], tick: ModelTick,
                          *, max_ejected_fraction: float) -> None:
        """Mode, overrides and the routing/cap gauges of one model after the operator edge."""
        self.observe_mode.labels(model=model).set(1 if mode == "observe" else 0)
        actions = collections.Counter(o.action for o in overrides)
        for action in ("drain", "pin"):
            self.overrides.labels(model=model, action=action).set(actions.get(action, 0))
        self.routed_nodes.labels(model=model).set(len(tick.routing))
        known = [s for s in tick.statuses if s.state is not HealthState.UNKNOWN]
        self.ejection_cap.labels(model=model).set(
            math.floor(max_ejected_fraction * len(known) + 1e-9))
        self.rules_out.labels(model=model).set(sum(1 for s in known if not s.routed))
        self.held_by_cap.labels(model=model).set(
            sum(1 for s in known if s.reason == "ejection_cap" and s.routed))
        self.set_unresolved(model, dict(tick.unresolved))

    def set_unresolved(self, model: str, bounds_s: Mapping[str, float]) -> None:
        """``metric -> first bound`` of the model's unresolved metrics; the others' series removed."""
        for metric in HIST_METRICS:
            if metric in bounds_s:
                self.unresolved.labels(model=model, metric=metric).set(bounds_s[metric])
            else:
                with contextlib.suppress(KeyError):
                    self.unresolved.remove(model, metric)

    def set_weights(self, model: str, weights: Mapping[str, float],
                    routing: AbstractSet[str]) -> None:
        """The weight gauges of one model after its tick: ``weights`` (routed nodes below 1.0)
        and the routing set (a node weighted before and still routed is at 1.0; one that left
        routing loses its series)."""
        seen = self._weighted.setdefault(model, set())
        for node in sorted(seen - weights.keys()):
            if node in routing:
                self.node_weight.labels(model=model, node=node).set(1.0)
            else:
                seen.discard(node)
                with contextlib.suppress(KeyError):
                    self.node_weight.remove(model, node)
        for node, w in weights.items():
            self.node_weight.labels(model=model, node=node).set(w)
            seen.add(node)
        self.weighted_nodes.labels(model=model).set(sum(1 for w in weights.values() if w < 1.0))

    def forget_model(self, model: str) -> None:
        for node in self._weighted.pop(model, set()):
            with contextlib.suppress(KeyError):
                self.node_weight.remove(model, node)
        for g in (self.observe_mode, self.routed_nodes, self.ejection_cap, self.rules_out,
                  self.held_by_cap, self.weighted_nodes):
            with contextlib.suppress(KeyError):
                g.remove(model)
        for action in ("drain", "pin"):
            with contextlib.suppress(KeyError):
                self.overrides.remove(model, action)
        for state in HealthState:
            with contextlib.suppress(KeyError):
                self.nodes.remove(model, str(state))
        self.set_cluster_latency(model, None, None)
        self.set_unresolved(model, {})

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Start the HTTP endpoint on ``addr:port`` (no-op for port 0 or when already serving).

        Loopback by default (``TAILGUARD_METRICS_HOST``): exposing it is a choice.
        """
        if port == 0 or self._server is not None:
            return
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
