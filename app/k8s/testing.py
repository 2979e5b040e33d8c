"""A fake apiserver behind the :class:`~tailguard.k8s.api.Transport` seam, for unit tests (as httpx's
``MockTransport``): pods, their status patches and watch, Leases with optimistic concurrency,
and SelfSubjectAccessReviews answered from a set of denied permissions.

It implements only what :class:`~tailguard.k8s.api.Client` calls, with the apiserver's semantics
that matter here: a strategic-merge patch of ``pods/<name>/status`` merges conditions by
``type``; every write bumps a resourceVersion; a Lease write at a stale resourceVersion is a
409; a denied verb is a 403 with the apiserver's message form.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from tailguard.k8s.api import Response


def pod(name: str, *, namespace: str = "default", model: str | None = "m", gated: bool = True,
        condition: str = "tailguard.io/routable", labels: dict[str, str] | None = None,
        ip: str = "", status: str | None = None) -> dict[str, Any]:
    """A pod object as the apiserver returns it (``status``: our condition's status, if any)."""
    lab = dict(labels or {})
    if model is not None:
        lab.setdefault("tailguard.io/model", model)
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "labels": lab},
                           "spec": {"containers": [{"name": "c", "image": "x"}]},
                           "status": {"phase": "Running", "conditions": []}}
    if gated:
        obj["spec"]["readinessGates"] = [{"conditionType": condition}]
    if ip:
        obj["status"]["podIP"] = ip
    if status is not None:
        obj["status"]["conditions"].append({"type": condition, "status": status})
    return obj


class FakeApiServer:
    """In-memory apiserver (see module docstring). ``requests``: every (method, path) seen."""

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self.rv = 1
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.denied: set[tuple[str, str]] = set()       # (verb, resource), e.g. ("patch", "pods/status")
        self.requests: list[tuple[str, str]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.unreachable = False
        self._watchers: list[asyncio.Queue[bytes | None]] = []
        for p in pods or []:
            self.add_pod(p)

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        for q in self._watchers:
            q.put_nowait(line)

    def add_pod(self, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        self._bump(obj)
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        kind = "MODIFIED" if key in self.pods else "ADDED"
        self.pods[key] = obj
        self._emit(kind, obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        obj = self.pods.pop((namespace, name))
        self._bump(obj)
        self._emit("DELETED", obj)

    def condition(self, name: str, condition: str = "tailguard.io/routable", namespace: str = "default") -> str | None:
        for c in self.pods[(namespace, name)]["status"].get("conditions", []):
            if c["type"] == condition:
                return str(c["status"])
        return None

    def end_watches(self) -> None:
        for q in self._watchers:
            q.put_nowait(None)

    def _forbidden(self, verb: str, resource: str, namespace: str) -> Response:
        group, _, res = resource.rpartition(":")
        msg = (f'{res} is forbidden: User "tester" cannot {verb} resource "{res}" in API group "{group}" '
               f'in the namespace "{namespace}"')
        return Response(403, json.dumps({"kind": "Status", "message": msg, "code": 403}).encode())

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      content_type: str = "application/json") -> Response:
        from tailguard.k8s import ApiUnreachable

        self.requests.append((method, path))
        if self.unreachable:
            raise ApiUnreachable("the fake apiserver is unreachable")
        data: Any = json.loads(body) if body else {}
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            a = data["spec"]["resourceAttributes"]
            res = a["resource"] + (f"/{a['subresource']}" if a.get("subresource") else "")
            allowed = (a["verb"], res) not in self.denied
            return Response(201, json.dumps({"status": {"allowed": allowed}}).encode())
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/status)?", path)
        if m:
            return self._pods(method, m.group(1), m.group(2), data, content_type)
        m = re.fullmatch(r"/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?", path)
        if m:
            return self._leases(method, m.group(1), m.group(2), data)
        return Response(404, b'{"message": "not found"}')

    def _pods(self, method: str, ns: str, name: str | None, data: Any, content_type: str) -> Response:
        if method == "GET" and name is None:
            if ("list", "pods") in self.denied:
                return self._forbidden("list", "pods", ns)
            items = [p for (pns, _), p in sorted(self.pods.items()) if pns == ns]
            return Response(200, json.dumps({"items": items, "metadata": {"resourceVersion": str(self.rv)}}).encode())
        if method == "PATCH" and name is not None:
            if ("patch", "pods/status") in self.denied:
                return self._forbidden("patch", "pods/status", ns)
            assert content_type == "application/strategic-merge-patch+json", content_type
            obj = self.pods.get((ns, name))
            if obj is None:
                return Response(404, b'{"message": "pod not found"}')
            conds = obj["status"].setdefault("conditions", [])
            for new in data["status"]["conditions"]:
                conds[:] = [c for c in conds if c["type"] != new["type"]] + [new]
            self.patches.append((ns, name, data))
            self._bump(obj)
            self._emit("MODIFIED", obj)
            return Response(200, json.dumps(obj).encode())
        return Response(405, b'{"message": "method not allowed"}')

    def _leases(self, method: str, ns: str, name: str | None, data: Any) -> Response:
        if method == "GET" and name is not None:
            obj = self.leases.get((ns, name))
            return Response(200, json.dumps(obj).encode()) if obj else Response(404, b'{"message": "not found"}')
        if method == "POST":
            key = (ns, data["metadata"]["name"])
            if key in self.leases:
                return Response(409, b'{"message": "exists"}')
            obj = copy.deepcopy(data)
            self._bump(obj)
            self.leases[key] = obj
            return Response(201, json.dumps(obj).encode())
        if method == "PUT" and name is not None:
            cur = self.leases.get((ns, name))
            if cur is None:
                return Response(404, b'{"message": "not found"}')
            if data["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                return Response(409, b'{"message": "conflict"}')
            obj = copy.deepcopy(data)
            self._bump(obj)
            self.leases[(ns, name)] = obj
            return Response(200, json.dumps(obj).encode())
        return Response(405, b'{"message": "method not allowed"}')

    async def stream(self, path: str, *, timeout_s: float) -> AsyncIterator[bytes]:
        from tailguard.k8s import ApiUnreachable

        self.requests.append(("WATCH", path))
        if self.unreachable:
            raise ApiUnreachable("the fake apiserver is unreachable")
        q: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._watchers.append(q)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(q.get(), timeout_s)
                except TimeoutError:
                    return
                if line is None:
                    return
                yield line
        finally:
            self._watchers.remove(q)
