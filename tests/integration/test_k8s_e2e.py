"""The Kubernetes story on a REAL control plane (scripts/k8s: etcd, kube-apiserver,
kube-controller-manager, kwok as the kubelet), the real Kafka and Redis, ``tailguard worker``
and ``tailguard k8s-sync`` as subprocesses, with 1-s ticks.

8 kwok pods behind a Service, each with the readiness gate; their latency events go through
Kafka (the real ``LatencyEmitter``). One pod turns 3x slower: its condition goes False,
its EndpointSlice endpoint ``ready: false`` while the other 7 stay ready; once it recovers and
its probes pass (probe-flagged events, as ``tailguard probe`` sends while the Service sends it
nothing) it comes back ``ready: true``. A new gated pod is Ready within 2 s of its creation.
Then: two replicas and a killed leader, and RBAC without ``pods/status`` patch.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from k8s_harness import (
    COND,
    MODEL,
    ROOT,
    SYNC_RULES,
    Admin,
    SyncProc,
    condition,
    control_plane,
    namespace,
    sync_env,
    until,
)
from worker_harness import running_worker

from tailguard.emitter import LatencyEmitter
from tailguard.lb.testing import scratch_redis, write_routing

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

PODS = [f"vllm-{i}" for i in range(8)]
SLOW = "vllm-3"


class Traffic:
    """Each pod's requests, reported through the real emitter (``LatencyEmitter``, Kafka):
    ``mode[pod]`` is normal, slow (3x), probe (normal latency, flagged as probes) or silent."""

    def __init__(self, kafka: str, topic: str, pods: list[str]) -> None:
        self.emitter = LatencyEmitter(kafka, topic=topic, linger_s=0.1)
        self.mode = dict.fromkeys(pods, "normal")
        self.rng = random.Random(11)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Traffic:
        await self.emitter.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.emitter.stop()

    async def _run(self) -> None:
        while True:
            for pod, mode in list(self.mode.items()):
                if mode == "silent":
                    continue
                base_us = 3_000_000.0 if mode == "slow" else 1_000_000.0
                for _ in range(25):
                    self.emitter.record(pod, MODEL, base_us * self.rng.lognormvariate(0, 0.15),
                                        probe=mode == "probe", hardware="H100")
            await asyncio.sleep(0.25)


class Recorder:
    """Every change of the gate condition of every pod of ``ns``, from a watch."""

    def __init__(self, admin: Admin, ns: str) -> None:
        self.admin, self.ns = admin, ns
        self.changes: list[tuple[float, str, str | None]] = []
        self._last: dict[str, str | None] = {}

    async def run(self) -> None:
        listed = await self.admin.client.list_pods(self.ns)
        for p in listed.items:
            self._last[p["metadata"]["name"]] = condition(p, COND)
        rv = listed.resource_version
        while True:
            async for kind, obj in self.admin.client.watch_pods(self.ns, rv, 60):
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if kind in ("ADDED", "MODIFIED"):
                    name, cond = obj["metadata"]["name"], condition(obj, COND)
                    if self._last.get(name, "unset") != cond:
                        self.changes.append((time.monotonic(), name, cond))
                    self._last[name] = cond

    def since(self, t: float) -> list[tuple[str, str | None]]:
        return [(n, c) for ts, n, c in self.changes if ts >= t]


@contextlib.asynccontextmanager
async def recording(admin: Admin, ns: str) -> AsyncIterator[Recorder]:
    rec = Recorder(admin, ns)
    task = asyncio.create_task(rec.run())
    await asyncio.sleep(0.5)
    try:
        yield rec
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    a = Admin(control_plane())
    try:
        yield a
    finally:
        await a.aclose()


async def service(admin: Admin, ns: str, name: str = "llm") -> None:
    await admin.call("POST", f"/api/v1/namespaces/{ns}/services", {
        "metadata": {"name": name}, "spec": {"selector": {"app": "llm"}, "ports": [{"port": 8000}]}})


async def ready_map(admin: Admin, ns: str) -> dict[str, tuple[str | None, str | None]]:
    return {n: (condition(p, COND), condition(p, "Ready")) for n, p in (await admin.pods(ns)).items()}


async def test_slow_pod_leaves_the_service_and_comes_back(
        admin: Admin, kafka_bootstrap: str, redis_url: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    cp = admin.cp
    async with namespace(admin) as ns, contextlib.AsyncExitStack() as stack:
        await admin.grant(ns, "tailguard-sync", SYNC_RULES, "tailguard-k8s-sync")
        await service(admin, ns)
        for p in PODS:
            await admin.create_pod(ns, p)
        env, _r, worker = await stack.enter_async_context(running_worker(
            kafka_bootstrap, redis_url, unique_name("k8s"), tmp_path, extra={
                "TAILGUARD_BACKOFF_INITIAL_S": "3", "TAILGUARD_BACKOFF_MAX_S": "3"}))
        traffic = await stack.enter_async_context(Traffic(kafka_bootstrap, env.topic("latency_events"), PODS))
        sync = SyncProc(sync_env(cp, ns, redis_url, env.name), tmp_path / "k8s-sync.log")
        stack.callback(sync.stop)

        def logs() -> str:
            return f"--- k8s-sync:\n{sync.log()[-3000:]}\n--- worker:\n{worker.tail()}"

        # Every gated pod gets the condition True and turns Ready; all 8 endpoints ready.
        await until(lambda: _all(ready_map(admin, ns), ("True", "True")), 90, "8 pods routable and Ready", logs)
        await until(lambda: _eq(admin.endpoints(ns, "llm"), dict.fromkeys(PODS, True)), 30,
                    "8 ready endpoints in the Service's EndpointSlice", logs)
        # The worker has admitted all 8 (routing set in Redis).
        await until(lambda: _routed(_r, env.name, 8), 120, "the worker's routing set holds all 8 pods", logs)

        async with recording(admin, ns) as rec:
            t_slow = time.monotonic()
            traffic.mode[SLOW] = "slow"
            await until(lambda: _cond(admin, ns, SLOW, "False"), 120, f"{SLOW}'s condition False", logs)
            want = dict.fromkeys(PODS, True) | {SLOW: False}
            await until(lambda: _eq(admin.endpoints(ns, "llm"), want), 30,
                        f"{SLOW}'s endpoint ready: false, the other 7 ready", logs)
            pods = await admin.pods(ns)
            assert condition(pods[SLOW], "Ready") == "False"

            # It recovers; the Service sends it nothing, so its traffic now is probes.
            traffic.mode[SLOW] = "probe"
            await until(lambda: _cond(admin, ns, SLOW, "True"), 120, f"{SLOW} re-admitted (condition True)", logs)
            await until(lambda: _eq(admin.endpoints(ns, "llm"), dict.fromkeys(PODS, True)), 30,
                        f"{SLOW}'s endpoint ready: true again", logs)
            # Nobody else left, and the slow pod went out once and came back once.
            assert rec.since(t_slow) == [(SLOW, "False"), (SLOW, "True")], rec.changes

        # A new pod with the gate is Ready within 2 s of its creation.
        traffic.mode["vllm-new"] = "normal"
        t0 = time.monotonic()
        await admin.create_pod(ns, "vllm-new")
        await until(lambda: _ready(admin, ns, "vllm-new"), 2.0, "the new pod Ready within 2 s", logs)
        took_s = time.monotonic() - t0
        assert took_s <= 2.0
        assert worker.proc.poll() is None, worker.tail()
        assert "Traceback" not in sync.log(), sync.log()


async def test_leader_killed_the_other_takes_over_within_the_lease_and_nothing_flaps(
        admin: Admin, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    cp = admin.cp
    prefix = unique_name("k8s-lease")
    pods = [f"q{i}" for i in range(4)]
    duration_s = 4.0
    async with namespace(admin) as ns, contextlib.AsyncExitStack() as stack:
        r = await stack.enter_async_context(scratch_redis(redis_url, prefix))
        await admin.grant(ns, "tailguard-sync", SYNC_RULES, "tailguard-k8s-sync")
        for p in pods:
            await admin.create_pod(ns, p)
        await write_routing(r, prefix, MODEL, ["q0", "q2", "q3"], held_out=["q1"])
        env = sync_env(cp, ns, redis_url, prefix, TAILGUARD_K8S_LEASE_DURATION_S=str(duration_s))
        a = SyncProc(env, tmp_path / "a.log", "--identity", "a")
        stack.callback(a.stop)

        def logs() -> str:
            return f"--- a:\n{a.log()[-2000:]}\n--- b:\n{b.log()[-2000:] if b else ''}"

        b: SyncProc | None = None
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/tailguard-k8s-sync"
        want = {"q0": "True", "q1": "False", "q2": "True", "q3": "True"}
        await until(lambda: _conds(admin, ns, want), 60, "q1 False, the others True (leader a)", logs)
        assert (await admin.call("GET", lease_path))["spec"]["holderIdentity"] == "a"
        b = SyncProc(env, tmp_path / "b.log", "--identity", "b")
        stack.callback(b.stop)
        await until(lambda: _contains(b.log, "routing from"), 60, "replica b started", logs)
        await asyncio.sleep(2 * duration_s)          # b is a candidate; a stays the leader
        assert (await admin.call("GET", lease_path))["spec"]["holderIdentity"] == "a"

        renewals: list[tuple[str, str]] = []

        async def watch_lease() -> None:
            while True:
                spec = (await admin.call("GET", lease_path))["spec"]
                renewals.append((spec["holderIdentity"], spec["renewTime"]))
                await asyncio.sleep(0.05)

        async with recording(admin, ns) as rec:
            poller = asyncio.create_task(watch_lease())
            await asyncio.sleep(0.5)
            t_kill = time.monotonic()
            a.kill()
            try:
                await until(lambda: _holder(admin, lease_path, "b"), 3 * duration_s, "b holds the Lease", logs)
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            lease = (await admin.call("GET", lease_path))["spec"]
            last_a = max(_ts(t) for h, t in renewals if h == "a")
            # Taken over within the Lease's duration after a's last renewal (apiserver-recorded times).
            assert _ts(lease["acquireTime"]) - last_a <= duration_s + 0.5, (lease, renewals[-5:])
            assert lease["leaseTransitions"] >= 1
            assert rec.since(t_kill) == [], f"conditions changed during the takeover: {rec.changes}"
            # The new leader acts: tailguard takes q2 out as well.
            await write_routing(r, prefix, MODEL, ["q0", "q3"], held_out=["q1", "q2"])
            await until(lambda: _conds(admin, ns, want | {"q2": "False"}), 30, "b sets q2 False", logs)


async def test_missing_pods_status_patch_is_named_in_one_line(
        admin: Admin, redis_url: str, unique_name: Callable[[str], str]) -> None:
    cp = admin.cp
    async with namespace(admin) as ns:
        rules = [r for r in SYNC_RULES if r["resources"] != ["pods/status"]]
        await admin.grant(ns, "tailguard-limited", rules, "tailguard-k8s-sync")
        env = sync_env(cp, ns, redis_url, unique_name("k8s-rbac"), user="limited")
        proc = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "tailguard.cli", "k8s-sync"], env=env, cwd=ROOT,
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("tailguard k8s-sync: missing RBAC permission(s) in namespace"), lines[0]
        assert "patch pods/status" in lines[0] and f"'{ns}'" in lines[0]
        assert "list pods" not in lines[0] and "leases" not in lines[0]   # only what is missing


# -- small async predicates ------------------------------------------------------------------------

async def _all(got: Any, want: tuple[str, str]) -> bool:
    m = await got
    return len(m) >= len(PODS) and all(v == want for v in m.values())


async def _eq(got: Any, want: Any) -> bool:
    return bool(await got == want)


async def _cond(admin: Admin, ns: str, pod: str, status: str) -> bool:
    return condition((await admin.pods(ns))[pod], COND) == status


async def _conds(admin: Admin, ns: str, want: dict[str, str]) -> bool:
    pods = await admin.pods(ns)
    return all(condition(pods[n], COND) == s and condition(pods[n], "Ready") == s for n, s in want.items())


async def _ready(admin: Admin, ns: str, pod: str) -> bool:
    pods = await admin.pods(ns)
    return pod in pods and condition(pods[pod], "Ready") == "True"


async def _routed(r: Any, prefix: str, n: int) -> bool:
    return len(await r.smembers(f"{prefix}:routing:{MODEL}")) >= n


async def _holder(admin: Admin, path: str, who: str) -> bool:
    return bool((await admin.call("GET", path))["spec"]["holderIdentity"] == who)


async def _contains(log: Callable[[], str], text: str) -> bool:
    return text in log()


def _ts(micro_time: str) -> float:
    import datetime as dt

    return dt.datetime.strptime(micro_time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()





def _serving_cert(tmp: Path) -> tuple[str, str, str]:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it (openssl): (ca, cert, key)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=tg-webhook-ca",
        "-keyout", "ca.key", "-out", "ca.crt")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "hook.key", "-out", "hook.csr")
    (tmp / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "hook.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.ext", "-out", "hook.crt")
    return str(tmp / "ca.crt"), str(tmp / "hook.crt"), str(tmp / "hook.key")


async def test_webhook_gates_pods_of_labelled_namespaces_and_fails_open(
        admin: Admin, redis_url: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    import base64

    from worker_harness import free_port

    cp = admin.cp
    ca, cert, key = _serving_cert(tmp_path)
    port = free_port()
    test_id = uuid_hex()
    labels = {"tailguard.io/gate": "enabled", "tailguard.io/test": test_id}
    hook_name = f"tailguard-test-{test_id}"
    async with namespace(admin, labels) as ns, namespace(admin) as plain_ns, contextlib.AsyncExitStack() as stack:
        await admin.grant(ns, "tailguard-sync", SYNC_RULES, "tailguard-k8s-sync")
        env = sync_env(cp, ns, redis_url, unique_name("k8s-hook"), TAILGUARD_K8S_WEBHOOK_LISTEN=f"127.0.0.1:{port}",
                       TAILGUARD_K8S_WEBHOOK_CERTFILE=cert, TAILGUARD_K8S_WEBHOOK_KEYFILE=key)
        sync = SyncProc(env, tmp_path / "k8s-sync.log", "--webhook", "--no-leader-election")
        stack.callback(sync.stop)
        await until(lambda: _contains(sync.log, "webhook on"), 60, "the webhook listening", sync.log)
        await admin.call("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
            "metadata": {"name": hook_name},
            "webhooks": [{
                "name": "gate.tailguard.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "timeoutSeconds": 2,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate",
                                 "caBundle": base64.b64encode(Path(ca).read_bytes()).decode()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": labels}}]})
        stack.push_async_callback(admin.call, "DELETE",
                                  f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{hook_name}",
                                  ok=(200, 404))
        made = iter(range(1000))

        async def gated_pod() -> str | None:
            name = f"web-{next(made)}"
            created = await admin.create_pod(ns, name, gated=False)
            return name if created["spec"].get("readinessGates") == [{"conditionType": COND}] else None

        # The apiserver picks the new configuration up within a few seconds.
        name = await until(gated_pod, 30, "a pod created in the labelled namespace gets the gate", sync.log, 0.5)
        await until(lambda: _ready(admin, ns, name), 10, f"{name} Ready (k8s-sync set its condition)", sync.log)
        plain = await admin.create_pod(plain_ns, "other", gated=False)
        assert "readinessGates" not in plain["spec"]          # namespace not labelled: untouched

        # The webhook goes down: pods are created without the gate (failurePolicy Ignore) and serve.
        sync.stop()
        down = await admin.create_pod(ns, "while-down", gated=False)
        assert "readinessGates" not in down["spec"]
        await until(lambda: _ready(admin, ns, "while-down"), 10, "the ungated pod Ready while tailguard is down")


def uuid_hex() -> str:
    import uuid

    return uuid.uuid4().hex[:8]
