"""Kubernetes edge of tailguard: ``tailguard k8s-sync`` keeps a pod readiness gate in step with
the routing set, so that Services, Ingresses and Gateways stop sending to a slow pod.

Modules: :mod:`tailguard.k8s.api` (a small async client of the apiserver's REST API, with a seam
for a fake transport), :mod:`tailguard.k8s.plan` (pure: pods + routing → the condition each pod
should carry), :mod:`tailguard.k8s.lease` (leader election through a ``coordination.k8s.io`` Lease),
:mod:`tailguard.k8s.sync` (the controller), :mod:`tailguard.k8s.webhook` (the mutating admission webhook)
and :mod:`tailguard.k8s.cli` (the command). In full: docs/kubernetes.md.

Exceptions::

    K8sError                 anything the apiserver refused or could not answer
     ├── ApiUnreachable      connection refused, TLS failure, timeout
     ├── Forbidden           HTTP 403: a missing RBAC permission (names it in one line)
     └── Gone                HTTP 410: a watch's resourceVersion is too old (re-list)
"""

from __future__ import annotations


class K8sError(Exception):
    """The apiserver refused a request or could not be reached; ``status`` is the HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ApiUnreachable(K8sError):
    """No answer from the apiserver (connection, TLS or timeout)."""


class Forbidden(K8sError):
    """HTTP 403: the service account lacks ``verb`` on ``resource`` (e.g. ``patch`` ``pods/status``)."""

    def __init__(self, verb: str, resource: str, namespace: str, detail: str) -> None:
        where = f" in namespace {namespace!r}" if namespace else ""
        super().__init__(
            f"missing RBAC permission: {verb} {resource}{where} (grant it in the Role bound to "
            f"tailguard's service account; the apiserver said: {detail})", 403)
        self.verb, self.resource, self.namespace = verb, resource, namespace


class Gone(K8sError):
    """HTTP 410: the resourceVersion a watch started from is no longer available."""
