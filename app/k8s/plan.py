"""Pure: which value each gated pod's condition should have, given the routing sets.

Owns :class:`PodView` (what ``k8s-sync`` needs of a pod), :class:`NodeIdRule` (a pod's node
id: its name, one of its labels, or ``<pod IP>:<port>``) and :func:`plan` (pods + each
model's held-out set → the condition patches to send). No I/O, no clock:
:mod:`tailguard.k8s.sync` feeds it and sends what it returns.

Guarantees:

* **Only gated pods.** A pod whose ``spec.readinessGates`` does not name the condition, or
  that is being deleted, is never touched.
* **True unless held out.** A pod is ``False`` only when its node id is in its model's
  held-out set; every other gated pod is ``True``, new and unknown pods included (a pod must
  get traffic to earn admission), and so is a pod without the model label.
* **Unknown means unchanged.** A model whose routing was never read gets no patch at all.
* **Within the guards.** Never more ``False`` pods per model than ``floor(max_ejected_fraction
  × gated pods)`` and never all of them: past that no pod is newly set ``False`` (those
  already ``False`` and still held out stay so), and :attr:`ModelPlan.capped` says why.
* **Only changes.** A pod whose condition already has the wanted status is not patched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

TRUE, FALSE = "True", "False"
# A Kubernetes qualified name (label key, condition type): [DNS-subdomain prefix/]name.
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class NodeIdRule:
    """``name`` (the pod's name), ``label:<key>`` (that label's value) or ``ip:<port>``
    (``<pod IP>:<port>``, as an emitter that names nodes by address reports them)."""

    kind: str
    arg: str = ""

    @classmethod
    def parse(cls, text: str) -> NodeIdRule:
        kind, sep, arg = text.strip().partition(":")
        if kind == "name" and not sep:
            return cls("name")
        if kind == "label" and QUALIFIED_NAME.match(arg) and len(arg) <= 316:
            return cls("label", arg)
        if kind == "ip" and arg.isdigit() and 0 < int(arg) <= 65535:
            return cls("ip", arg)
        raise ValueError(f"{text!r} is not name, label:<label key> or ip:<port>")

    def node_id(self, name: str, labels: Mapping[str, str], pod_ip: str) -> str | None:
        if self.kind == "name":
            return name
        if self.kind == "label":
            return labels.get(self.arg) or None
        if not pod_ip:
            return None
        return f"[{pod_ip}]:{self.arg}" if ":" in pod_ip else f"{pod_ip}:{self.arg}"


@dataclass(frozen=True, slots=True)
class PodView:
    """One pod as ``k8s-sync`` sees it. ``condition``: the status of our condition now
    (``"True"``, ``"False"`` or ``None`` when the pod does not carry it yet)."""

    namespace: str
    name: str
    node_id: str | None
    model: str | None
    gated: bool
    condition: str | None
    deleting: bool = False
    ready: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def pod_view(obj: Mapping[str, Any], condition_type: str, rule: NodeIdRule, model_label: str) -> PodView:
    """A :class:`PodView` of a pod object as the apiserver returns it."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    gates = spec.get("readinessGates") or []
    gated = any(isinstance(g, dict) and g.get("conditionType") == condition_type for g in gates)
    current: str | None = None
    ready = False
    for c in status.get("conditions") or []:
        if not isinstance(c, dict):
            continue
        if c.get("type") == condition_type:
            current = str(c.get("status"))
        elif c.get("type") == "Ready":
            ready = c.get("status") == TRUE
    name = str(meta.get("name", ""))
    return PodView(
        namespace=str(meta.get("namespace", "")), name=name,
        node_id=rule.node_id(name, labels, str(status.get("podIP") or "")),
        model=labels.get(model_label) or None, gated=gated, condition=current,
        deleting=bool(meta.get("deletionTimestamp")), ready=ready)


@dataclass(frozen=True, slots=True)
class Patch:
    """Set ``pod``'s condition to ``status`` (``"True"``/``"False"``) because ``reason``."""

    pod: PodView
    status: str
    reason: str
    message: str


@dataclass(slots=True)
class ModelPlan:
    model: str | None
    pods: int = 0
    held_out: int = 0        # gated pods of the model whose node is held out
    false: int = 0           # pods whose condition will be False after the plan
    capped: str | None = None
    unknown: bool = False    # routing never read: nothing is changed
    patches: list[Patch] = field(default_factory=list)


def plan(pods: Iterable[PodView], held_out: Mapping[str, frozenset[str] | None],
         max_ejected_fraction: float) -> list[ModelPlan]:
    """The patches that bring every gated pod's condition in step (see module docstring).

    ``held_out``: model → its held-out node ids, or ``None`` while its routing is unknown
    (a model missing from the mapping counts as unknown too).
    """
    by_model: dict[str | None, list[PodView]] = {}
    for p in pods:
        if p.gated and not p.deleting:
            by_model.setdefault(p.model, []).append(p)
    out: list[ModelPlan] = []
    for model in sorted(by_model, key=lambda m: (m is not None, m or "")):
        group = sorted(by_model[model], key=lambda p: p.key)
        mp = ModelPlan(model, pods=len(group))
        out.append(mp)
        held: frozenset[str] = frozenset()
        if model is not None:
            known = held_out.get(model)
            if known is None:
                mp.unknown = True
                continue
            held = known
        out_pods = [p for p in group if p.node_id is not None and p.node_id in held]
        mp.held_out = len(out_pods)
        allowed = min(math.floor(max_ejected_fraction * len(group) + 1e-9), len(group) - 1)
        if len(out_pods) > allowed:
            mp.capped = (f"{len(out_pods)} of {len(group)} gated pods of model {model!r} are held out, more than "
                         f"the guard allows ({allowed}: max_ejected_fraction={max_ejected_fraction:g}, never all)"
                         ": setting no further pod False")
            keep = [p for p in out_pods if p.condition == FALSE][:allowed]
            false_keys = {p.key for p in keep}
        else:
            false_keys = {p.key for p in out_pods}
        mp.false = len(false_keys)
        for p in group:
            if p.key in false_keys:
                want, reason = FALSE, "HeldOut"
                msg = f"tailguard took node {p.node_id!r} of model {model!r} out of routing"
            else:
                want, reason = TRUE, "Routable"
                msg = ("no model label: tailguard does not judge this pod" if model is None
                       else f"node {p.node_id!r} of model {model!r} is routable" if p.node_id is not None
                       else "no node id yet (no pod IP): routable")
            if p.condition != want:
                mp.patches.append(Patch(p, want, reason, msg))
    return out
