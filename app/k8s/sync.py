"""The ``k8s-sync`` controller: keeps each gated pod's condition in step with the routing set.

Owns :class:`PodCache` (the pods of one namespace, kept by list + watch from a
``resourceVersion``) and :class:`K8sSync` (each pass: pods + the routing table's held-out
sets → :func:`tailguard.k8s.plan.plan` → one strategic-merge PATCH per pod whose condition must
change). It reads routing through :class:`tailguard.routing.reader.RoutingTable` (pub/sub + version
polling), and acts only while its :class:`~tailguard.k8s.lease.LeaderElector` holds the Lease.

Guarantees:

* **Fast.** A pod event or a routing change wakes a pass at once (a new gated pod gets its
  condition within one round trip); a full pass also runs every ``resync_s``.
* **Fail-safe.** While Redis is unreachable no pass runs, so every pod keeps its last
  condition; a model whose routing was never read gets no patch; :func:`~tailguard.k8s.plan.plan`
  never sets False on more pods than the guard allows.
* **One leader.** Only the Lease holder patches; a new leader computes the same conditions
  from the same Redis, so a takeover changes none.
* **Errors in one line.** A refused patch is counted and logged once per cause, a missing
  RBAC permission naming the verb and resource; the controller keeps going.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from tailguard.k8s import ApiUnreachable, Forbidden, Gone, K8sError
from tailguard.k8s.api import Client
from tailguard.k8s.metrics import SyncMetrics
from tailguard.k8s.plan import FALSE, TRUE, NodeIdRule, Patch, PodView, plan, pod_view
from tailguard.routing.errors import RoutingUnavailable

log = logging.getLogger(__name__)


class Routing(Protocol):
    """What the controller reads of the routing sets (:class:`tailguard.routing.reader.RoutingTable`)."""

    @property
    def reachable(self) -> bool: ...

    def snapshot(self, model: str) -> Any: ...   # ModelRouting | None; .held_out: frozenset[str]

    async def get(self, model: str) -> frozenset[str]: ...


class Leadership(Protocol):
    @property
    def leader(self) -> bool: ...


class AlwaysLeader:
    """Leadership of a single replica run without a Lease (``--no-leader-election``)."""

    leader = True


class PodCache:
    """The pods of ``namespace`` as :class:`PodView`, kept current by list + watch."""

    def __init__(self, client: Client, namespace: str, condition_type: str, rule: NodeIdRule,
                 model_label: str, *, on_change: Callable[[], Any] = lambda: None,
                 metrics: SyncMetrics | None = None, watch_timeout_s: float = 240.0,
                 retry_s: float = 1.0) -> None:
        self.client, self.namespace = client, namespace
        self._condition_type, self._rule, self._model_label = condition_type, rule, model_label
        self._on_change = on_change
        self._metrics = metrics or SyncMetrics()
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s
        self.pods: dict[tuple[str, str], PodView] = {}
        self.synced = False          # a list has completed: the cache is complete
        self._failing: str | None = None

    def _view(self, obj: dict[str, Any]) -> PodView:
        return pod_view(obj, self._condition_type, self._rule, self._model_label)

    def set_condition(self, key: tuple[str, str], status: str) -> None:
        """Record a condition we just patched (the watch confirms it later)."""
        p = self.pods.get(key)
        if p is not None:
            self.pods[key] = replace(p, condition=status)

    async def relist(self) -> str:
        listed = await self.client.list_pods(self.namespace)
        views = [self._view(o) for o in listed.items]
        self.pods = {v.key: v for v in views}
        self.synced = True
        self._on_change()
        return listed.resource_version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        v = self._view(obj)
        if kind == "DELETED":
            self.pods.pop(v.key, None)
        else:
            self.pods[v.key] = v
        self._on_change()

    async def run(self, stop: asyncio.Event) -> None:
        """List, then watch from the list's resourceVersion; re-list on 410 or an error."""
        rv: str | None = None
        while not stop.is_set():
            try:
                if rv is None:
                    rv = await self.relist()
                async for kind, obj in self.client.watch_pods(self.namespace, rv, self._watch_timeout_s):
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind != "BOOKMARK":
                        self._apply(kind, obj)
                self._metrics.watch_restarts.labels("timeout").inc()
                self._recovered()
            except Gone:
                self._metrics.watch_restarts.labels("gone").inc()
                rv = None
            except K8sError as e:
                self._metrics.watch_restarts.labels("error").inc()
                if self._failing != str(e):
                    log.error("k8s-sync: pods of namespace %r: %s; retrying every %g s",
                              self.namespace, e, self._retry_s)
                self._failing = str(e)
                rv = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._retry_s)

    def _recovered(self) -> None:
        if self._failing is not None:
            log.info("k8s-sync: watching the pods of namespace %r again", self.namespace)
            self._failing = None


def _now_rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class K8sSync:
    """One pass = plan + patches (see module docstring). ``run`` repeats it on every wake."""

    def __init__(self, client: Client, pods: PodCache, routing: Routing, condition_type: str, *,
                 max_ejected_fraction: float, leadership: Leadership | None = None,
                 metrics: SyncMetrics | None = None, resync_s: float = 30.0,
                 wall: Callable[[], float] = time.time, wake: asyncio.Event | None = None,
                 max_parallel: int = 8) -> None:
        if not resync_s > 0:
            raise ValueError(f"TAILGUARD_K8S_RESYNC_S must be > 0, got {resync_s!r}")
        self.client, self.pods, self.routing = client, pods, routing
        self.condition_type = condition_type
        self.max_ejected_fraction = max_ejected_fraction
        self.leadership: Leadership = leadership or AlwaysLeader()
        self.metrics = metrics or SyncMetrics()
        self.resync_s = resync_s
        self._wall = wall
        self.wake = wake or asyncio.Event()
        self._sem = asyncio.Semaphore(max_parallel)
        self._logged: dict[str, str] = {}    # cause → last message logged (once per cause)
        self._redis_down_logged = False

    def notify(self, *_args: Any) -> None:
        """Ask for a pass now (pod events, routing changes, leadership gained)."""
        self.wake.set()

    async def held_out_sets(self, models: set[str]) -> dict[str, frozenset[str] | None]:
        """model → its held-out set; ``None`` where its routing is unknown (never read)."""
        out: dict[str, frozenset[str] | None] = {}
        for m in sorted(models):
            snap = self.routing.snapshot(m)
            if snap is None:
                try:
                    await self.routing.get(m)
                except RoutingUnavailable:
                    out[m] = None
                    continue
                snap = self.routing.snapshot(m)
            out[m] = frozenset(snap.held_out) if snap is not None else None
        return out

    async def sync_once(self) -> list[Patch]:
        """One pass; the patches the apiserver accepted. Nothing while not leader, while the pod
        cache is incomplete, or while Redis is unreachable."""
        leader = self.leadership.leader
        self.metrics.leader.set(1 if leader else 0)
        if not leader or not self.pods.synced:
            return []
        views = list(self.pods.pods.values())
        models = {p.model for p in views if p.gated and p.model is not None}
        held = await self.held_out_sets(models) if models else {}
        reachable = self.routing.reachable
        self.metrics.redis_reachable.set(1 if reachable else 0)
        if not reachable:
            if not self._redis_down_logged:
                log.warning("k8s-sync: Redis is unreachable: changing no pod condition until it is back")
                self._redis_down_logged = True
            return []
        if self._redis_down_logged:
            log.info("k8s-sync: Redis reachable again")
            self._redis_down_logged = False
        self.metrics.syncs.inc()
        plans = plan(views, held, self.max_ejected_fraction)
        todo: list[Patch] = []
        for mp in plans:
            if mp.capped:
                self.metrics.guard_held.inc()
                self._log_once(f"cap:{mp.model}", "k8s-sync: " + mp.capped, logging.WARNING)
            else:
                self._logged.pop(f"cap:{mp.model}", None)
            todo.extend(mp.patches)
        done = [p for p in await asyncio.gather(*(self._send(p) for p in todo)) if p is not None]
        self._count_pods()
        return done

    async def _send(self, p: Patch) -> Patch | None:
        cond = {"type": self.condition_type, "status": p.status, "reason": p.reason, "message": p.message,
                "lastTransitionTime": _now_rfc3339(self._wall())}
        async with self._sem:
            if not self.leadership.leader:     # lost the Lease during the pass: stop at once
                return None
            try:
                await self.client.patch_pod_condition(p.pod.namespace, p.pod.name, cond)
            except Forbidden as e:
                self.metrics.patch_errors.labels("forbidden").inc()
                self._log_once("forbidden", f"k8s-sync: {e}", logging.ERROR)
                return None
            except ApiUnreachable as e:
                self.metrics.patch_errors.labels("unreachable").inc()
                self._log_once("unreachable", f"k8s-sync: {e}", logging.ERROR)
                return None
            except K8sError as e:
                reason = "not_found" if e.status == 404 else "other"   # 404: the pod was deleted meanwhile
                self.metrics.patch_errors.labels(reason).inc()
                if reason == "other":
                    self._log_once(f"http{e.status}", f"k8s-sync: pod {p.pod.namespace}/{p.pod.name}: {e}",
                                   logging.ERROR)
                return None
        self._logged.pop("forbidden", None)
        self._logged.pop("unreachable", None)
        self.metrics.patches.labels(p.status).inc()
        self.pods.set_condition(p.pod.key, p.status)
        log.info("k8s-sync: pod %s/%s %s=%s (%s)", p.pod.namespace, p.pod.name, self.condition_type, p.status,
                 p.message)
        return p

    def _log_once(self, cause: str, message: str, level: int) -> None:
        if self._logged.get(cause) != message:
            self._logged[cause] = message
            log.log(level, "%s", message)

    def _count_pods(self) -> None:
        counts = {TRUE: 0, FALSE: 0, "none": 0}
        for p in self.pods.pods.values():
            if p.gated:
                counts[p.condition if p.condition in (TRUE, FALSE) else "none"] += 1
        for cond, n in counts.items():
            self.metrics.pods.labels(cond).set(n)

    async def run(self, stop: asyncio.Event) -> None:
        """A pass on every wake and every ``resync_s`` until ``stop`` is set."""
        while not stop.is_set():
            self.wake.clear()
            try:
                await self.sync_once()
            except Exception:   # a bug in one pass must not end the controller
                log.exception("k8s-sync: a sync pass failed")
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.wake.wait())]
            try:
                await asyncio.wait(waiters, timeout=self.resync_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
