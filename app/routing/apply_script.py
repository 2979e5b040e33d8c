"""One model's verdict as one run of a Redis Lua script: atomic, idempotent, never empty.

Owns :data:`APPLY_LUA` and how a :class:`~tailguard.core.contract.types.ModelTick` (plus the
edge's :class:`Extras`) becomes its keys and arguments (:func:`script_call`) and its reply a
:class:`WriteResult` (:func:`parse_reply`). Retries: :mod:`tailguard.routing.writer`; keys:
:mod:`tailguard.routing.keys`.

* **Atomic.** A reader sees the whole previous state of the model (routing set, version,
  quarantine, statuses, held-out and shadow sets, weights, events) or the whole new one. The
  routing set is replaced in place (``DEL`` + ``SADD``), never by ``RENAME``.
* **Idempotent.** Only a routing, quarantine or held-out set that differs is rewritten, bumps
  the version and publishes ``{"model", "version"}``; statuses are always refreshed. A new
  version key starts at the server's clock in ms, so versions never repeat.
* **Weights with routing.** ``P:weights:<m>`` is written by the same run; a change of it bumps
  the version like a change of the routing set.
* **Never empties routing.** An empty routing set for a model that has one is refused (reply
  ``-1``, nothing written); a model with no node admitted yet gets no routing key.
* **ACL.** Under Redis 7+ ACLs every command is checked first: ``NOPERM`` before any write.
* **Forgetting.** :data:`FORGET_LUA` (:func:`forget_call`) removes a forgotten model in one run.
  **History apart**: :data:`HISTORY_LUA` (:func:`history_call`), after the routing write.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.core.contract.types import ModelTick
from tailguard.routing.keys import Keys, held_out, status_json, weight_fields

APPLY_LUA = r"""
-- tailguard: write one model's routing verdict atomically.
-- KEYS: 1 routing SET, 2 version, 3 quarantine ZSET, 4 nodes HASH, 5 models SET,
--       6 shadow routing SET, 7 events LIST, 8 held-out SET, 9 weights HASH;
--       in the hash-tagged layout (Redis Cluster) 8 keys, without 5: the models SET is in
--       another slot and the writer adds the model to it in its own command, before this run.
--       (The explain history is HISTORY_LUA's, written after this run.)
-- ARGV: 1 channel, 2 model, 3 #routing, 4 #quarantine, 5 #statuses,
--       6 #shadow (-1: leave the shadow set alone), 7 #events, 8 events cap, 9 #held-out,
--       10 #weights, 11 version floor (the last version this writer wrote for the model,
--       0 if none), then the routing members, then (score, node) pairs, then (node, json)
--       pairs, then the shadow members, then event jsons, then the held-out members,
--       then (node, weight) pairs.
-- An empty routing set is written only for a model that has none yet (no node admitted:
-- the key stays absent); one that would empty an existing set is refused, nothing written.
-- The weights hash (routed nodes below weight 1) moves with the routing set: a change of
-- either bumps the one version, so a reader of one version sees both.
-- Returns {routing_changed 0|1, quarantine_changed 0|1 (or -1: refused), version,
--          weights_changed 0|1}.
local routing_key, version_key, quarantine_key, nodes_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local o = (#KEYS == 9) and 1 or 0   -- 1: KEYS[5] is the models SET
local models_key = (o == 1) and KEYS[5] or nil
local shadow_key, events_key, held_key = KEYS[5 + o], KEYS[6 + o], KEYS[7 + o]
local weights_key = KEYS[8 + o]
local channel, model = ARGV[1], ARGV[2]
local n_routing = tonumber(ARGV[3])
local n_quarantine = tonumber(ARGV[4])
local n_status = tonumber(ARGV[5])
local n_shadow = tonumber(ARGV[6])
local n_events = tonumber(ARGV[7])
local events_cap = tonumber(ARGV[8])
local n_held = tonumber(ARGV[9])
local n_weights = tonumber(ARGV[10])
local version_floor = tonumber(ARGV[11])
if n_routing == nil or n_quarantine == nil or n_status == nil or n_shadow == nil
    or n_events == nil or events_cap == nil or n_held == nil
    or n_weights == nil or version_floor == nil then
  return redis.error_reply('ERR tailguard: malformed counts')
end
local first_r = 12
local first_q = first_r + n_routing
local first_s = first_q + 2 * n_quarantine
local first_w = first_s + 2 * n_status
local first_e = first_w + math.max(n_shadow, 0)
local first_o = first_e + n_events
local first_g = first_o + n_held
if #ARGV ~= first_g - 1 + 2 * n_weights then
  return redis.error_reply('ERR tailguard: argument count does not match the counts')
end

-- Under a Redis ACL, check every command first: Redis does not roll back a script that fails
-- half way, so a missing permission (say +publish) would leave a half-written model.
if redis.acl_check_cmd then
  local checks = {
    {'EXISTS', version_key}, {'GET', version_key}, {'SET', version_key, '0'}, {'INCR', version_key},
    {'SCARD', routing_key}, {'SISMEMBER', routing_key, 'n'}, {'DEL', routing_key},
    {'SADD', routing_key, 'n'}, {'ZCARD', quarantine_key}, {'ZSCORE', quarantine_key, 'n'},
    {'DEL', quarantine_key}, {'ZADD', quarantine_key, '0', 'n'}, {'DEL', nodes_key},
    {'HSET', nodes_key, 'n', 'v'}, {'TIME'}, {'PUBLISH', channel, 'm'},
    {'DEL', shadow_key}, {'SADD', shadow_key, 'n'},
    {'LPUSH', events_key, 'e'}, {'LTRIM', events_key, '0', '0'}, {'EXISTS', routing_key},
    {'SCARD', held_key}, {'SISMEMBER', held_key, 'n'}, {'DEL', held_key}, {'SADD', held_key, 'n'},
    {'HGETALL', weights_key}, {'DEL', weights_key},
    {'HSET', weights_key, 'n', 'v'},
  }
  if models_key then
    table.insert(checks, {'SADD', models_key, 'm'})
  end
  for _, c in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply('NOPERM tailguard: this ACL user may not run ' .. c[1] ..
        (c[2] and (' on ' .. c[2]) or '') .. '; nothing was written (see docs/production.md)')
    end
  end
end

local CHUNK = 512  -- even, so (score, member) and (field, value) pairs never split
local function put(cmd, key, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + CHUNK - 1, to)
    redis.call(cmd, key, unpack(ARGV, i, j))
    i = j + 1
  end
end

if n_routing < 1 and redis.call('EXISTS', routing_key) == 1 then
  return {0, -1, 0, 0}   -- never empty a routing set: the last written one stays
end

-- same size and every wanted (distinct) member present => same set
local function same_set(key, from, to)
  if redis.call('SCARD', key) ~= to - from + 1 then
    return false
  end
  for i = from, to do
    if redis.call('SISMEMBER', key, ARGV[i]) == 0 then
      return false
    end
  end
  return true
end

local routing_changed = redis.call('EXISTS', version_key) == 0
  or not same_set(routing_key, first_r, first_q - 1)
local held_changed = not same_set(held_key, first_o, first_g - 1)

local have = redis.call('HGETALL', weights_key)   -- small: the nodes below weight 1 only
local weights_changed = #have ~= 2 * n_weights
if not weights_changed then
  local current = {}
  for i = 1, #have, 2 do
    current[have[i]] = have[i + 1]
  end
  for i = first_g, #ARGV, 2 do
    if current[ARGV[i]] ~= ARGV[i + 1] then
      weights_changed = true
      break
    end
  end
end

local quarantine_changed = redis.call('ZCARD', quarantine_key) ~= n_quarantine
if not quarantine_changed then
  for i = first_q, first_s - 1, 2 do
    local have = redis.call('ZSCORE', quarantine_key, ARGV[i + 1])
    if not have or tonumber(have) ~= tonumber(ARGV[i]) then
      quarantine_changed = true
      break
    end
  end
end

if routing_changed then
  redis.call('DEL', routing_key)
  put('SADD', routing_key, first_r, first_q - 1)
end
if quarantine_changed then
  redis.call('DEL', quarantine_key)
  put('ZADD', quarantine_key, first_q, first_s - 1)
end
if held_changed then
  redis.call('DEL', held_key)
  put('SADD', held_key, first_o, first_g - 1)
end
if weights_changed then
  redis.call('DEL', weights_key)
  put('HSET', weights_key, first_g, #ARGV)
end

redis.call('DEL', nodes_key)
put('HSET', nodes_key, first_s, first_w - 1)
if models_key then
  redis.call('SADD', models_key, model)
end
if n_shadow >= 0 then
  redis.call('DEL', shadow_key)
  put('SADD', shadow_key, first_w, first_e - 1)
end
if n_events > 0 then
  put('LPUSH', events_key, first_e, first_o - 1)
  redis.call('LTRIM', events_key, 0, events_cap - 1)
end

local version
-- A replica promoted after a failover may lack the last writes it was not sent: its version
-- is then below one readers saw. The writer's floor moves it past that (readers never see a
-- version go back), whether or not the content changed.
local stored = tonumber(redis.call('GET', version_key))
local behind = stored ~= nil and stored < version_floor
if routing_changed or quarantine_changed or held_changed or weights_changed or behind then
  if behind then
    version = version_floor + 1
    redis.call('SET', version_key, string.format('%.0f', version))
  elseif stored == nil then
    -- A new (or lost) version key starts at the server's time in ms, so that a version
    -- never repeats after Redis lost its data: readers compare versions with ~=.
    local t = redis.call('TIME')
    version = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('SET', version_key, string.format('%.0f', version))
  else
    version = redis.call('INCR', version_key)
  end
  if version <= version_floor then
    version = version_floor + 1
    redis.call('SET', version_key, string.format('%.0f', version))
  end
  redis.call('PUBLISH', channel, cjson.encode({model = model, version = version}))
else
  version = stored
end
return {routing_changed and 1 or 0, (quarantine_changed or held_changed) and 1 or 0, version,
  weights_changed and 1 or 0}
"""


EVENTS_CAP = 50   # newest health changes / fleet events kept per model (P:events:<m>)

FORGET_LUA = r"""
-- tailguard: forget one model atomically: out of the models SET, every key deleted.
-- KEYS: 1 models SET, then the model's keys; ARGV: 1 model. Reply: keys deleted.
redis.call('SREM', KEYS[1], ARGV[1])
return redis.call('DEL', unpack(KEYS, 2))
"""


HISTORY_LUA = r"""
-- tailguard: replace one model's explain history, written after its routing (APPLY_LUA
-- never touches it). KEYS: 1 history HASH; ARGV: (node, json) pairs.
-- Reply: the nodes written.
redis.call('DEL', KEYS[1])
local CHUNK = 512  -- even: a (field, value) pair never splits
for i = 1, #ARGV, CHUNK do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + CHUNK - 1, #ARGV)))
end
return #ARGV / 2
"""


def history_call(keys: Keys, model: str,
                 history: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The KEYS and ARGV of :data:`HISTORY_LUA` for ``model``'s ``history`` (node → JSON)."""
    return [keys.history(model)], _flat(sorted(history.items()))


def forget_call(keys: Keys, model: str) -> tuple[list[str], list[str | int]]:
    """The KEYS and ARGV of :data:`FORGET_LUA` for ``model`` (the plain layout; the tagged one
    takes the model out of ``P:models`` with ``SREM``, then one ``DEL`` of its keys, of one slot)."""
    return [keys.models, *keys.model_keys(model)], [model]


@dataclass(frozen=True, slots=True)
class Extras:
    """What the stage-2 edge writes next to a verdict (see :mod:`tailguard.routing.keys`).

    ``shadow``: the would-be routing set (None: leave the key alone);
    ``annotations``: extra fields merged into a node's status JSON;
    ``events``: JSON documents pushed onto the model's event list, oldest first;
    ``held_out``: the nodes to hold out (None: :func:`tailguard.routing.keys.held_out` of the tick);
    ``weights``: the routed nodes' weights below 1.0 to write (None: the tick's ``weights``;
    empty: the weights hash is deleted, as in ``TAILGUARD_WEIGHTS=observe|off``).
    """

    shadow: frozenset[str] | None = None
    annotations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    held_out: frozenset[str] | None = None     # None: derived from the tick (keys.held_out)
    weights: Mapping[str, float] | None = None  # None: the tick's


NO_EXTRAS = Extras()


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one successful script run did."""

    model: str
    version: int
    routing_changed: bool
    quarantine_changed: bool           # the quarantine or the held-out set
    refused_empty: bool = False        # an empty routing set for a model that has one: nothing written
    has_routing: bool = True           # a routing set was written (False: none admitted yet)
    weights_changed: bool = False      # the weights hash (it bumps the version too)
    forgotten: bool = False            # the model's keys were deleted (FORGET_LUA)

    @property
    def changed(self) -> bool:
        return self.routing_changed or self.quarantine_changed or self.weights_changed


def _flat(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [x for pair in pairs for x in pair]


def validate(tick: ModelTick) -> None:
    """Raise ``ValueError`` for a malformed tick (a programming error, never Redis's)."""
    if not isinstance(tick.model, str) or not tick.model:
        raise ValueError(f"ModelTick.model must be a non-empty string, got {tick.model!r}")
    for node in tick.routing:
        if not isinstance(node, str) or not node:
            raise ValueError(f"routing set of model {tick.model!r} holds a bad node id {node!r}")
    for node, ts in tick.quarantine.items():
        if not isinstance(node, str) or not node:
            raise ValueError(f"quarantine of model {tick.model!r} holds a bad node id {node!r}")
        if math.isnan(ts):
            raise ValueError(f"quarantine of model {tick.model!r}: probe-after ts of {node!r} is NaN")
    for s in tick.statuses:
        if s.model != tick.model:
            raise ValueError(
                f"ModelTick for model {tick.model!r} carries a status of model {s.model!r} "
                f"(node {s.node_id!r})"
            )


def script_call(keys: Keys, tick: ModelTick, extras: Extras, now_ts: float,
                version_floor: int = 0) -> tuple[list[str], list[str | int]]:
    """The KEYS and ARGV of :data:`APPLY_LUA` for ``tick`` (statuses stamped ``now_ts``;
    ``version_floor``: the last version written for the model, which the new one exceeds)."""
    k, m = keys, tick.model
    routing = sorted(tick.routing)
    quarantine = [(repr(float(ts)), node) for node, ts in sorted(tick.quarantine.items())]
    notes = extras.annotations
    # A histogram model its buckets cannot resolve: said on each status, for the status page.
    flag = {"unresolved": dict(tick.unresolved)} if tick.unresolved else None
    statuses = {s.node_id: status_json(s, updated_ts=now_ts, extra=notes.get(s.node_id) if flag is None
                                       else {**notes.get(s.node_id, {}), **flag})
                for s in tick.statuses}
    shadow = None if extras.shadow is None else sorted(extras.shadow)
    held = sorted(held_out(tick.statuses, tick.routing) if extras.held_out is None
                  else extras.held_out)
    weights = weight_fields(tick.weights if extras.weights is None else extras.weights,
                            tick.routing)
    args: list[str | int] = [
        k.channel, m, len(routing), len(quarantine), len(statuses),
        -1 if shadow is None else len(shadow),
        len(extras.events), EVENTS_CAP, len(held), len(weights), version_floor,
        *routing, *_flat(quarantine), *_flat(sorted(statuses.items())),
        *(shadow or ()), *extras.events, *held, *_flat(weights),
    ]
    models = [] if k.tagged else [k.models]     # tagged: not in the model's slot (see APPLY_LUA)
    return ([k.routing(m), k.version(m), k.quarantine(m), k.nodes(m), *models,
             k.shadow(m), k.events(m), k.held_out(m), k.weights(m)], args)


def parse_reply(tick: ModelTick, raw: Sequence[Any]) -> WriteResult:
    """The script's reply ``{routing_changed, quarantine_changed or -1, version,
    weights_changed}``."""
    routing_changed, quarantine_changed, version, weights_changed = (int(x) for x in raw)
    if quarantine_changed < 0:
        return WriteResult(tick.model, version, False, False, refused_empty=True)
    return WriteResult(tick.model, version, bool(routing_changed), bool(quarantine_changed),
                       has_routing=bool(tick.routing), weights_changed=bool(weights_changed))
