"""Operator controls in Redis: overrides (drain, pin) and the observe/enforce mode.

Owns the values of ``P:overrides`` and ``P:mode`` (:mod:`tailguard.routing.keys`):
the ``tailguard drain|pin|release|mode`` commands write them, the worker's
stage-2 edge (:mod:`tailguard.streaming.edge`) reads them every tick.

* ``P:overrides`` HASH: field = JSON ``["node", "model"]`` (``null`` model: every
  model the node serves), value = JSON of :class:`Override`. A model-specific
  override wins over a node-wide one. ``until`` (Unix s) ends it: the worker
  then treats it as released, publishes the release and deletes the field
  (compare-and-delete, so an override set again meanwhile stays).
* ``P:mode`` HASH: field ``""`` = every model, or a model name; value
  ``observe`` or ``enforce``. A model's field wins over ``""``, which wins over
  ``TAILGUARD_MODE``. Changing it needs no restart of anything.

Values that do not parse are skipped and reported by :func:`read_overrides`
(never raised): an operator's typo must not stop the stream.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis

from tailguard.routing.keys import Keys

Action = Literal["drain", "pin"]
ACTIONS: tuple[Action, ...] = ("drain", "pin")
MODES = ("observe", "enforce")

# Delete a hash field only when it still holds the value that was read.
_CAS_HDEL_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Override:
    """One operator override of one node (for one model, or ``model=None``: all of them)."""

    node_id: str
    model: str | None
    action: Action
    reason: str = ""
    set_ts: float = 0.0
    until_ts: float | None = None
    by: str = ""
    raw: str | None = field(default=None, compare=False)   # the stored value, as read

    def key(self) -> str:
        return override_field(self.node_id, self.model)

    def value(self) -> str:
        return json.dumps({"action": self.action, "reason": self.reason, "ts": self.set_ts,
                           "until": self.until_ts, "by": self.by}, separators=(",", ":"))

    def expired(self, now_s: float) -> bool:
        return self.until_ts is not None and now_s >= self.until_ts

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "model": self.model, "action": self.action,
                "reason": self.reason, "ts": self.set_ts, "until": self.until_ts, "by": self.by}


def override_field(node_id: str, model: str | None) -> str:
    return json.dumps([node_id, model], separators=(",", ":"), ensure_ascii=False)


def parse_override(name: str | bytes, value: str | bytes) -> Override:
    """An :class:`Override` from one ``P:overrides`` entry; ``ValueError`` saying what is wrong."""
    f = name.decode() if isinstance(name, bytes) else name
    v = value.decode() if isinstance(value, bytes) else value
    try:
        key, body = json.loads(f), json.loads(v)
    except ValueError as e:
        raise ValueError(f"override {f!r}: not JSON ({e})") from None
    if (not isinstance(key, list) or len(key) != 2 or not isinstance(key[0], str) or not key[0]
            or not (key[1] is None or (isinstance(key[1], str) and key[1]))):
        raise ValueError(f"override field {f!r}: want [\"node\", \"model\" or null]")
    if not isinstance(body, dict) or body.get("action") not in ACTIONS:
        raise ValueError(f"override {f!r}: action must be one of {', '.join(ACTIONS)}")
    until = body.get("until")
    if until is not None and not (isinstance(until, int | float) and math.isfinite(until)):
        raise ValueError(f"override {f!r}: until must be a Unix time or null, got {until!r}")
    ts = body.get("ts", 0.0)
    return Override(node_id=key[0], model=key[1], action=body["action"],
                    reason=str(body.get("reason") or ""),
                    set_ts=float(ts) if isinstance(ts, int | float) else 0.0,
                    until_ts=None if until is None else float(until), by=str(body.get("by") or ""),
                    raw=v)


@dataclass(frozen=True, slots=True)
class OperatorState:
    """Everything operators set, as read in one round trip."""

    overrides: tuple[Override, ...] = ()
    modes: Mapping[str, str] = field(default_factory=dict)
    bad: tuple[str, ...] = ()      # entries that did not parse, with why

    def mode_of(self, model: str, default: str) -> str:
        return self.modes.get(model) or self.modes.get("") or default

    def for_model(self, model: str) -> dict[str, Override]:
        """node → the override that applies to it for ``model`` (model-specific wins)."""
        out: dict[str, Override] = {}
        for o in self.overrides:
            if o.model is None:
                out.setdefault(o.node_id, o)
        for o in self.overrides:
            if o.model == model:
                out[o.node_id] = o
        return out


async def read_operator_state(redis: aioredis.Redis, keys: Keys) -> OperatorState:
    """Overrides and modes in one ``MULTI``/``EXEC`` (two reads on a Redis Cluster, where the two
    hashes are in different slots); unparsable entries land in ``bad``."""
    async with redis.pipeline(transaction=not keys.tagged) as pipe:
        pipe.hgetall(keys.overrides)
        pipe.hgetall(keys.mode)
        raw_over, raw_mode = await pipe.execute()
    overrides: list[Override] = []
    bad: list[str] = []
    for f, v in raw_over.items():
        try:
            overrides.append(parse_override(f, v))
        except ValueError as e:
            bad.append(str(e))
    modes: dict[str, str] = {}
    for f, v in raw_mode.items():
        name = f.decode() if isinstance(f, bytes) else str(f)
        mode = v.decode() if isinstance(v, bytes) else str(v)
        if mode in MODES:
            modes[name] = mode
        else:
            bad.append(f"mode of {name or 'every model'!r}: {mode!r} is not observe or enforce")
    overrides.sort(key=lambda o: (o.node_id, o.model or ""))
    return OperatorState(tuple(overrides), modes, tuple(bad))


async def set_override(redis: aioredis.Redis, keys: Keys, override: Override) -> None:
    await redis.hset(keys.overrides, override.key(), override.raw or override.value())


async def clear_overrides(redis: aioredis.Redis, keys: Keys, node_id: str,
                          model: str | None) -> int:
    """Remove the node's override for ``model`` (None: every override of the node)."""
    if model is not None:
        return int(await redis.hdel(keys.overrides, override_field(node_id, model)))
    fields = [f for f in await redis.hkeys(keys.overrides)
              if _field_node(f) == node_id]
    return int(await redis.hdel(keys.overrides, *fields)) if fields else 0


def _field_node(name: bytes | str) -> str | None:
    try:
        key = json.loads(name)
    except ValueError:
        return None
    return key[0] if isinstance(key, list) and key and isinstance(key[0], str) else None


async def delete_if_unchanged(redis: aioredis.Redis, keys: Keys, override: Override) -> bool:
    """Delete an expired override unless an operator replaced it since it was read."""
    done = await redis.eval(_CAS_HDEL_LUA, 1, keys.overrides, override.key(), override.raw or override.value())
    return bool(done)


async def set_mode(redis: aioredis.Redis, keys: Keys, model: str | None, mode: str | None) -> None:
    """Set the mode of ``model`` (None: every model); ``mode=None`` removes the setting."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be observe or enforce, got {mode!r}")
    name = model or ""
    if mode is None:
        await redis.hdel(keys.mode, name)
    else:
        await redis.hset(keys.mode, name, mode)
