"""The admission webhook's answer (pure), and k8s-sync's RBAC check at start (fake apiserver)."""

from __future__ import annotations

import base64
import json
from typing import Any

from tailguard.k8s.api import Client, Permission
from tailguard.k8s.cli import missing_line, missing_permissions
from tailguard.k8s.testing import FakeApiServer
from tailguard.k8s.webhook import review

COND = "tailguard.io/routable"


def admission(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"kind": "Pod"}, "namespace": "llm",
                        "object": {"kind": "Pod", "metadata": {"generateName": "vllm-"}, "spec": spec}}}


def ops(answer: dict[str, Any]) -> list[dict[str, Any]]:
    r = answer["response"]
    assert r["uid"] == "u-1" and r["allowed"] is True
    return json.loads(base64.b64decode(r["patch"])) if "patch" in r else []


def test_adds_the_gate_to_a_pod_without_gates() -> None:
    answer, result = review(admission({"containers": []}), COND)
    assert result == "gated" and answer["response"]["patchType"] == "JSONPatch"
    assert ops(answer) == [{"op": "add", "path": "/spec/readinessGates", "value": [{"conditionType": COND}]}]


def test_appends_to_other_gates_and_leaves_a_gated_pod_alone() -> None:
    answer, _ = review(admission({"readinessGates": [{"conditionType": "other"}]}), COND)
    assert ops(answer) == [{"op": "add", "path": "/spec/readinessGates/-", "value": {"conditionType": COND}}]
    answer, result = review(admission({"readinessGates": [{"conditionType": COND}]}), COND)
    assert result == "unchanged" and ops(answer) == []


def test_never_refuses_even_garbage() -> None:
    for body in ({}, {"request": {"uid": "u-1"}}, {"request": "x"}):
        answer, result = review(body, COND)
        assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
        assert result in ("error", "unchanged")


async def test_rbac_check_names_every_missing_permission_in_one_line() -> None:
    api = FakeApiServer()
    client = Client(api)
    assert await missing_permissions(client, "llm", leases=True) == []
    api.denied |= {("patch", "pods/status"), ("update", "leases")}
    missing = await missing_permissions(client, "llm", leases=True)
    assert missing == [Permission("patch", "pods/status"), Permission("update", "leases", "coordination.k8s.io")]
    line = missing_line("llm", missing)
    assert "\n" not in line and "patch pods/status" in line and "update leases (coordination.k8s.io)" in line
    assert "namespace 'llm'" in line
    assert await missing_permissions(client, "llm", leases=False) == [Permission("patch", "pods/status")]
