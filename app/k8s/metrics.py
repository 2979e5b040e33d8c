"""``k8s-sync``'s own Prometheus metrics (``tailguard_k8s_sync_*``), on an injected registry.

Owns :class:`SyncMetrics`: every metric the controller reports, and :meth:`SyncMetrics.serve`
(the HTTP endpoint on ``TAILGUARD_METRICS_HOST:TAILGUARD_METRICS_PORT``; port 0 = none). Each
test builds its own registry, so no metric leaks between tests.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.leader = Gauge("tailguard_k8s_sync_leader", "1 while this replica holds the Lease", registry=r)
        self.redis_reachable = Gauge("tailguard_k8s_sync_redis_reachable",
                                     "1 while the routing set in Redis can be read (0: nothing is changed)",
                                     registry=r)
        self.pods = Gauge("tailguard_k8s_sync_pods", "gated pods by the status of their condition",
                          ["condition"], registry=r)
        self.patches = Counter("tailguard_k8s_sync_patches", "condition patches sent, by the status set",
                               ["status"], registry=r)
        self.patch_errors = Counter("tailguard_k8s_sync_patch_errors",
                                    "condition patches the apiserver refused or never answered, by reason",
                                    ["reason"], registry=r)
        self.guard_held = Counter("tailguard_k8s_sync_guard_held",
                                  "syncs in which a model had more pods held out than the guard allows "
                                  "(no further pod set False)", registry=r)
        self.syncs = Counter("tailguard_k8s_sync_syncs", "passes over the gated pods (as leader)", registry=r)
        self.watch_restarts = Counter("tailguard_k8s_sync_watch_restarts",
                                      "pod watches restarted, by reason (timeout, gone, error)", ["reason"],
                                      registry=r)
        self.webhook_requests = Counter("tailguard_k8s_sync_webhook_requests",
                                        "admission reviews answered, by what was done (gated, unchanged, error)",
                                        ["result"], registry=r)
        for status in ("True", "False"):
            self.patches.labels(status)
        for cond in ("True", "False", "none"):
            self.pods.labels(cond).set(0)
        self._server: Any = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        if port == 0 or self._server is not None:
            return
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
