"""The mutating admission webhook of ``tailguard k8s-sync --webhook``: adds the readiness gate
to pods as they are created.

Owns :func:`review` (pure: an ``admission.k8s.io/v1`` AdmissionReview of a pod → the response
with a JSONPatch that adds ``{"conditionType": <condition>}`` to ``spec.readinessGates``) and
:func:`start_webhook` (an aiohttp HTTPS server answering ``POST /mutate`` with the certificate
and key of ``TAILGUARD_K8S_WEBHOOK_CERTFILE`` / ``_KEYFILE``, e.g. mounted from a Secret).

Guarantees:

* **Never refuses a pod.** Every review is ``allowed: true``; a request it cannot read, or a
  pod that has the gate already, is allowed unchanged. Which namespaces are gated is the
  MutatingWebhookConfiguration's ``namespaceSelector``; its ``failurePolicy: Ignore`` makes
  the apiserver create pods without the gate while tailguard is down (fail open).
* Served by every replica, leader or not (admission must not wait for an election).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from tailguard.k8s.metrics import SyncMetrics

log = logging.getLogger(__name__)


def review(request: Mapping[str, Any], condition_type: str) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answer to ``request``, and what was done (gated, unchanged, error)."""
    req = request.get("request") if isinstance(request, Mapping) else None
    uid = str(req.get("uid", "")) if isinstance(req, Mapping) else ""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    result = "unchanged"
    obj = req.get("object") if isinstance(req, Mapping) else None
    if not isinstance(obj, Mapping) or obj.get("kind", "Pod") != "Pod" or not isinstance(obj.get("spec"), Mapping):
        result = "error" if not isinstance(req, Mapping) else "unchanged"
    else:
        gates = obj["spec"].get("readinessGates")
        gate = {"conditionType": condition_type}
        if not isinstance(gates, list) or not gates:
            ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/readinessGates", "value": [gate]}]
        elif any(isinstance(g, Mapping) and g.get("conditionType") == condition_type for g in gates):
            ops = []
        else:
            ops = [{"op": "add", "path": "/spec/readinessGates/-", "value": gate}]
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
            result = "gated"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}, result


def make_app(condition_type: str, metrics: SyncMetrics) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        answer, result = review(body, condition_type)
        metrics.webhook_requests.labels(result).inc()
        if result == "gated":
            req = body.get("request") or {}
            log.info("k8s-sync webhook: gate %s added to a pod in namespace %r (%s)", condition_type,
                     req.get("namespace"), (req.get("object") or {}).get("metadata", {}).get("generateName")
                     or (req.get("object") or {}).get("metadata", {}).get("name"))
        return web.json_response(answer)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


async def start_webhook(listen: str, certfile: str, keyfile: str, condition_type: str,
                        metrics: SyncMetrics) -> web.AppRunner:
    """Serve :func:`make_app` on ``listen`` (HOST:PORT) over TLS; the caller cleans the runner up."""
    if not certfile or not keyfile:
        raise ValueError("--webhook needs TAILGUARD_K8S_WEBHOOK_CERTFILE and TAILGUARD_K8S_WEBHOOK_KEYFILE "
                         "(the serving certificate the MutatingWebhookConfiguration's caBundle trusts)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"TAILGUARD_K8S_WEBHOOK_CERTFILE/KEYFILE {certfile!r}/{keyfile!r}: not a readable "
                         f"PEM certificate and key ({e})") from None
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(make_app(condition_type, metrics), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host.strip("[]"), int(port), ssl_context=ctx).start()
    except OSError as e:
        await runner.cleanup()
        raise ValueError(f"TAILGUARD_K8S_WEBHOOK_LISTEN {listen!r}: cannot listen ({e})") from None
    return runner
