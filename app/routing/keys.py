"""Redis key layout of tailguard's routing state — the one place that builds key names.

Owns every key and channel name (:class:`Keys`; ``P`` = the prefix, ``<m>`` = the encoded model)
in two layouts (docs/contracts.md, "Redis"): *plain* (default) ``P:routing:<m>``,
``P:routing:<m>:version``, ``P:held-out:<m>``, ``P:quarantine:<m>``, ``P:nodes:<m>``,
``P:routing-shadow:<m>``, ``P:history:<m>``, ``P:events:<m>``, ``P:weights:<m>``; *tagged* (Redis
Cluster) ``P:{<m>}:routing``, ``P:{<m>}:routing:version`` …, a model's keys in one hash slot.
Global in both: ``P:models``, ``P:overrides``, ``P:mode``, the channel ``P:routing:changes``. Also
the values that cross the contract: :func:`status_json`, :func:`held_out`, :func:`weight_fields`,
:func:`change_message` / :func:`parse_change_message`.

* Keys are unambiguous: :func:`encode_model` percent-encodes ``%``, ``:``, whitespace and
  control characters (``foo:version`` cannot collide with ``foo``'s version key); it is
  injective and :func:`decode_model` inverts it. ``P:models`` and the pub/sub messages carry
  raw names; node ids are stored raw, as members and hash fields, never in a key.
* All keys of one model are written together by one Lua script
  (:mod:`tailguard.routing.apply_script`); in the tagged layout they share one hash slot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson

from tailguard.core.contract.types import HealthState, NodeStatus

DEFAULT_PREFIX = "tailguard"


LAYOUTS = ("plain", "tagged")


def _needs_escape(c: str, braces: bool = False) -> bool:
    return c in "%:" or c.isspace() or not c.isprintable() or (braces and c in "{}")


def encode_model(model: str, *, braces: bool = False) -> str:
    """The form of ``model`` used inside key names (injective; see module docstring).
    ``braces``: ``{`` and ``}`` encoded too (the tagged layout: the hash tag is the whole name)."""
    if not model:
        raise ValueError("model name must be a non-empty string")
    if not any(_needs_escape(c, braces) for c in model):
        return model
    out: list[str] = []
    for c in model:
        if _needs_escape(c, braces):
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
    """Key builders for one prefix and layout. ``Keys("tailguard").routing("m")`` →
    ``tailguard:routing:m``; ``Keys("tailguard", tagged=True).routing("m")`` →
    ``tailguard:{m}:routing`` (every key of model ``m`` in the slot of ``m``)."""

    prefix: str = DEFAULT_PREFIX
    tagged: bool = False

    def __post_init__(self) -> None:
        if not self.prefix or any(c.isspace() for c in self.prefix):
            raise ValueError(
                f"key prefix {self.prefix!r} must be non-empty and contain no whitespace "
                "(TAILGUARD_KEY_PREFIX)"
            )

    @property
    def layout(self) -> str:
        return "tagged" if self.tagged else "plain"

    def _of(self, kind: str, model: str, suffix: str = "") -> str:
        if self.tagged:
            return f"{self.prefix}:{{{encode_model(model, braces=True)}}}:{kind}{suffix}"
        return f"{self.prefix}:{kind}:{encode_model(model)}{suffix}"

    def routing(self, model: str) -> str:
        return self._of("routing", model)

    def version(self, model: str) -> str:
        return self._of("routing", model, ":version")

    def quarantine(self, model: str) -> str:
        return self._of("quarantine", model)

    def held_out(self, model: str) -> str:
        return self._of("held-out", model)

    def nodes(self, model: str) -> str:
        return self._of("nodes", model)

    def shadow(self, model: str) -> str:
        return self._of("routing-shadow", model)

    def history(self, model: str) -> str:
        return self._of("history", model)

    def events(self, model: str) -> str:
        return self._of("events", model)

    def weights(self, model: str) -> str:
        return self._of("weights", model)

    def model_keys(self, model: str) -> tuple[str, ...]:
        """Every key of ``model`` (not the global ones): what forgetting or renaming it moves."""
        m = model
        return (self.routing(m), self.version(m), self.quarantine(m), self.nodes(m),
                self.shadow(m), self.history(m), self.events(m), self.held_out(m),
                self.weights(m))

    @property
    def models(self) -> str:
        return f"{self.prefix}:models"

    @property
    def overrides(self) -> str:
        return f"{self.prefix}:overrides"

    @property
    def mode(self) -> str:
        return f"{self.prefix}:mode"

    @property
    def channel(self) -> str:
        return f"{self.prefix}:routing:changes"


def as_keys(keys: str | Keys) -> Keys:
    """``keys`` itself, or the plain layout of the prefix ``keys`` (callers that pass a prefix)."""
    return keys if isinstance(keys, Keys) else Keys(keys)


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
    (Unix s of the write). Missing and non-finite numbers are ``null``, never 0. ``extra`` (from the
    stage-2 edge) adds ``mode``, ``routed_by_rules`` and ``override``
    (:mod:`tailguard.streaming.edge`), and on a histogram model whose buckets cannot resolve it
    ``unresolved`` (metric → first bucket bound in s, :mod:`tailguard.core.judge.hist_resolution`).
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
    # orjson, for its speed on 1,000 statuses a model and tick (docs/performance.md, "Every
    # verdict in Redis before the bookkeeping"); a non-finite number anywhere is null.
    return orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY).decode()


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
