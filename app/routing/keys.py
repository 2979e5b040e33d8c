"""Redis key layout of tailguard's routing state — the one place that builds key names.

Owns the names of every key and channel (:class:`Keys`; ``P`` = the key prefix, ``<m>`` = the
encoded model name): ``P:routing:<m>``, ``P:held-out:<m>``, ``P:routing:<m>:version``,
``P:quarantine:<m>``, ``P:nodes:<m>``, ``P:models``, ``P:routing-shadow:<m>``,
``P:history:<m>``, ``P:events:<m>``, ``P:weights:<m>`` (:func:`weights_key`), ``P:overrides``,
``P:mode`` and the channel ``P:routing:changes`` (what each holds: docs/contracts.md, "Redis").
Also the values that cross it: :func:`status_json`, :func:`held_out`, :func:`weight_fields`,
:func:`change_message` / :func:`parse_change_message`.

Guarantees:

* Keys are unambiguous: :func:`encode_model` percent-encodes ``%``, ``:``, whitespace and
  control characters (``foo:version`` cannot collide with ``foo``'s version key); it is
  injective and :func:`decode_model` inverts it. ``P:models`` and the pub/sub messages carry
  raw names; node ids are stored raw, as members and hash fields, never in a key.
* All keys of one model are written together by one Lua script
  (:mod:`tailguard.routing.apply_script`): one Redis (or a primary with replicas), not Redis
  Cluster, whose slots would split them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from tailguard.core.contract.types import HealthState, NodeStatus

DEFAULT_PREFIX = "tailguard"


def _needs_escape(c: str) -> bool:
    return c in "%:" or c.isspace() or not c.isprintable()


def encode_model(model: str) -> str:
    """The form of ``model`` used inside key names (injective; see module docstring)."""
    if not model:
        raise ValueError("model name must be a non-empty string")
    if not any(_needs_escape(c) for c in model):
        return model
    out: list[str] = []
    for c in model:
        if _needs_escape(c):
            out.append("".join(f"%{b:02X}" for b in c.encode("utf-8")))
        else:
            out.append(c)
    return "".join(out)


def decode_model(encoded: str) -> str:
    """Inverse of :func:`encode_model`."""
    return unquote(encoded, encoding="utf-8", errors="strict")


def member_text(raw: bytes | str) -> str:
    """A node id or model name as Redis returns it (bytes without ``decode_responses``)."""
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builders for one prefix. ``Keys("tailguard").routing("m")`` → ``tailguard:routing:m``."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix or any(c.isspace() for c in self.prefix):
            raise ValueError(
                f"key prefix {self.prefix!r} must be non-empty and contain no whitespace "
                "(TAILGUARD_KEY_PREFIX)"
            )

    def routing(self, model: str) -> str:
        return f"{self.prefix}:routing:{encode_model(model)}"

    def version(self, model: str) -> str:
        return f"{self.prefix}:routing:{encode_model(model)}:version"

    def quarantine(self, model: str) -> str:
        return f"{self.prefix}:quarantine:{encode_model(model)}"

    def held_out(self, model: str) -> str:
        return f"{self.prefix}:held-out:{encode_model(model)}"

    def nodes(self, model: str) -> str:
        return f"{self.prefix}:nodes:{encode_model(model)}"

    @property
    def models(self) -> str:
        return f"{self.prefix}:models"

    def shadow(self, model: str) -> str:
        return f"{self.prefix}:routing-shadow:{encode_model(model)}"

    def history(self, model: str) -> str:
        return f"{self.prefix}:history:{encode_model(model)}"

    def events(self, model: str) -> str:
        return f"{self.prefix}:events:{encode_model(model)}"

    def weights(self, model: str) -> str:
        return f"{self.prefix}:weights:{encode_model(model)}"

    @property
    def overrides(self) -> str:
        return f"{self.prefix}:overrides"

    @property
    def mode(self) -> str:
        return f"{self.prefix}:mode"

    @property
    def channel(self) -> str:
        return f"{self.prefix}:routing:changes"


def weights_key(prefix: str, model: str) -> str:
    """``P:weights:<m>``: hash node id → weight in (0, 1) as a decimal string ("0.45"); a
    routed node with no field has weight 1.0."""
    return Keys(prefix).weights(model)


def weight_text(weight: float) -> str:
    """A weight as stored in the weights hash: a short decimal string ("0.45", "0.1")."""
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"a routing weight must be in (0, 1], got {weight!r}")
    return f"{weight:.4g}"


def weight_fields(weights: Mapping[str, float],
                  routing: AbstractSet[str]) -> list[tuple[str, str]]:
    """The (node, weight text) fields of the weights hash: the routed nodes below 1.0, sorted
    (a node out of routing has no weight)."""
    return [(n, weight_text(w)) for n, w in sorted(weights.items()) if w < 1.0 and n in routing]


def status_json(status: NodeStatus, *, updated_ts: float,
                extra: Mapping[str, Any] | None = None) -> str:
    """The JSON stored in ``P:nodes:<m>`` for one node.

    Fields: ``state``, ``routed``, ``since`` (Unix s of entering ``state``),
    ``reason``, ``p50_us``/``p99_us`` and ``ratio`` (raw latency: ``p99_us / p50_us``),
    ``signal_p50``/``signal_p99``/``signal_ratio`` (of the judged ``signal``), ``samples``,
    ``hardware``, ``probe_after`` (Unix s, quarantined nodes), ``updated``
    (Unix s of the write). Missing numbers are ``null``, never 0. ``extra`` (from the
    stage-2 edge) adds ``mode``, ``routed_by_rules`` and ``override``
    (:mod:`tailguard.streaming.edge`).
    """
    def num(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    d: dict[str, Any] = {
        "state": str(status.state),
        "routed": status.routed,
        "since": num(status.since_ts),
        "reason": status.reason,
        "p50_us": num(status.latency_p50_us),
        "p99_us": num(status.latency_p99_us),
        "ratio": num(status.latency_ratio),
        "samples": status.samples,
        "signal": status.signal,
        "signal_p50": num(status.p50),
        "signal_p99": num(status.p99),
        "signal_ratio": num(status.ratio),
        "hardware": status.hardware,
        "probe_after": num(status.probe_after_ts),
        "updated": updated_ts,
    }
    if status.weight is not None:
        d["weight"] = status.weight
        d["weight_detail"] = status.weight_detail
    if extra:
        d.update(extra)
    return json.dumps(d, separators=(",", ":"), allow_nan=False)


def held_out(statuses: Iterable[NodeStatus], routing: AbstractSet[str]) -> frozenset[str]:
    """The nodes tailguard took out: known (any state but ``unknown``), not in ``routing``,
    and not a new node awaiting admission (``warming`` and not routed, judged on the
    traffic its load balancer's own list gives it)."""
    return frozenset(s.node_id for s in statuses
                     if s.node_id not in routing and s.state is not HealthState.UNKNOWN
                     and not (s.state is HealthState.WARMING and not s.routed))


def change_message(model: str, version: int) -> str:
    """The pub/sub message body (the writer's Lua script builds the same JSON)."""
    return json.dumps({"model": model, "version": version}, separators=(",", ":"))


def parse_change_message(data: str | bytes) -> tuple[str, int] | None:
    """``(model, version)`` from a pub/sub message, or ``None`` if it is not one of ours."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    model, version = obj.get("model"), obj.get("version")
    if not isinstance(model, str) or not model or isinstance(version, bool):
        return None
    if not isinstance(version, int):
        return None
    return model, version
