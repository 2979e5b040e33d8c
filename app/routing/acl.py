"""The minimal Redis ACL of tailguard: which keys, channel and commands it needs.

:func:`acl_rules` returns the rules of an ACL user (``ACL SETUSER <name> on
>password <rules>``) for a key prefix. ``role="worker"`` is what the worker
(the routing writer, :mod:`tailguard.routing.writer`, and the operator edge that
expires overrides) and ``tailguard drain/pin/release/mode`` need;
``role="reader"`` what load balancers, ``tailguard proxy``/``probe``/
``haproxy-sync``, ``tailguard status`` and ``tailguard explain`` need
(:mod:`tailguard.routing.reader`, :mod:`tailguard.routing.status`, :mod:`tailguard.routing.explain`).

Commands called inside the writer's Lua script are checked against the ACL
too, so they are listed. ``hello`` is for RESP3 clients; ``client|setinfo``
(Redis 7.2+, sent by redis-py on connect) may be added, but redis-py ignores
its refusal. ``scripts/redis`` creates user ``tailguard`` with the worker rules
for prefix ``tailguard`` (tests/unit/test_redis_acl.py checks they agree), and
the integration tests run the worker and the proxy as users with exactly
these rules, so a missing permission fails CI.
"""

from __future__ import annotations

from typing import Literal

from tailguard.routing.keys import Keys

# PING at start (tailguard.routing.client.check_redis); HELLO for RESP3 clients.
_CONNECTION = ("ping", "hello")
# The routing reader: polls versions, loads a model in MULTI/EXEC, follows the channel.
# tailguard explain and the status page: a node's status/history (HGET), its membership in the
# routing and shadow sets (SISMEMBER, EXISTS), its probe time (ZSCORE), the events LIST.
READER_COMMANDS = (
    *_CONNECTION, "get", "smembers", "zrange", "hgetall", "multi", "exec", "discard", "subscribe", "unsubscribe",
    "hget", "sismember", "exists", "zscore", "lrange")
# The routing writer: EVALSHA of the apply script (SCRIPT LOAD after NOSCRIPT) and what the script calls.
WORKER_COMMANDS = (
    *READER_COMMANDS, "evalsha", "eval", "script|load", "scard", "sadd",
    "zcard", "zadd", "hset", "set", "incr", "del", "time", "publish",
    # The script's events LIST (P:events:<m>); the worker deletes expired operator overrides
    # (HGET/HDEL compare-and-delete in P:overrides); drain/pin/release/mode write P:overrides, P:mode.
    "lpush", "ltrim", "hdel", "hkeys",
    # Forgetting a model: SREM from P:models (the forget script; its own command with hash-tagged keys).
    "srem")
# On a Redis Cluster, redis-py's cluster client also reads the slot map (CLUSTER SLOTS) and the
# command table (COMMAND, to find a command's keys); both read-only.
CLUSTER_COMMANDS = ("cluster|slots", "command")


def acl_rules(prefix: str, role: Literal["worker", "reader"] = "worker", *,
              cluster: bool = False) -> str:
    """The ACL rules (no user name, no password) for ``prefix``: keys ``prefix:*``, its channel
    (``cluster``: with :data:`CLUSTER_COMMANDS`; set the user on every node of the cluster)."""
    keys = Keys(prefix)
    commands = WORKER_COMMANDS if role == "worker" else READER_COMMANDS
    extra = CLUSTER_COMMANDS if cluster else ()
    return " ".join([f"~{prefix}:*", "resetchannels", f"&{keys.channel}", "-@all",
                     *(f"+{c}" for c in (*commands, *extra))])
