"""Prometheus metrics of the worker, on an injected registry.

:class:`WorkerMetrics` owns every metric the worker exports. The
:class:`~prometheus_client.CollectorRegistry` is a constructor argument, so
each test (and each in-process worker) gets its own and nothing leaks
through the global default registry. :meth:`WorkerMetrics.serve` starts the
HTTP endpoint (``TAILGUARD_METRICS_PORT``; 0 disables it).

It also implements :class:`app.routing.writer.WriterMetrics`, so the Redis
writer's failures land on the same registry.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from app.core.types import HealthState

_TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


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
        self.summaries_out = Counter("tailguard_summaries_out", "window summaries sent to "
                                     "stage 2", registry=r)
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
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # --- WriterMetrics (app.routing.writer) ---------------------------------
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

    def forget_model(self, model: str) -> None:
        for state in HealthState:
            with contextlib.suppress(KeyError):
                self.nodes.remove(model, str(state))
        self.set_cluster_latency(model, None, None)

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
