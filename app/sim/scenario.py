"""Scenario files: a simulated fleet, its faults and the expected verdict, in TOML.

Owns the scenario format — every key, its default and what is allowed — and its
validation. The annotated format is in docs/simulator.md ("Scenario file format"); the
values a file parses into are the frozen dataclasses of :mod:`tailguard.sim.spec`, re-exported here.

Entry points:

* :func:`load` (a file) and :func:`loads` (TOML text) parse and validate into a frozen
  :class:`Scenario`, using the stdlib ``tomllib``.
* :func:`one_model_fleet` and :func:`slowdown_fault` write the TOML of the plainest fleet (one
  model on identical nodes, slowdowns from one onset) for backtests and tests.
* :meth:`Scenario.latency` builds the pure :class:`~tailguard.sim.latency.NodeLatency` of one
  (node, model).

Guarantees: every problem raises :class:`ScenarioError` naming the file, the key (dotted
path) and what is allowed; unknown keys are errors (a typo must not silently mean
"default"). All times are seconds since the scenario's start.
"""


from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tailguard.sim.latency import HARDWARE_SPEED
from tailguard.sim.spec import (  # the values a file parses into; re-exported (sc.Scenario …)
    EPOCH_S,
    FAULT_KINDS,
    MODEL_KINDS,
    TRACES,
    EjectExpectation,
    Expect,
    FaultSpec,
    GoneExpectation,
    ModelSpec,
    NodeSpec,
    Scenario,
    request_sizes,
)

__all__ = ["EPOCH_S", "FAULT_KINDS", "MODEL_KINDS", "TRACES", "EjectExpectation", "Expect",
           "FaultSpec", "GoneExpectation", "ModelSpec", "NodeSpec", "Scenario", "ScenarioError",
           "SimError", "load", "loads", "request_sizes"]


class SimError(Exception):
    """Base of the simulator's errors (bad scenario, unreachable target…)."""


class ScenarioError(SimError):
    """A scenario file is invalid: ``file``, ``key`` (dotted) and what is allowed."""

    def __init__(self, file: str, key: str, value: object, allowed: str) -> None:
        self.file, self.key, self.value, self.allowed = file, key, value, allowed
        if key.startswith("("):           # the file as a whole: unreadable, not TOML
            text = f"{file}: {value}; expected {allowed}"
        elif value is _MISSING:
            text = f"{file}: {key} is missing: expected {allowed}"
        else:
            text = f"{file}: {key} = {value!r} is not allowed: expected {allowed}"
        super().__init__(text)


_MISSING = object()

# --------------------------------------------------------------------------- parsing

class _Reader:
    """Typed access to one TOML table, tracking the dotted key for errors."""

    def __init__(self, file: str, table: Mapping[str, Any], path: str = "") -> None:
        self.file, self.table, self.path = file, table, path
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def fail(self, name: str, value: object, allowed: str) -> ScenarioError:
        return ScenarioError(self.file, self.key(name), value, allowed)

    def has(self, name: str) -> bool:
        return name in self.table

    def raw(self, name: str, default: object = _MISSING) -> Any:
        self.used.add(name)
        if name not in self.table:
            return default
        return self.table[name]

    def number(self, name: str, default: float | object | None = _MISSING, *, lo: float | None = None,
               hi: float | None = None, lo_open: bool = False) -> Any:
        v = self.raw(name, default)
        if v is _MISSING:
            raise self.fail(name, _MISSING, "a number")
        if v is None and default is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.fail(name, v, "a finite number")
        below = lo is not None and (v <= lo if lo_open else v < lo)
        if below or (hi is not None and v > hi):
            rng = f"{'>' if lo_open else '>='} {lo}" if lo is not None else ""
            if hi is not None:
                rng += (" and " if rng else "") + f"<= {hi}"
            raise self.fail(name, v, f"a number {rng}")
        return float(v)

    def integer(self, name: str, default: int | object = _MISSING, *, lo: int = 0) -> int:
        v = self.raw(name, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.fail(name, v, f"a whole number >= {lo}")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        v = self.raw(name, default)
        if not isinstance(v, bool):
            raise self.fail(name, v, "true or false")
        return v

    def string(self, name: str, default: str | object = _MISSING, *,
               choices: tuple[str, ...] | None = None) -> str:
        v = self.raw(name, default)
        if not isinstance(v, str) or not v:
            raise self.fail(name, v, "a non-empty string" if choices is None else "one of " + ", ".join(choices))
        if choices is not None and v not in choices:
            raise self.fail(name, v, "one of " + ", ".join(choices))
        return v

    def strings(self, name: str, default: object = _MISSING) -> tuple[str, ...] | Any:
        v = self.raw(name, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v):
            raise self.fail(name, v, "a non-empty list of non-empty strings")
        return tuple(v)

    def sub(self, name: str, *, optional: bool = True) -> _Reader | None:
        v = self.raw(name, None if optional else _MISSING)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self.fail(name, v, "a table")
        return _Reader(self.file, v, self.key(name))

    def tables(self, name: str) -> list[_Reader]:
        v = self.raw(name, [])
        if not isinstance(v, list) or not all(isinstance(t, dict) for t in v):
            raise self.fail(name, v, f"an array of tables ([[{self.key(name)}]])")
        return [_Reader(self.file, t, f"{self.key(name)}[{i}]") for i, t in enumerate(v)]

    def done(self, allowed: tuple[str, ...] | None = None) -> None:
        known = allowed if allowed is not None else tuple(sorted(self.used))
        for k in self.table:
            if k not in known:
                raise self.fail(k, self.table[k], "one of the keys " + ", ".join(known))


def load(path: str | Path) -> Scenario:
    """Read and validate one scenario file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(str(p), "(file)", f"cannot read it ({e.strerror})", "a scenario file (TOML)") from None
    return loads(text, source=str(p), default_name=p.stem)


def one_model_fleet(nodes: int, *, p50_ms: float, rate_per_s: float, sigma: float = 0.3,
                    llm: str | None = None, faults: str = "", duration_s: float = 1500.0) -> Scenario:
    """One model ``m`` on ``nodes`` A100 nodes, every node not in ``faults`` expected to stay routed:
    lognormal latencies (``p50_ms``, ``sigma``), or with ``llm`` (a trace name) LLM requests of
    ``p50_ms`` a token that carry token counts and TTFT; ``faults`` is ``[[faults]]`` TOML."""
    model = (f'kind = "llm"\ntrace = "{llm}"\ntpot_ms = {p50_ms}' if llm
             else f"p50_ms = {p50_ms}\nsigma = {sigma}")
    tokens = "emit_tokens = true\nemit_ttft = true\n" if llm else ""
    return loads(f'''duration_s = {duration_s}
rate_per_s = {rate_per_s}
{tokens}
[[models]]
name = "m"
{model}

[nodes]
count = {nodes}
hardware = "A100"
{faults}
[expect]
others_stay = true
''')


def slowdown_fault(nodes: Sequence[str], factor: float, onset_s: float) -> str:
    """The ``[[faults]]`` TOML of ``nodes`` serving ``factor`` x slower from ``onset_s`` ("" at 1x)."""
    if factor == 1.0:
        return ""
    names = ", ".join(f'"{n}"' for n in nodes)
    return f'[[faults]]\nnodes = [{names}]\nkind = "slowdown"\nonset_s = {onset_s:g}\nfactor = {factor}\n'


def loads(text: str, *, source: str = "<scenario>", default_name: str = "scenario") -> Scenario:
    """Parse scenario TOML ``text``; ``source`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(source, "(syntax)", f"not valid TOML ({e})", "TOML (see scenarios/*.toml)") from None
    return _parse(_Reader(source, data), default_name)


def _parse(r: _Reader, default_name: str) -> Scenario:
    name = r.string("name", default_name)
    description = r.raw("description", "")
    if not isinstance(description, str):
        raise r.fail("description", description, "a string")
    duration_s = r.number("duration_s", lo=0, lo_open=True, hi=7 * 86_400)
    seed = r.integer("seed", 1)
    rate = r.number("rate_per_s", 20.0, lo=0, lo_open=True, hi=100_000)
    probe_rate = r.number("probe_rate_per_s", 0.0, lo=0, hi=100_000)
    emit_tokens = r.boolean("emit_tokens", False)
    emit_ttft = r.boolean("emit_ttft", False)
    emit_hardware = r.boolean("emit_hardware", True)
    emit_instance = r.boolean("emit_instance", False)
    if emit_ttft and not emit_tokens:
        raise r.fail("emit_ttft", True, "false unless emit_tokens = true (ttft_us is only useful with token counts)")

    models = _models(r)
    hardware = dict(HARDWARE_SPEED)
    hw = r.sub("hardware")
    if hw is not None:
        for k in list(hw.table):
            hardware[k] = hw.number(k, lo=0, lo_open=True, hi=1000)
    nodes = _nodes(r, models, hardware)
    node_ids = tuple(n.node_id for n in nodes)
    faults = _faults(r, models, nodes, node_ids)
    if (emit_tokens or emit_ttft) and not any(m.kind == "llm" for m in models):
        raise r.fail("emit_tokens", emit_tokens, "false unless a model has kind = \"llm\"")
    expect = _expect(r, models, nodes, faults)
    det: dict[str, str] = {}
    d = r.sub("detector")
    if d is not None:
        for k, v in d.table.items():
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise d.fail(k, v, "a number or string (a detector setting, see `tailguard settings`)")
            det[k] = str(v)
    r.done(("name", "description", "duration_s", "seed", "rate_per_s", "probe_rate_per_s", "emit_tokens", "emit_ttft",
            "emit_hardware", "emit_instance", "models", "hardware", "nodes", "faults", "expect", "detector"))
    return Scenario(name=name, source=r.file, duration_s=duration_s, seed=seed, rate_per_s=rate,
                    models=models, nodes=nodes, faults=faults, hardware_speed=hardware,
                    emit_tokens=emit_tokens, emit_ttft=emit_ttft, emit_hardware=emit_hardware,
                    emit_instance=emit_instance,
                    probe_rate_per_s=probe_rate, expect=expect, detector=det, description=description)


def _models(r: _Reader) -> tuple[ModelSpec, ...]:
    tables = r.tables("models")
    if not tables:
        raise r.fail("models", _MISSING, "at least one [[models]] table with a name")
    out: list[ModelSpec] = []
    for t in tables:
        name = t.string("name")
        if any(m.name == name for m in out):
            raise t.fail("name", name, "a model name not used by another [[models]] table")
        kind = t.string("kind", "lognormal", choices=MODEL_KINDS)
        rate = t.number("rate_per_s", None, lo=0, lo_open=True, hi=100_000)
        if kind == "lognormal":
            spec = ModelSpec(name, kind, rate, p50_ms=t.number("p50_ms", 180.0, lo=0, lo_open=True, hi=3.6e6),
                             sigma=t.number("sigma", 0.3, lo=0, hi=5))
            t.done(("name", "kind", "rate_per_s", "p50_ms", "sigma"))
        else:
            spec = ModelSpec(name, kind, rate, trace=t.string("trace", "conv", choices=TRACES),
                             ttft_ms=t.number("ttft_ms", 50.0, lo=0, hi=3.6e6),
                             ttft_per_input_token_ms=t.number("ttft_per_input_token_ms", 0.25, lo=0, hi=1e4),
                             tpot_ms=t.number("tpot_ms", 30.0, lo=0, lo_open=True, hi=1e5),
                             jitter_sigma=t.number("jitter_sigma", 0.05, lo=0, hi=2))
            t.done(("name", "kind", "rate_per_s", "trace", "ttft_ms", "ttft_per_input_token_ms",
                    "tpot_ms", "jitter_sigma"))
        out.append(spec)
    return tuple(out)


_NODE_KEYS = ("hardware", "models", "rate_per_s", "join_s", "speed", "ttft_factor", "tpot_factor",
              "warmup_s", "warmup_factor", "leave_s", "delivery_lag_s")


def _node_fields(t: _Reader, base: dict[str, Any], model_names: tuple[str, ...],
                 hardware: Mapping[str, float]) -> dict[str, Any]:
    out = dict(base)
    if t.has("hardware"):
        hw = t.string("hardware")
        if hw not in hardware:
            raise t.fail("hardware", hw, "a hardware class: " + ", ".join(hardware) + " (or add it under [hardware])")
        out["hardware"] = hw
    if t.has("models"):
        ms = t.strings("models")
        for m in ms:
            if m not in model_names:
                raise t.fail("models", list(ms), "names of [[models]]: " + ", ".join(model_names))
        out["models"] = ms
    num: dict[str, tuple[float | None, float | None, bool]] = {
        "rate_per_s": (0, 100_000, True), "join_s": (0, None, False), "speed": (0, 1000, True),
        "ttft_factor": (0, 1000, True), "tpot_factor": (0, 1000, True), "warmup_s": (0, 86_400, False),
        "warmup_factor": (1, 1000, False), "leave_s": (0, None, True),
        "delivery_lag_s": (0, 3600, False)}
    for k, (lo, hi, lo_open) in num.items():
        if t.has(k):
            out[k] = t.number(k, lo=lo, hi=hi, lo_open=lo_open)
    return out


def _nodes(r: _Reader, models: tuple[ModelSpec, ...], hardware: Mapping[str, float]) -> tuple[NodeSpec, ...]:
    t = r.sub("nodes", optional=False)
    assert t is not None
    model_names = tuple(m.name for m in models)
    if t.has("ids") == t.has("count"):
        raise t.fail("count", t.raw("count", _MISSING), "exactly one of nodes.count (a number) or nodes.ids (a list)")
    if t.has("ids"):
        ids = t.strings("ids")
        if len(set(ids)) != len(ids):
            raise t.fail("ids", list(ids), "a list of distinct node ids")
        t.raw("prefix")
    else:
        count = t.integer("count", lo=1)
        prefix = t.string("prefix", "gpu-node-")
        width = max(2, len(str(count)))
        ids = tuple(f"{prefix}{i:0{width}d}" for i in range(1, count + 1))
    defaults = _node_fields(t, {"hardware": "A100", "models": model_names}, model_names, hardware)
    overrides: dict[str, dict[str, Any]] = {}
    o = t.sub("override")
    if o is not None:
        for node_id in list(o.table):
            if node_id not in ids:
                raise o.fail(node_id, "{…}", "a node id of this fleet: " + ", ".join(ids))
            sub = o.sub(node_id)
            assert sub is not None
            overrides[node_id] = _node_fields(sub, defaults, model_names, hardware)
            sub.done(_NODE_KEYS)
    t.done(("count", "ids", "prefix", "override", *_NODE_KEYS))
    out = tuple(NodeSpec(node_id=i, **overrides.get(i, defaults)) for i in ids)
    for n in out:
        if n.leave_s is not None and n.leave_s <= n.join_s:
            where = o.sub(n.node_id) if o is not None and n.node_id in overrides else t
            assert where is not None
            raise where.fail("leave_s", n.leave_s, f"a time after join_s ({n.join_s:g})")
    return out


_FAULT_PARAMS: dict[str, tuple[str, ...]] = {
    "slowdown": ("factor",), "tpot": ("factor",), "ttft": ("factor",), "tail": ("factor", "share"),
    "spikes": ("factor", "period_s", "spike_s"), "errors": ("share",), "traffic": (),
    "silence": (), "restart": (),
}


def _faults(r: _Reader, models: tuple[ModelSpec, ...], nodes: tuple[NodeSpec, ...],
            node_ids: tuple[str, ...]) -> tuple[FaultSpec, ...]:
    out: list[FaultSpec] = []
    model_names = tuple(m.name for m in models)
    for t in r.tables("faults"):
        kind = t.string("kind", choices=FAULT_KINDS)
        if t.has("node") == t.has("nodes"):
            raise t.fail("node", t.raw("node", _MISSING), "exactly one of node = \"id\" (or \"*\") and nodes = [ids]")
        sel = (t.string("node"),) if t.has("node") else t.strings("nodes")
        sel = node_ids if sel == ("*",) else sel
        for n in sel:
            if n not in node_ids:
                raise t.fail("node" if t.has("node") else "nodes", n, "a node id of this fleet: " + ", ".join(node_ids))
        fmodels: tuple[str, ...] | None = None
        if t.has("model"):
            m = t.string("model")
            if m not in model_names:
                raise t.fail("model", m, "a name of [[models]]: " + ", ".join(model_names))
            fmodels = (m,)
        onset = t.number("onset_s", 0.0, lo=0)
        end = t.number("end_s", None, lo=0)
        if end is not None and end <= onset:
            raise t.fail("end_s", end, f"a time after onset_s ({onset})")
        params = _FAULT_PARAMS[kind]
        kw: dict[str, float] = {}
        for p in params:
            if p == "share":
                kw[p] = t.number(p, lo=0, lo_open=True, hi=1 if kind == "errors" else 0.49)
            else:
                kw[p] = t.number(p, lo=0, lo_open=True, hi=1e6)
        if kind == "traffic":
            kw["rate_factor"] = t.number("rate_factor", 1.0, lo=0, lo_open=True, hi=1000)
            kw["factor"] = t.number("factor", 1.0, lo=0, lo_open=True, hi=1e6)
            params = ("rate_factor", "factor")
        if kind == "restart":
            if end is None:
                raise t.fail("end_s", _MISSING, "a time: when the restarted node reports again")
            kw["factor"] = t.number("factor", 6.0, lo=1, hi=1000)       # its warm-up: ×factor,
            kw["warmup_s"] = t.number("warmup_s", 90.0, lo=0, hi=86_400)  # decaying over warmup_s
            params = ("factor", "warmup_s")
        if kind == "spikes" and not kw["spike_s"] < kw["period_s"]:
            raise t.fail("spike_s", kw["spike_s"], f"less than period_s ({kw['period_s']})")
        if kind in ("tpot", "ttft"):
            for n in sel:
                for m in fmodels or _node_models(nodes, n):
                    if next(x for x in models if x.name == m).kind != "llm":
                        raise t.fail("kind", kind, f"a kind other than tpot/ttft: model {m!r} is not kind = \"llm\"")
        t.done(("kind", "node", "nodes", "model", "onset_s", "end_s", *params))
        out.append(FaultSpec(kind, tuple(sel), fmodels, onset, end, **kw))
    return tuple(out)


def _node_models(nodes: tuple[NodeSpec, ...], node_id: str) -> tuple[str, ...]:
    return next(n.models for n in nodes if n.node_id == node_id)


def _pair(t: _Reader, node_ids: tuple[str, ...], model_names: tuple[str, ...]) -> tuple[str, str]:
    """An expectation's ``node`` and ``model`` (optional when the fleet serves one model)."""
    node = t.string("node")
    if node not in node_ids:
        raise t.fail("node", node, "a node id of this fleet: " + ", ".join(node_ids))
    if t.has("model"):
        return node, t.string("model", choices=model_names)
    if len(model_names) == 1:
        return node, model_names[0]
    raise t.fail("model", _MISSING, "a model name (the fleet serves several): " + ", ".join(model_names))


def _expect(r: _Reader, models: tuple[ModelSpec, ...], nodes: tuple[NodeSpec, ...],
            faults: tuple[FaultSpec, ...]) -> Expect:
    node_ids = tuple(n.node_id for n in nodes)
    t = r.sub("expect")
    if t is None:
        return Expect()
    model_names = tuple(m.name for m in models)
    others_stay = t.boolean("others_stay", True)
    fleet_event = t.raw("fleet_event", None)
    if fleet_event is not None and not isinstance(fleet_event, bool):
        raise t.fail("fleet_event", fleet_event, "true or false")
    ejects: list[EjectExpectation] = []
    for e in t.tables("eject"):
        node, model = _pair(e, node_ids, model_names)
        mine = [f for f in faults if f.applies(node, model) and f.kind not in ("traffic", "silence", "restart")]
        if not mine and not e.has("onset_s"):
            raise e.fail("onset_s", _MISSING, f"a time: no [[faults]] entry names {node}/{model}")
        onset = e.number("onset_s", min(f.onset_s for f in mine) if mine else 0.0, lo=0)
        ends = [f.end_s for f in mine]
        end = None if not ends or None in ends else max(x for x in ends if x is not None)
        readmit = e.number("readmit_within_s", None, lo=0, lo_open=True)
        if readmit is not None and end is None:
            raise e.fail("readmit_within_s", readmit, "no readmit_within_s unless the node's faults have end_s")
        ejects.append(EjectExpectation(node, model, onset, e.number("within_s", lo=0, lo_open=True),
                                       end, readmit))
        e.done(("node", "model", "onset_s", "within_s", "readmit_within_s"))
    gone: list[GoneExpectation] = []
    for g in t.tables("gone"):
        node, model = _pair(g, node_ids, model_names)
        leave = next((n.leave_s for n in nodes if n.node_id == node), None)
        silences = [f.onset_s for f in faults if f.kind == "silence" and f.applies(node, model)]
        default_at = leave if leave is not None else (min(silences) if silences else _MISSING)
        if default_at is _MISSING and not g.has("at_s"):
            raise g.fail("at_s", _MISSING, f"a time: {node} has no leave_s and no silence fault")
        gone.append(GoneExpectation(node, model, g.number("at_s", default_at, lo=0),
                                    g.number("within_s", lo=0, lo_open=True)))
        g.done(("node", "model", "at_s", "within_s"))
    kinds = t.strings("fleet_kinds", ())
    t.done(("others_stay", "fleet_event", "eject", "gone", "fleet_kinds"))
    return Expect(tuple(ejects), others_stay, fleet_event, tuple(gone), tuple(kinds))

