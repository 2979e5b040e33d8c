"""A small async client of the Kubernetes apiserver's REST API: the calls ``k8s-sync`` makes.

Owns :class:`Client` (list and watch pods, patch one pod condition, read and write a Lease,
ask the apiserver what the service account may do) and the seam under it, :class:`Transport`:
:class:`AiohttpTransport` talks HTTPS to a real apiserver (bearer token re-read from its file,
as projected service-account tokens rotate; the cluster's CA), and unit tests pass a fake.

Guarantees:

* **One condition per PATCH.** :meth:`Client.patch_pod_condition` sends a strategic-merge
  patch of ``pods/<name>/status`` holding only that condition: the kubelet's own conditions
  (and other controllers' gates) are untouched, since conditions merge on ``type``.
* **Errors name their cause.** HTTP 403 becomes :class:`~tailguard.k8s.Forbidden` naming the verb and
  resource that the service account lacks; 410 on a watch becomes :class:`~tailguard.k8s.Gone` (the
  caller re-lists); no answer becomes :class:`~tailguard.k8s.ApiUnreachable` naming the URL.
* **Watches resume.** :meth:`Client.watch_pods` starts from a ``resourceVersion`` and asks for
  bookmarks, so the caller can resume after a timeout without re-listing.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import aiohttp

from tailguard.k8s import ApiUnreachable, Forbidden, Gone, K8sError

JSON = "application/json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else {}
        except ValueError:
            return {}

    def message(self) -> str:
        """The apiserver's ``Status.message`` (or the body's start)."""
        obj = self.json()
        msg = obj.get("message") if isinstance(obj, dict) else None
        return str(msg) if msg else self.body[:200].decode("utf-8", "replace")


class Transport(Protocol):
    """HTTP to the apiserver: one request, or a streamed response read line by line."""

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      content_type: str = JSON) -> Response: ...

    def stream(self, path: str, *, timeout_s: float) -> AsyncIterator[bytes]:
        """The response's lines (a watch); raises :class:`K8sError` on a status other than 200."""
        ...


class AiohttpTransport:
    """HTTPS to ``base_url`` with the bearer token in ``token_file`` and the CA in ``ca_file``."""

    def __init__(self, base_url: str, *, token_file: str = "", ca_file: str = "",
                 timeout_s: float = 10.0, token_ttl_s: float = 60.0) -> None:
        if not base_url.startswith(("https://", "http://")):
            raise ValueError(f"TAILGUARD_K8S_API_URL {base_url!r} must be an https:// URL of the apiserver")
        self.base_url = base_url.rstrip("/")
        self._token_file = token_file
        self._token_ttl_s = token_ttl_s
        self._token: tuple[float, str] | None = None
        self._timeout_s = timeout_s
        self._ssl: ssl.SSLContext | bool = True
        if ca_file:
            try:
                self._ssl = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"TAILGUARD_K8S_CA_FILE {ca_file!r} is not a readable PEM CA ({e})") from None
        self._session: aiohttp.ClientSession | None = None

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        h = {"Accept": JSON}
        if content_type:
            h["Content-Type"] = content_type
        if self._token_file:
            now = time.monotonic()
            if self._token is None or now - self._token[0] > self._token_ttl_s:
                try:
                    with open(self._token_file, encoding="utf-8") as f:
                        self._token = (now, f.read().strip())
                except OSError as e:
                    raise K8sError(f"cannot read the service-account token {self._token_file!r} "
                                   f"(TAILGUARD_K8S_TOKEN_FILE): {e}") from None
            h["Authorization"] = f"Bearer {self._token[1]}"
        return h

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl))
        return self._session

    def _unreachable(self, path: str, e: BaseException) -> ApiUnreachable:
        return ApiUnreachable(f"the apiserver at {self.base_url} did not answer {path.split('?')[0]} "
                              f"({type(e).__name__}: {e}); check TAILGUARD_K8S_API_URL and TAILGUARD_K8S_CA_FILE")

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      content_type: str = JSON) -> Response:
        try:
            async with self._open().request(
                    method, self.base_url + path, data=body, headers=self._headers(content_type if body else None),
                    timeout=aiohttp.ClientTimeout(total=self._timeout_s)) as r:
                return Response(r.status, await r.read())
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise self._unreachable(path, e) from e

    async def stream(self, path: str, *, timeout_s: float) -> AsyncIterator[bytes]:
        try:
            async with self._open().get(
                    self.base_url + path, headers=self._headers(),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s,
                                                  sock_read=timeout_s + self._timeout_s)) as r:
                if r.status != 200:
                    raise status_error(Response(r.status, await r.read()), "watch", "pods", "")
                async for line in r.content:
                    if line.strip():
                        yield line
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise self._unreachable(path, e) from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def status_error(r: Response, verb: str, resource: str, namespace: str) -> K8sError:
    """The exception for a failed call (403 → :class:`Forbidden`, 410 → :class:`Gone`)."""
    if r.status == 403:
        return Forbidden(verb, resource, namespace, r.message())
    if r.status == 410:
        return Gone(f"{verb} {resource}: {r.message()}", 410)
    return K8sError(f"{verb} {resource}{f' in namespace {namespace!r}' if namespace else ''} failed: "
                    f"HTTP {r.status}: {r.message()}", r.status)


@dataclass(frozen=True, slots=True)
class PodList:
    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True, slots=True)
class Lease:
    """A ``coordination.k8s.io/v1`` Lease as leader election reads it."""

    holder: str
    duration_s: float
    renew_time: str
    transitions: int
    resource_version: str
    raw: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Permission:
    verb: str
    resource: str            # "pods", "pods/status", "leases"
    group: str = ""          # API group: "" (core), "coordination.k8s.io"

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}" + (f" ({self.group})" if self.group else "")


class Client:
    """The apiserver calls of ``k8s-sync`` (see module docstring)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def list_pods(self, namespace: str) -> PodList:
        r = await self.transport.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods")
        if r.status != 200:
            raise status_error(r, "list", "pods", namespace)
        obj = r.json()
        return PodList(list(obj.get("items") or []), str((obj.get("metadata") or {}).get("resourceVersion", "")))

    async def watch_pods(self, namespace: str, resource_version: str,
                         timeout_s: float = 240.0) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """``(type, object)`` events: ADDED, MODIFIED, DELETED, BOOKMARK (object: the pod, or
        for a bookmark only its metadata.resourceVersion). Raises :class:`Gone` on 410."""
        q = urlencode({"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                       "timeoutSeconds": str(int(timeout_s))})
        async for line in self.transport.stream(f"/api/v1/namespaces/{quote(namespace)}/pods?{q}",
                                                timeout_s=timeout_s):
            try:
                ev = json.loads(line)
            except ValueError:
                raise K8sError(f"malformed watch event from the apiserver: {line[:200]!r}") from None
            kind, obj = ev.get("type"), ev.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                err = status_error(Response(code, json.dumps(obj).encode()), "watch", "pods", namespace)
                raise err
            yield str(kind), obj

    async def patch_pod_condition(self, namespace: str, name: str, condition: Mapping[str, str]) -> None:
        body = json.dumps({"status": {"conditions": [dict(condition)]}}).encode()
        r = await self.transport.request(
            "PATCH", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/status",
            body=body, content_type=STRATEGIC_MERGE)
        if r.status != 200:
            raise status_error(r, "patch", "pods/status", namespace)

    def _lease_path(self, namespace: str, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        return f"{base}/{quote(name)}" if name else base

    async def get_lease(self, namespace: str, name: str) -> Lease | None:
        r = await self.transport.request("GET", self._lease_path(namespace, name))
        if r.status == 404:
            return None
        if r.status != 200:
            raise status_error(r, "get", "leases", namespace)
        return _lease(r.json())

    async def write_lease(self, namespace: str, name: str, spec: Mapping[str, Any],
                          resource_version: str | None) -> Lease | None:
        """Create the Lease (``resource_version`` None) or replace it at that version; None
        when someone else wrote it first (HTTP 409: the caller re-reads)."""
        obj: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                               "metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}
        if resource_version is None:
            r = await self.transport.request("POST", self._lease_path(namespace), body=json.dumps(obj).encode())
            verb = "create"
        else:
            obj["metadata"]["resourceVersion"] = resource_version
            r = await self.transport.request("PUT", self._lease_path(namespace, name), body=json.dumps(obj).encode())
            verb = "update"
        if r.status == 409:
            return None
        if r.status not in (200, 201):
            raise status_error(r, verb, "leases", namespace)
        return _lease(r.json())

    async def allowed(self, namespace: str, perm: Permission) -> bool:
        """Whether this client may do ``perm`` in ``namespace`` (a SelfSubjectAccessReview)."""
        resource, _, sub = perm.resource.partition("/")
        attrs = {"namespace": namespace, "verb": perm.verb, "group": perm.group, "resource": resource}
        if sub:
            attrs["subresource"] = sub
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        r = await self.transport.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                         body=json.dumps(body).encode())
        if r.status not in (200, 201):
            raise status_error(r, "create", "selfsubjectaccessreviews (authorization.k8s.io)", "")
        return bool((r.json().get("status") or {}).get("allowed"))


def _lease(obj: Mapping[str, Any]) -> Lease:
    spec = obj.get("spec") or {}
    return Lease(holder=str(spec.get("holderIdentity") or ""),
                 duration_s=float(spec.get("leaseDurationSeconds") or 0),
                 renew_time=str(spec.get("renewTime") or ""),
                 transitions=int(spec.get("leaseTransitions") or 0),
                 resource_version=str((obj.get("metadata") or {}).get("resourceVersion", "")),
                 raw=obj)
