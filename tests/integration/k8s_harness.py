"""Helpers for the tests on the real control plane of ``scripts/k8s`` (etcd, kube-apiserver,
kube-controller-manager, kwok on 127.0.0.1): where it is, an admin client, a namespace of the
test's own with pods on kwok's fake node, and ``tailguard k8s-sync`` as a subprocess.

The control plane's credentials are files under ``$TAILGUARD_RUN/k8s`` (scripts/k8s writes
them): ``admin.token`` (system:masters), ``sync.token`` (user ``tailguard-sync``) and
``limited.token`` (user ``tailguard-limited``); the tests grant the two users their rights
with a Role of the test's namespace, as a cluster admin would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from worker_harness import TailguardProcess

from tailguard.k8s.api import AiohttpTransport, Client, Response

ROOT = Path(__file__).resolve().parents[2]
RUN = Path(os.environ.get("TAILGUARD_RUN", os.path.join(tempfile.gettempdir(), "tailguard-stack"))) / "k8s"
API_PORT = int(os.environ.get("TAILGUARD_K8S_API_PORT", "6443"))
COND = "tailguard.io/routable"
MODEL = "llama"
NODE = "kwok-node-0"

# What k8s-sync needs (docs/kubernetes.md "RBAC"), as a Role of the test's namespace.
SYNC_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]


@dataclass(frozen=True)
class ControlPlane:
    url: str
    ca_file: str
    token_files: dict[str, str]     # "admin", "sync", "limited" → token file


def control_plane() -> ControlPlane:
    """The running control plane of scripts/k8s; fails (never skips) when it is not up."""
    files = {u: str(RUN / f"{u}.token") for u in ("admin", "sync", "limited")}
    ca = str(RUN / "pki" / "ca.crt")
    try:
        socket.create_connection(("127.0.0.1", API_PORT), timeout=3).close()
        ok = all(Path(f).is_file() for f in [*files.values(), ca])
    except OSError:
        ok = False
    if not ok:
        pytest.fail(f"the Kubernetes control plane is not running at 127.0.0.1:{API_PORT} (state in {RUN}): "
                    "start it with scripts/k8s start (scripts/test does)", pytrace=False)
    return ControlPlane(f"https://127.0.0.1:{API_PORT}", ca, files)


class Admin:
    """Cluster-admin REST calls (JSON in, JSON out; HTTP errors raise AssertionError)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.transport = AiohttpTransport(cp.url, token_file=cp.token_files["admin"], ca_file=cp.ca_file)
        self.client = Client(self.transport)

    async def call(self, method: str, path: str, obj: Any = None, *, ok: tuple[int, ...] = (200, 201),
                   content_type: str = "application/json") -> Any:
        body = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode() if obj is not None else None
        r: Response = await self.transport.request(method, path, body=body, content_type=content_type)
        assert r.status in ok, f"{method} {path}: HTTP {r.status}: {r.body[:500]!r}"
        return r.json()

    async def aclose(self) -> None:
        await self.transport.aclose()

    def pod_path(self, ns: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{ns}/pods" + (f"/{name}" if name else "")

    async def create_pod(self, ns: str, name: str, *, gated: bool = True, model: str = MODEL,
                         labels: dict[str, str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"nodeName": NODE, "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                                                  "ports": [{"containerPort": 8000}]}]}
        if gated:
            spec["readinessGates"] = [{"conditionType": COND}]
        meta = {"name": name, "labels": {"app": "llm", "tailguard.io/model": model, **(labels or {})}}
        return dict(await self.call("POST", self.pod_path(ns), {"apiVersion": "v1", "kind": "Pod",
                                                                "metadata": meta, "spec": spec}))

    async def pods(self, ns: str) -> dict[str, dict[str, Any]]:
        listed = await self.call("GET", self.pod_path(ns))
        return {p["metadata"]["name"]: p for p in listed["items"]}

    async def endpoints(self, ns: str, service: str) -> dict[str, bool]:
        """pod name → ``conditions.ready`` of its endpoint in the Service's EndpointSlices."""
        q = f"labelSelector=kubernetes.io%2Fservice-name%3D{service}"
        slices = await self.call("GET", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?{q}")
        out: dict[str, bool] = {}
        for s in slices["items"]:
            for ep in s.get("endpoints") or []:
                ref = ep.get("targetRef") or {}
                out[ref.get("name", "?")] = bool((ep.get("conditions") or {}).get("ready"))
        return out

    async def grant(self, ns: str, user: str, rules: list[dict[str, Any]], name: str) -> None:
        await self.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
                        {"metadata": {"name": name}, "rules": rules})
        await self.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
                        {"metadata": {"name": name},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


def condition(pod: dict[str, Any], ctype: str) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return str(c.get("status"))
    return None


@contextlib.asynccontextmanager
async def namespace(admin: Admin, labels: dict[str, str] | None = None) -> AsyncIterator[str]:
    """A namespace of the test's own (deleted afterwards), once its default ServiceAccount exists."""
    ns = f"tgtest-{uuid.uuid4().hex[:10]}"
    await admin.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": labels or {}}})
    try:
        await until(lambda: _exists(admin, f"/api/v1/namespaces/{ns}/serviceaccounts/default"), 60,
                    "the namespace's default ServiceAccount (kube-controller-manager)")
        yield ns
    finally:
        await admin.call("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))


async def _exists(admin: Admin, path: str) -> bool:
    r = await admin.transport.request("GET", path)
    return r.status == 200


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str,
                on_fail: Callable[[], str] = lambda: "", every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{on_fail()}")
        await asyncio.sleep(every_s)


def sync_env(cp: ControlPlane, ns: str, redis_url: str, prefix: str, user: str = "sync",
             **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
    env.update({
        "TAILGUARD_K8S_API_URL": cp.url, "TAILGUARD_K8S_CA_FILE": cp.ca_file,
        "TAILGUARD_K8S_TOKEN_FILE": cp.token_files[user], "TAILGUARD_K8S_NAMESPACE": ns,
        "TAILGUARD_REDIS_URL": redis_url, "TAILGUARD_KEY_PREFIX": prefix, "TAILGUARD_METRICS_PORT": "0",
        "TAILGUARD_K8S_RESYNC_S": "2",
    })
    env.update(more)
    return env


class SyncProc(TailguardProcess):
    """``tailguard k8s-sync`` as a subprocess, its output in ``log_path``."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str) -> None:
        super().__init__(["k8s-sync", "--poll-interval-s", "0.2", *args], env, log_path)
