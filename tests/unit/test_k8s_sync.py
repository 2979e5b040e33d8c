"""``k8s-sync`` against a fake apiserver (tailguard.k8s.testing) and a fake routing table."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from tailguard.k8s import Forbidden
from tailguard.k8s.api import Client
from tailguard.k8s.metrics import SyncMetrics
from tailguard.k8s.plan import FALSE, TRUE, NodeIdRule
from tailguard.k8s.sync import K8sSync, PodCache
from tailguard.k8s.testing import FakeApiServer, pod
from tailguard.routing.errors import RoutingUnavailable

COND = "tailguard.io/routable"


@dataclass
class Snap:
    held_out: frozenset[str]


@dataclass
class FakeRouting:
    held: dict[str, frozenset[str]] = field(default_factory=dict)
    reachable: bool = True
    reads: int = 0

    def snapshot(self, model: str) -> Snap | None:
        return Snap(self.held[model]) if model in self.held and self.reads else None

    async def get(self, model: str) -> frozenset[str]:
        if not self.reachable:
            raise RoutingUnavailable(model, ConnectionError("down"))
        self.reads += 1
        self.held.setdefault(model, frozenset())
        return frozenset()


@dataclass
class Leader:
    leader: bool = True


@dataclass
class Rig:
    api: FakeApiServer
    routing: FakeRouting
    sync: K8sSync
    cache: PodCache
    metrics: SyncMetrics
    leadership: Leader


@contextlib.asynccontextmanager
async def rig(pods: list[dict[str, object]], held: dict[str, frozenset[str]] | None = None,
              run: bool = False) -> AsyncIterator[Rig]:
    api = FakeApiServer(pods)   # type: ignore[arg-type]
    client = Client(api)
    metrics = SyncMetrics(CollectorRegistry())
    routing = FakeRouting(dict(held or {}))
    leadership = Leader()
    wake = asyncio.Event()
    cache = PodCache(client, "default", COND, NodeIdRule.parse("name"), "tailguard.io/model",
                     on_change=wake.set, metrics=metrics, retry_s=0.05)
    sync = K8sSync(client, cache, routing, COND, max_ejected_fraction=0.5, leadership=leadership,
                   metrics=metrics, resync_s=60.0, wake=wake)
    stop = asyncio.Event()
    tasks = []
    if run:
        tasks = [asyncio.create_task(cache.run(stop)), asyncio.create_task(sync.run(stop))]
    else:
        await cache.relist()
    try:
        yield Rig(api, routing, sync, cache, metrics, leadership)
    finally:
        stop.set()
        api.end_watches()
        await asyncio.gather(*tasks)


async def eventually(pred: Callable[[], bool | Awaitable[bool]], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def conditions(api: FakeApiServer) -> dict[str, str | None]:
    return {name: api.condition(name) for (_, name) in api.pods}


async def test_held_out_pod_goes_false_others_true_and_back() -> None:
    async with rig([pod(f"p{i}") for i in range(4)], {"m": frozenset({"p1"})}) as r:
        done = await r.sync.sync_once()
        assert {p.pod.name: p.status for p in done} == {"p0": TRUE, "p1": FALSE, "p2": TRUE, "p3": TRUE}
        assert conditions(r.api) == {"p0": TRUE, "p1": FALSE, "p2": TRUE, "p3": TRUE}
        # One condition per patch, nothing else in the body (the kubelet's conditions are untouched).
        _ns, name, body = r.api.patches[1]
        (cond,) = body["status"]["conditions"]
        assert name == "p1" and body == {"status": {"conditions": [cond]}}
        assert cond["type"] == COND and cond["status"] == FALSE and cond["reason"] == "HeldOut"
        assert await r.sync.sync_once() == []          # nothing changed: nothing sent
        r.routing.held["m"] = frozenset()
        assert [(p.pod.name, p.status) for p in await r.sync.sync_once()] == [("p1", TRUE)]
        assert r.metrics.registry.get_sample_value("tailguard_k8s_sync_patches_total", {"status": "True"}) == 4


async def test_redis_unreachable_changes_nothing() -> None:
    async with rig([pod("a", status=TRUE), pod("b", status=FALSE), pod("new")], {"m": frozenset({"b"})}) as r:
        r.routing.reachable = False
        assert await r.sync.sync_once() == [] and r.api.patches == []
        assert r.metrics.registry.get_sample_value("tailguard_k8s_sync_redis_reachable") == 0
        r.routing.reachable = True
        assert [p.pod.name for p in await r.sync.sync_once()] == ["new"]


async def test_only_the_leader_patches() -> None:
    async with rig([pod("a"), pod("b")], {"m": frozenset()}) as r:
        r.leadership.leader = False
        assert await r.sync.sync_once() == [] and r.api.patches == []
        assert r.metrics.registry.get_sample_value("tailguard_k8s_sync_leader") == 0
        r.leadership.leader = True
        assert len(await r.sync.sync_once()) == 2


async def test_guard_keeps_pods_in_when_too_many_are_held_out(caplog: pytest.LogCaptureFixture) -> None:
    async with rig([pod(f"p{i}", status=TRUE) for i in range(4)], {"m": frozenset({"p0", "p1", "p2"})}) as r:
        assert await r.sync.sync_once() == []
        assert conditions(r.api) == dict.fromkeys(["p0", "p1", "p2", "p3"], TRUE)
        assert r.metrics.registry.get_sample_value("tailguard_k8s_sync_guard_held_total") == 1
        assert "more than the guard allows" in caplog.text


async def test_missing_patch_permission_is_one_line_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    async with rig([pod("a"), pod("b")], {"m": frozenset()}) as r:
        r.api.denied.add(("patch", "pods/status"))
        assert await r.sync.sync_once() == []
        assert await r.sync.sync_once() == []
        errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
        assert len(errors) == 1 and "\n" not in errors[0], errors        # once per cause, one line
        assert "missing RBAC permission: patch pods/status in namespace 'default'" in errors[0]
        assert r.metrics.registry.get_sample_value("tailguard_k8s_sync_patch_errors_total",
                                                   {"reason": "forbidden"}) == 4


async def test_watch_gives_a_new_gated_pod_its_condition_at_once() -> None:
    async with rig([pod("a")], {"m": frozenset({"held"})}, run=True) as r:
        await eventually(lambda: r.api.condition("a") == TRUE)
        r.api.add_pod(pod("fresh"))
        await eventually(lambda: r.api.condition("fresh") == TRUE, timeout_s=1.0)
        r.api.add_pod(pod("held"))
        r.api.add_pod(pod("held-2"))
        await eventually(lambda: r.api.condition("held") == FALSE, timeout_s=1.0)
        r.api.add_pod(pod("plain", gated=False))
        await asyncio.sleep(0.05)
        assert r.api.condition("plain") is None       # a pod without the gate is never touched


async def test_watch_relists_after_an_error() -> None:
    async with rig([pod("a")], {"m": frozenset()}, run=True) as r:
        await eventually(lambda: r.api.condition("a") == TRUE)
        lists = sum(1 for m, p in r.api.requests if m == "GET" and p.endswith("/pods"))
        r.api.unreachable = True
        r.api.end_watches()
        await eventually(lambda: (r.metrics.registry.get_sample_value(
            "tailguard_k8s_sync_watch_restarts_total", {"reason": "error"}) or 0) >= 1)
        r.api.unreachable = False
        await eventually(lambda: sum(1 for m, p in r.api.requests if m == "GET" and p.endswith("/pods")) > lists)
        r.api.add_pod(pod("b"))
        await eventually(lambda: r.api.condition("b") == TRUE)


def test_forbidden_message_names_verb_resource_namespace() -> None:
    e = Forbidden("patch", "pods/status", "prod", 'pods "x" is forbidden: ...')
    assert str(e).startswith("missing RBAC permission: patch pods/status in namespace 'prod'")
    assert "\n" not in str(e) and e.status == 403
