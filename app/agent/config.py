"""The agent's configuration: a TOML file, a few flags and the worker's connection variables.

:func:`load_config` builds one frozen :class:`AgentConfig` and validates it
at start; a bad value raises :class:`AgentConfigError` naming the key (or
flag, or variable), the value and what is allowed. From the environment the
agent reads only what it shares with the worker — ``TAILGUARD_KAFKA_BOOTSTRAP``,
``TAILGUARD_TOPIC_DIAGNOSTICS_REQUESTS``, ``TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS`` and the
Kafka security variables (``TAILGUARD_KAFKA_SECURITY_PROTOCOL``, SASL, TLS, ``…_FILE``
secrets: :class:`~tailguard.kafka_security.KafkaSecurity`, the worker's own rules and client
options) — so one environment file can serve both. Everything else is in the file
(see docs/diagnostics.md for a full example); flags win over the file.

This module does not import ``tailguard.settings`` (which pulls in the detector's
configuration): the agent is installed without the worker's dependencies.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tailguard.agent.parse import FATAL_XIDS
from tailguard.kafka_security import KafkaSecurity

CHECK_NAMES = ("nvidia_smi", "compute_apps", "xid", "dcgmi", "gemm")
ON_FAIL = ("recoverable", "not_recoverable", "inconclusive")


class AgentConfigError(ValueError):
    """A bad agent setting: names the key, the value and what is allowed."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r:.80} is not valid: expected {allowed}")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node id this agent answers for, and its GPU indices (None: every GPU of the host)."""

    node_id: str
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class UserCheck:
    """A command whose JSON (or exit code) becomes findings (see ``parse.user_check_findings``)."""

    name: str
    command: tuple[str, ...]
    timeout_s: float = 30.0
    on_fail: str = "inconclusive"


@dataclass(frozen=True, slots=True)
class AgentConfig:
    nodes: tuple[NodeSpec, ...]
    kafka_bootstrap: str = "127.0.0.1:9092"
    security: KafkaSecurity = field(default_factory=KafkaSecurity)   # SASL, TLS (repr: no secret)
    requests_topic: str = "node-diagnostics-requests"
    results_topic: str = "node-diagnostics-results"
    group_id: str = ""                       # "" → default_group(nodes)
    max_request_age_s: float = 3600.0        # older requests are not answered (see runner)
    state_dir: str = ""                      # GEMM history; "" → ~/.local/state/tailguard-agent
    expected_gpus: int | None = None         # per node; fewer visible → gpu_missing
    expected_processes: tuple[str, ...] = ()  # regexes of the inference server's process names
    xid_lookback_s: float = 86400.0
    fatal_xids: frozenset[int] = FATAL_XIDS
    timeouts_s: Mapping[str, float] = field(default_factory=lambda: {
        "nvidia_smi": 20.0, "compute_apps": 20.0, "xid": 15.0, "dcgmi": 180.0, "gemm": 120.0})
    dcgmi_level: int = 1
    gemm_size: int = 8192
    gemm_iters: int = 50
    gemm_min_ratio: float = 0.7
    gemm_history: int = 20
    gemm_command: tuple[str, ...] = ()       # () → python -m tailguard.agent.gemm; same JSON if yours
    user_checks: tuple[UserCheck, ...] = ()

    def __post_init__(self) -> None:
        if not self.nodes:
            raise AgentConfigError("--node", "", "at least one node id (--node ID or nodes = [...])")
        for n in self.nodes:
            if not n.node_id or len(n.node_id) > 256:
                raise AgentConfigError("nodes", n.node_id, "non-empty node ids of at most 256 chars")
        if not self.kafka_bootstrap or not all(_host_port(h) for h in self.kafka_bootstrap.split(",")):
            raise AgentConfigError("TAILGUARD_KAFKA_BOOTSTRAP", self.kafka_bootstrap, "host:port[,host:port…]")
        for name, v in (("max_request_age_s", self.max_request_age_s),
                        ("xid_lookback_s", self.xid_lookback_s),
                        *((f"timeouts_s.{k}", t) for k, t in self.timeouts_s.items())):
            if not v > 0:
                raise AgentConfigError(name, v, "a number of seconds > 0")
        unknown = set(self.timeouts_s) - set(CHECK_NAMES)
        if unknown:
            raise AgentConfigError(f"timeouts_s.{sorted(unknown)[0]}", "", f"one of {', '.join(CHECK_NAMES)}")
        if not 0 < self.gemm_min_ratio <= 1:
            raise AgentConfigError("gemm.min_ratio", self.gemm_min_ratio, "a fraction in (0, 1]")
        for name, iv in (("gemm.size", self.gemm_size), ("gemm.iters", self.gemm_iters),
                         ("gemm.history", self.gemm_history)):
            if iv < 1:
                raise AgentConfigError(name, iv, "a whole number >= 1")
        if self.expected_gpus is not None and self.expected_gpus < 1:
            raise AgentConfigError("expected_gpus", self.expected_gpus, "a whole number >= 1")
        for pat in self.expected_processes:
            try:
                re.compile(pat)
            except re.error as e:
                raise AgentConfigError("expected_processes", pat, f"a regular expression ({e})") from None
        for c in self.user_checks:
            if c.on_fail not in ON_FAIL:
                raise AgentConfigError(f"check.{c.name}.on_fail", c.on_fail, " or ".join(ON_FAIL))
            if not c.command:
                raise AgentConfigError(f"check.{c.name}.command", "", "a non-empty list of strings")

    def timeout(self, check: str) -> float:
        return float(self.timeouts_s.get(check, 30.0))

    @property
    def group(self) -> str:
        return self.group_id or default_group(self.nodes)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir or os.path.expanduser("~/.local/state/tailguard-agent"))


def _host_port(text: str) -> bool:
    host, sep, port = text.strip().rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) <= 65535)


def default_group(nodes: tuple[NodeSpec, ...]) -> str:
    """``tailguard-agent-<node ids>``: one consumer group per agent (see docs/diagnostics.md)."""
    ids = "_".join(sorted(n.node_id for n in nodes))
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", ids)
    return "tailguard-agent-" + safe[:200]


def parse_node(text: str) -> NodeSpec:
    """``ID`` or ``ID=0,1`` (the GPU indices of that node on this host)."""
    node, sep, gpus = text.partition("=")
    if not sep:
        return NodeSpec(node.strip())
    try:
        idx = tuple(int(g) for g in gpus.split(",") if g.strip())
    except ValueError:
        raise AgentConfigError("--node", text, "ID or ID=GPU[,GPU…] with GPU indices") from None
    return NodeSpec(node.strip(), idx or None)


def _nodes_from_file(v: Any) -> tuple[NodeSpec, ...]:
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return tuple(parse_node(x) for x in v)
    if isinstance(v, dict):
        out = []
        for k, g in v.items():
            if not (isinstance(g, list) and all(isinstance(i, int) for i in g)):
                raise AgentConfigError(f"nodes.{k}", g, "a list of GPU indices")
            out.append(NodeSpec(k, tuple(g) or None))
        return tuple(out)
    raise AgentConfigError("nodes", v, 'a list of node ids or a table {"node" = [gpu, …]}')


def _user_checks(v: Any) -> tuple[UserCheck, ...]:
    if not isinstance(v, list):
        raise AgentConfigError("check", v, "an array of tables [[check]]")
    out = []
    for i, c in enumerate(v):
        name = c.get("name", f"check{i}") if isinstance(c, dict) else f"check{i}"
        cmd = c.get("command") if isinstance(c, dict) else None
        if isinstance(cmd, str):
            cmd = ["/bin/sh", "-c", cmd]
        if not (isinstance(cmd, list) and cmd and all(isinstance(x, str) for x in cmd)):
            raise AgentConfigError(f"check.{name}.command", cmd, "a command string or a list of strings")
        assert isinstance(c, dict)
        out.append(UserCheck(str(name), tuple(cmd), float(c.get("timeout_s", 30.0)),
                             str(c.get("on_fail", "inconclusive"))))
    return tuple(out)


_FILE_KEYS = {"nodes", "group_id", "max_request_age_s", "state_dir", "expected_gpus",
              "expected_processes", "xid_lookback_s", "fatal_xids", "timeouts_s", "dcgmi",
              "gemm", "check", "kafka_bootstrap"}


def from_mapping(doc: Mapping[str, Any], base: AgentConfig | None = None) -> AgentConfig:
    """An :class:`AgentConfig` from a parsed TOML document (over ``base``'s values)."""
    unknown = sorted(set(doc) - _FILE_KEYS)
    if unknown:
        raise AgentConfigError(unknown[0], doc[unknown[0]], f"a known key ({', '.join(sorted(_FILE_KEYS))})")
    kw: dict[str, Any] = {}
    key = ""

    def conv(name: str, fn: Any, value: Any) -> Any:
        nonlocal key
        key = name
        return fn(value)

    try:
        if "nodes" in doc:
            kw["nodes"] = _nodes_from_file(doc["nodes"])
        for k in ("group_id", "state_dir", "kafka_bootstrap"):
            if k in doc:
                kw[k] = conv(k, str, doc[k])
        for k in ("max_request_age_s", "xid_lookback_s"):
            if k in doc:
                kw[k] = conv(k, float, doc[k])
        if "expected_gpus" in doc:
            kw["expected_gpus"] = conv("expected_gpus", int, doc["expected_gpus"])
        if "expected_processes" in doc:
            kw["expected_processes"] = conv("expected_processes", lambda v: tuple(str(x) for x in v),
                                            doc["expected_processes"])
        if "fatal_xids" in doc:
            kw["fatal_xids"] = conv("fatal_xids", lambda v: frozenset(int(x) for x in v), doc["fatal_xids"])
        if "timeouts_s" in doc:
            kw["timeouts_s"] = {**(base.timeouts_s if base else AgentConfig((NodeSpec("x"),)).timeouts_s),
                                **{str(k): conv(f"timeouts_s.{k}", float, v)
                                   for k, v in doc["timeouts_s"].items()}}
        gemm = doc.get("gemm", {})
        for k in ("size", "iters", "history"):
            if k in gemm:
                kw[f"gemm_{k}"] = conv(f"gemm.{k}", int, gemm[k])
        if "command" in gemm:
            kw["gemm_command"] = conv("gemm.command", lambda v: tuple(str(x) for x in v), gemm["command"])
        if "min_ratio" in gemm:
            kw["gemm_min_ratio"] = conv("gemm.min_ratio", float, gemm["min_ratio"])
        if "level" in doc.get("dcgmi", {}):
            kw["dcgmi_level"] = conv("dcgmi.level", int, doc["dcgmi"]["level"])
        if "check" in doc:
            kw["user_checks"] = _user_checks(doc["check"])
    except AgentConfigError:
        raise
    except (TypeError, ValueError, AttributeError) as e:
        raise AgentConfigError(key or "config file", type(e).__name__,
                               f"a value of the documented type ({e})") from None
    if base is None:
        nodes = kw.pop("nodes", ())
        return AgentConfig(nodes, **kw)
    return replace(base, **kw)


def load_config(path: str | None, nodes: list[str], environ: Mapping[str, str] | None = None,
                **flags: Any) -> AgentConfig:
    """The file at ``path`` (TOML; optional), then the environment, then flags (``None`` = unset)."""
    env = os.environ if environ is None else environ
    doc: dict[str, Any] = {}
    if path:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as e:
            raise AgentConfigError("--config", path, f"a readable TOML file ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise AgentConfigError("--config", path, f"valid TOML ({e})") from None
    if nodes:
        doc["nodes"] = nodes
    doc.setdefault("nodes", [])
    conn: dict[str, Any] = {}
    conn["security"] = KafkaSecurity.from_env(env, AgentConfigError)
    if "TAILGUARD_KAFKA_BOOTSTRAP" in env:
        conn["kafka_bootstrap"] = env["TAILGUARD_KAFKA_BOOTSTRAP"]
    if "TAILGUARD_TOPIC_DIAGNOSTICS_REQUESTS" in env:
        conn["requests_topic"] = env["TAILGUARD_TOPIC_DIAGNOSTICS_REQUESTS"]
    if "TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS" in env:
        conn["results_topic"] = env["TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS"]
    conn.update({k: v for k, v in flags.items() if v is not None})
    nodes_spec = _nodes_from_file(doc.pop("nodes"))
    if "kafka_bootstrap" in doc and "kafka_bootstrap" not in conn:
        conn["kafka_bootstrap"] = str(doc.pop("kafka_bootstrap"))
    doc.pop("kafka_bootstrap", None)
    base = AgentConfig(nodes_spec, **conn) if nodes_spec else None
    if base is None:
        raise AgentConfigError("--node", "", "at least one node id (--node ID or nodes = [...] in the config file)")
    return from_mapping(doc, base)
