"""deploy/helm/tailguard: ``helm lint`` and ``helm template`` (helm built by scripts/k8s from the
Go module proxy), and a server-side dry-run apply of every rendered manifest against the real
apiserver of scripts/k8s — with every component on, and with the defaults."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_harness import ROOT, SYNC_RULES, Admin, control_plane, namespace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHART = ROOT / "deploy" / "helm" / "tailguard"
CACHE = Path(os.environ.get("TAILGUARD_CACHE", Path.home() / ".cache" / "tailguard"))
HELM = CACHE / "k8s-v1.37.2" / "bin" / "helm"
ALL_ON = ["--set", "scrape.enabled=true", "--set", "agent.enabled=true", "--set", "existingSecret=tg-secrets",
          "--set", "k8sSync.webhook.enabled=true", "--set", "k8sSync.webhook.tlsSecret=tg-webhook-tls",
          "--set", f"k8sSync.webhook.caBundle={base64.b64encode(b'-----BEGIN CERTIFICATE-----').decode()}"]

# kind → (API path prefix, plural, namespaced)
RESOURCES = {
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
}


def helm(*args: str) -> str:
    if not HELM.is_file():
        pytest.fail(f"helm is not built at {HELM}: run scripts/k8s build (scripts/test does)", pytrace=False)
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def render(ns: str, *extra: str) -> list[dict[str, Any]]:
    # Rendered for the apiserver of scripts/k8s (helm's own default is an old v1.20).
    out = helm("template", "tg", str(CHART), "--namespace", ns, "--kube-version", "v1.37.2", *extra)
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    a = Admin(control_plane())
    try:
        yield a
    finally:
        await a.aclose()


def test_chart_lints_with_defaults_and_with_everything_on() -> None:
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), *ALL_ON)


def test_rendered_rbac_is_the_least_k8s_sync_needs() -> None:
    docs = render("llm", *ALL_ON)
    kinds = sorted({d["kind"] for d in docs})
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds, kinds
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["rules"] == SYNC_RULES
    sas = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert set(sas) == {"tg-tailguard-worker", "tg-tailguard-scrape", "tg-tailguard-agent", "tg-tailguard-k8s-sync"}
    for name in ("tg-tailguard-worker", "tg-tailguard-scrape", "tg-tailguard-agent"):
        assert sas[name]["automountServiceAccountToken"] is False, name
    (hook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert hook["webhooks"][0]["failurePolicy"] == "Ignore"
    assert hook["webhooks"][0]["namespaceSelector"] == {"matchLabels": {"tailguard.io/gate": "enabled"}}
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # Secrets come from the existing Secret, never from values.
    env = {e["name"]: e for c in _containers(docs) for e in c["env"]}
    assert env["TAILGUARD_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "tg-secrets"
    assert "value" not in env["TAILGUARD_REDIS_PASSWORD"]


@pytest.mark.parametrize("values", [[], ALL_ON], ids=["defaults", "all-on"])
async def test_server_side_dry_run_apply_of_every_manifest(admin: Admin, values: list[str]) -> None:
    async with namespace(admin) as ns:
        docs = render(ns, *values)
        assert docs
        for d in docs:
            prefix, plural, namespaced = RESOURCES[d["kind"]]
            where = f"/namespaces/{d['metadata'].get('namespace', ns)}" if namespaced else ""
            path = (f"{prefix}{where}/{plural}/{d['metadata']['name']}"
                    "?dryRun=All&fieldManager=tailguard-chart-test&force=true")
            got = await admin.call("PATCH", path, json.dumps(d), content_type="application/apply-patch+yaml")
            assert got["kind"] == d["kind"] and got["metadata"]["name"] == d["metadata"]["name"]
        # Dry run: nothing was created.
        listed = await admin.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments")
        assert listed["items"] == []


def _containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for d in docs if d["kind"] in ("Deployment", "DaemonSet")
            for c in d["spec"]["template"]["spec"]["containers"]]
