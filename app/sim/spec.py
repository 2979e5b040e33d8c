"""The simulated world of a scenario: fleet, models, faults, expectations — as values.

Owns the frozen dataclasses a scenario file (:mod:`tailguard.sim.scenario`) parses into:
:class:`ModelSpec`, :class:`NodeSpec`, :class:`FaultSpec`, the expectations
(:class:`EjectExpectation`, :class:`GoneExpectation`, :class:`Expect`) and
:class:`Scenario`, whose methods answer what the trace generator and the live fleet ask:
the streams, each stream's rate and traffic factor over time, whether a node reports at a
time (left, silent, restarting), its process instance, and its pure latency model
(:meth:`Scenario.latency`, faults and warm-ups included).

Guarantees: values only — no file, no clock, no randomness (generators take their own
``numpy`` ``Generator``); equal scenarios give equal answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from tailguard.sim.latency import (
    HARDWARE_SPEED,
    LLM,
    BoolArray,
    Errors,
    FloatArray,
    IntArray,
    Lognormal,
    NodeLatency,
    RequestSizes,
    Slowdown,
    Spikes,
    TailDegradation,
    Warmup,
)

#: Event time of t = 0 in generated traces (2025-12-02T13:33:20Z).
#: Event time of t = 0 in generated traces (2025-12-02T13:33:20Z).
EPOCH_S = 1_764_680_000.0

FAULT_KINDS = ("slowdown", "tail", "spikes", "tpot", "ttft", "errors", "traffic", "silence", "restart")
MODEL_KINDS = ("lognormal", "llm")
TRACES = ("conv", "code")



@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    kind: str = "lognormal"
    rate_per_s: float | None = None
    p50_ms: float = 180.0
    sigma: float = 0.3
    trace: str = "conv"
    ttft_ms: float = 50.0
    ttft_per_input_token_ms: float = 0.25
    tpot_ms: float = 30.0
    jitter_sigma: float = 0.05


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    hardware: str
    models: tuple[str, ...]
    rate_per_s: float | None = None
    join_s: float = 0.0
    speed: float = 1.0
    ttft_factor: float = 1.0
    tpot_factor: float = 1.0
    warmup_s: float = 0.0
    warmup_factor: float = 1.0
    leave_s: float | None = None      # stops serving and reporting for good (scale-down)
    delivery_lag_s: float = 0.0       # its event lines reach the detector this much later


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str
    nodes: tuple[str, ...]
    models: tuple[str, ...] | None
    onset_s: float = 0.0
    end_s: float | None = None
    factor: float = 1.0
    share: float = 0.0
    period_s: float = 0.0
    spike_s: float = 0.0
    rate_factor: float = 1.0
    warmup_s: float = 0.0

    def applies(self, node_id: str, model: str) -> bool:
        return node_id in self.nodes and (self.models is None or model in self.models)


@dataclass(frozen=True, slots=True)
class EjectExpectation:
    node_id: str
    model: str
    onset_s: float
    within_s: float
    end_s: float | None = None
    readmit_within_s: float | None = None


@dataclass(frozen=True, slots=True)
class GoneExpectation:
    """``node_id``/``model`` stops reporting at ``at_s`` and is out of routing (reason
    ``silent``) within ``within_s``."""

    node_id: str
    model: str
    at_s: float
    within_s: float


@dataclass(frozen=True, slots=True)
class Expect:
    eject: tuple[EjectExpectation, ...] = ()
    others_stay: bool = True
    fleet_event: bool | None = None
    gone: tuple[GoneExpectation, ...] = ()
    fleet_kinds: tuple[str, ...] = ()         # each of these fleet-event kinds is reported


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    source: str
    duration_s: float
    seed: int
    rate_per_s: float
    models: tuple[ModelSpec, ...]
    nodes: tuple[NodeSpec, ...]
    faults: tuple[FaultSpec, ...] = ()
    hardware_speed: Mapping[str, float] = field(default_factory=lambda: dict(HARDWARE_SPEED))
    emit_tokens: bool = False
    emit_ttft: bool = False
    emit_hardware: bool = True
    emit_instance: bool = False
    probe_rate_per_s: float = 0.0
    expect: Expect = field(default_factory=Expect)
    detector: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    epoch_s: float = EPOCH_S

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def node(self, node_id: str) -> NodeSpec:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(node_id)

    def streams(self) -> list[tuple[int, int, NodeSpec, ModelSpec]]:
        """Every (node index, model index, node, model) the fleet serves, in a stable order."""
        index = {m.name: j for j, m in enumerate(self.models)}
        return [(i, index[m], n, self.model(m)) for i, n in enumerate(self.nodes) for m in n.models]

    def rate_of(self, node: NodeSpec, model: ModelSpec) -> float:
        """Healthy requests/s of one (node, model)."""
        if node.rate_per_s is not None:
            return node.rate_per_s
        return model.rate_per_s if model.rate_per_s is not None else self.rate_per_s

    def reporting(self, node_id: str, model: str, t_s: FloatArray) -> BoolArray:
        """Whether the node sends anything (events, heartbeats) at each time offset: not after
        its ``leave_s``, not during its ``silence``/``restart`` faults."""
        node = self.node(node_id)
        on = np.ones(t_s.shape[0], dtype=np.bool_)
        if node.leave_s is not None:
            on &= t_s < node.leave_s
        for f in self.faults:
            if f.kind in ("silence", "restart") and f.applies(node_id, model):
                off = t_s >= f.onset_s
                if f.end_s is not None:
                    off &= t_s < f.end_s
                on &= ~off
        return on

    def instance_of(self, node_id: str, model: str, t_s: float) -> str:
        """The node's process id at ``t_s``: a new one after each ``restart`` fault."""
        k = sum(1 for f in self.faults if f.kind == "restart" and f.applies(node_id, model)
                and f.end_s is not None and f.end_s <= t_s)
        return f"{node_id}.{k}"

    def rate_factor(self, node_id: str, model: str, t_s: FloatArray) -> FloatArray:
        """Traffic multiplier at each time offset (``traffic`` faults)."""
        f = np.ones(t_s.shape[0])
        for fault in self.faults:
            if fault.kind == "traffic" and fault.applies(node_id, model):
                on = t_s >= fault.onset_s
                if fault.end_s is not None:
                    on &= t_s < fault.end_s
                f = np.where(on, f * fault.rate_factor, f)
        return f

    def max_rate_factor(self, node_id: str, model: str) -> float:
        m = 1.0
        for fault in self.faults:
            if fault.kind == "traffic" and fault.applies(node_id, model):
                m *= max(1.0, fault.rate_factor)
        return m

    def latency(self, node_id: str, model: str) -> NodeLatency:
        """The pure latency model of one (node, model), faults included."""
        node, spec = self.node(node_id), self.model(model)
        speed = self.hardware_speed[node.hardware] * node.speed
        base: Lognormal | LLM
        if spec.kind == "llm":
            base = LLM(request_sizes(spec.trace), spec.ttft_ms * 1e3 * speed * node.ttft_factor,
                       spec.ttft_per_input_token_ms * 1e3 * speed * node.ttft_factor,
                       spec.tpot_ms * 1e3 * speed * node.tpot_factor, spec.jitter_sigma)
        else:
            base = Lognormal(spec.p50_ms * 1e3 * speed, spec.sigma)
        effects: list[Slowdown | TailDegradation | Spikes | Warmup | Errors] = []
        if node.warmup_s > 0 and node.warmup_factor > 1:
            effects.append(Warmup(node.join_s, node.warmup_s, node.warmup_factor))
        for f in self.faults:
            if not f.applies(node_id, model):
                continue
            if f.kind == "restart" and f.end_s is not None and f.warmup_s > 0 and f.factor > 1:
                effects.append(Warmup(f.end_s, f.warmup_s, f.factor))
                continue
            if f.kind in ("silence", "restart"):
                continue
            if f.kind in ("slowdown", "tpot", "ttft") or (f.kind == "traffic" and f.factor != 1.0):
                ch = "latency" if f.kind in ("slowdown", "traffic") else f.kind
                effects.append(Slowdown(f.factor, f.onset_s, f.end_s, channel=ch))  # type: ignore[arg-type]
            elif f.kind == "tail":
                effects.append(TailDegradation(f.share, f.factor, f.onset_s, f.end_s))
            elif f.kind == "spikes":
                effects.append(Spikes(f.period_s, f.spike_s, f.factor, f.onset_s, f.end_s))
            elif f.kind == "errors":
                effects.append(Errors(f.share, f.onset_s, f.end_s))
        return NodeLatency(base, tuple(effects))


@cache
def request_sizes(trace: str) -> RequestSizes:
    """The shipped Azure LLM trace ``trace`` ("conv" or "code") as a size table."""
    from tailguard.data import load_request_sizes

    tokens: IntArray = np.asarray(load_request_sizes(trace), dtype=np.int64)
    return RequestSizes(trace, tokens)
