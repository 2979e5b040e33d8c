"""The pure plan of ``k8s-sync``: which gated pod gets which condition, within the guards."""

from __future__ import annotations

import pytest

from tailguard.k8s.plan import FALSE, TRUE, ModelPlan, NodeIdRule, PodView, plan, pod_view
from tailguard.k8s.testing import pod

COND = "tailguard.io/routable"
NAME = NodeIdRule.parse("name")


def views(*objs: dict[str, object]) -> list[PodView]:
    return [pod_view(o, COND, NAME, "tailguard.io/model") for o in objs]


def wanted(plans: list[ModelPlan]) -> dict[str, str]:
    return {p.pod.name: p.status for mp in plans for p in mp.patches}


def test_held_out_pod_false_every_other_gated_pod_true_new_pods_included() -> None:
    pods = views(*(pod(f"p{i}") for i in range(4)), pod("fresh"), pod("ungated", gated=False))
    plans = plan(pods, {"m": frozenset({"p2"})}, 0.5)
    assert wanted(plans) == {"p0": TRUE, "p1": TRUE, "p2": FALSE, "p3": TRUE, "fresh": TRUE}
    assert plans[0].false == 1 and plans[0].held_out == 1 and plans[0].capped is None


def test_only_changes_are_patched() -> None:
    pods = views(pod("a", status=TRUE), pod("b", status=FALSE), pod("c", status=TRUE))
    assert wanted(plan(pods, {"m": frozenset({"b"})}, 0.5)) == {}
    assert wanted(plan(pods, {"m": frozenset()}, 0.5)) == {"b": TRUE}


def test_unknown_routing_changes_nothing() -> None:
    pods = views(pod("a"), pod("b", status=FALSE))
    plans = plan(pods, {"m": None}, 0.5)
    assert wanted(plans) == {} and plans[0].unknown
    assert wanted(plan(pods, {}, 0.5)) == {}      # a model never asked about counts as unknown


def test_pod_without_model_label_is_routable() -> None:
    assert wanted(plan(views(pod("a", model=None)), {}, 0.5)) == {"a": TRUE}


def test_guard_caps_false_pods_and_never_all() -> None:
    pods = views(*(pod(f"p{i}", status=TRUE) for i in range(4)))
    # 3 of 4 held out, cap floor(0.5 × 4) = 2: nobody newly False.
    plans = plan(pods, {"m": frozenset({"p0", "p1", "p2"})}, 0.5)
    assert wanted(plans) == {} and plans[0].capped is not None and "(2:" in plans[0].capped
    # Already False and still held out stay so, up to the cap; the rest go True.
    pods = views(pod("p0", status=FALSE), pod("p1", status=FALSE), pod("p2", status=FALSE), pod("p3", status=TRUE))
    assert wanted(plan(pods, {"m": frozenset({"p0", "p1", "p2"})}, 0.5)) == {"p2": TRUE}
    # max_ejected_fraction=1 still never sets every pod False.
    one = views(pod("only", status=TRUE))
    assert wanted(plan(one, {"m": frozenset({"only"})}, 1.0)) == {}


def test_models_are_guarded_separately() -> None:
    pods = views(pod("a1", model="a"), pod("a2", model="a"), pod("b1", model="b"), pod("b2", model="b"))
    got = wanted(plan(pods, {"a": frozenset({"a1"}), "b": frozenset({"b1", "b2"})}, 0.5))
    assert got == {"a1": FALSE, "a2": TRUE, "b1": TRUE, "b2": TRUE}


def test_deleting_pods_are_left_alone() -> None:
    p = pod("gone")
    p["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"  # type: ignore[index]
    assert wanted(plan(views(p), {"m": frozenset()}, 0.5)) == {}


@pytest.mark.parametrize(("rule", "obj", "node"), [
    ("name", pod("vllm-0"), "vllm-0"),
    ("label:tailguard.io/node", pod("x", labels={"tailguard.io/node": "gpu-7"}), "gpu-7"),
    ("label:tailguard.io/node", pod("x"), None),
    ("ip:8000", pod("x", ip="10.0.0.5"), "10.0.0.5:8000"),
    ("ip:8000", pod("x", ip="fd00::5"), "[fd00::5]:8000"),
    ("ip:8000", pod("x"), None),
])
def test_node_id_rules(rule: str, obj: dict[str, object], node: str | None) -> None:
    assert pod_view(obj, COND, NodeIdRule.parse(rule), "tailguard.io/model").node_id == node


def test_ip_rule_maps_held_out_address_to_the_pod() -> None:
    rule = NodeIdRule.parse("ip:8000")
    pods = [pod_view(pod(f"p{i}", ip=f"10.0.0.{i}"), COND, rule, "tailguard.io/model") for i in range(3)]
    assert wanted(plan(pods, {"m": frozenset({"10.0.0.1:8000"})}, 0.5)) == {"p0": TRUE, "p1": FALSE, "p2": TRUE}


@pytest.mark.parametrize("bad", ["", "names", "label:", "label:Bad Key", "ip:", "ip:0", "ip:x", "ip:70000"])
def test_bad_node_id_rules_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="name, label:<label key> or ip:<port>"):
        NodeIdRule.parse(bad)


def test_settings_validate_the_k8s_variables() -> None:
    from tailguard.core.contract.config import SettingError
    from tailguard.settings import load

    for var, value in (("TAILGUARD_K8S_NODE_ID", "ip:x"), ("TAILGUARD_K8S_CONDITION", "not a name"),
                       ("TAILGUARD_K8S_API_URL", "ftp://x"), ("TAILGUARD_K8S_LEASE_DURATION_S", "0.5"),
                       ("TAILGUARD_K8S_WEBHOOK_CERTFILE", "/x.pem")):
        with pytest.raises(SettingError) as e:
            load({var: value})
        assert "TAILGUARD_K8S_" in str(e.value)
    s = load({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert s.k8s_api_url == "https://10.96.0.1:443"
    assert load({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "TAILGUARD_K8S_API_URL": "https://a:6443"}).k8s_api_url \
        == "https://a:6443"
