"""``tailguard status [--model M] [--json]`` — the per-model table of nodes, read from Redis.

Reads the ``P:models`` SET and, per model, in one ``MULTI``/``EXEC``: the
version, the routing SET, the quarantine ZSET, the ``P:nodes:<m>`` HASH and the
``P:weights:<m>`` HASH (keys of :mod:`tailguard.routing.keys`). The ``routed`` column is
membership of the routing SET — what load balancers actually use — not the status
JSON's own flag, with the node's weight when below 1.0 (``yes (weight 0.45)``, from
the weights hash). The ``p99/p50`` column is the ratio of the raw latency columns next to it
(computed from ``p99_us``/``p50_us``, so it is right for statuses written by any
version). A node under an operator override shows it in ``routed`` (``drained``,
``pinned``) and ``reason`` (who, why, until when); a node kept in routing only
by observe mode shows ``(observe)``, and the title the model's mode.

A key of the wrong Redis type (something else wrote it) blinds only its own model: the
other models are shown as usual, and the broken one is shown with what its other keys
hold and marked ``unreadable``, naming the key, the type found and the type expected
(:class:`KeyProblem`; ``errors`` in ``--json``). "cannot reach Redis" is said only when
Redis cannot be reached. Exit codes: 0 shown, 1 Redis unreachable, ``P:models`` unreadable
or ``--model`` unknown, 2 bad settings (via ``tailguard``), 3 shown but some model's key
is unreadable (:data:`EXIT_UNREADABLE`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from tailguard.core.contract.types import p99_p50_ratio
from tailguard.routing.client import call_redis, keys_for
from tailguard.routing.errors import WrongKeyType
from tailguard.routing.keys import Keys, as_keys, member_text
from tailguard.routing.weighted import parse_weights
from tailguard.settings import load
from tailguard.text import printable

EXIT_UNREADABLE = 3


@dataclass(frozen=True, slots=True)
class KeyProblem:
    """One of a model's keys that could not be read: ``found`` is the Redis type it holds
    (``TYPE``), ``expected`` the type tailguard writes there."""

    key: str
    expected: str
    found: str

    def text(self) -> str:
        return f"key {printable(self.key)} holds a {self.found}, expected a {self.expected}"

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "expected": self.expected, "found": self.found,
                "message": self.text()}


async def key_problem(redis: aioredis.Redis, key: str, expected: str) -> KeyProblem:
    """The :class:`KeyProblem` of ``key`` after a read of it failed with a Redis error."""
    found = await redis.type(key)
    return KeyProblem(key, expected, member_text(found))


async def read_checked(redis: aioredis.Redis, reads: list[tuple[str, str, str]],
                       list_len: int = 20) -> tuple[list[Any], list[KeyProblem]]:
    """Run ``reads`` — ``(command, key, expected type)`` with command one of ``get``,
    ``smembers``, ``zrange`` (with scores), ``hgetall``, ``lrange`` (the first ``list_len``) — in one
    ``MULTI``/``EXEC``. A read that fails on a key of another type gives ``None`` in its
    place and a :class:`KeyProblem`; the others are returned as usual."""
    async with redis.pipeline(transaction=True) as pipe:
        for command, key, _ in reads:
            if command == "zrange":
                pipe.zrange(key, 0, -1, withscores=True)
            elif command == "lrange":
                pipe.lrange(key, 0, list_len - 1)
            else:
                getattr(pipe, command)(key)
        raw = await pipe.execute(raise_on_error=False)
    values: list[Any] = []
    problems: list[KeyProblem] = []
    for (_, key, expected), got in zip(reads, raw, strict=True):
        if isinstance(got, ResponseError):
            problems.append(await key_problem(redis, key, expected))
            values.append(None)
        else:
            values.append(got)
    return values, problems


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """What Redis holds for one model; ``errors`` names its keys that could not be read."""

    model: str
    version: int | None
    routing: frozenset[str]
    quarantine: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: tuple[KeyProblem, ...] = ()
    weights: dict[str, float] = field(default_factory=dict)   # routed nodes below 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "routing": sorted(self.routing),
            "quarantine": dict(sorted(self.quarantine.items())),
            "weights": dict(sorted(self.weights.items())),
            "nodes": {
                n: {**self.nodes.get(n, {}), "in_routing_set": n in self.routing}
                for n in self.all_nodes()
            },
            "errors": [p.to_dict() for p in self.errors],
        }

    def all_nodes(self) -> list[str]:
        return sorted(set(self.nodes) | self.routing | set(self.quarantine))


def _status_obj(raw: bytes | str) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {"state": "?", "reason": "unreadable status JSON"}
    return obj if isinstance(obj, dict) else {"state": "?", "reason": "unreadable status JSON"}


async def read_status(
    redis: aioredis.Redis, key_prefix: str | Keys, models: Iterable[str] | None = None
) -> list[ModelStatus]:
    """Every model's status (or just ``models``), sorted by model name.

    A model's key of the wrong type is in its ``errors``; ``P:models`` of the wrong type
    raises :class:`~tailguard.routing.errors.WrongKeyType`."""
    keys = as_keys(key_prefix)
    wanted: Iterable[bytes | str]
    if models is None:
        try:
            wanted = await redis.smembers(keys.models)
        except ResponseError:
            problem = await key_problem(redis, keys.models, "set")
            raise WrongKeyType(problem.key, problem.expected, problem.found) from None
    else:
        wanted = models
    names = sorted({member_text(m) for m in wanted})
    out: list[ModelStatus] = []
    for m in names:
        (raw_version, raw_routing, raw_quarantine, raw_nodes, raw_weights), problems = await read_checked(
            redis, [("get", keys.version(m), "string"), ("smembers", keys.routing(m), "set"),
                    ("zrange", keys.quarantine(m), "zset"), ("hgetall", keys.nodes(m), "hash"),
                    ("hgetall", keys.weights(m), "hash")])
        version: int | None = None
        if raw_version is not None:
            try:
                version = int(raw_version)
            except ValueError:
                problems.append(KeyProblem(keys.version(m), "string holding an integer",
                                           "string holding no integer"))
        out.append(ModelStatus(
            model=m,
            version=version,
            routing=frozenset(member_text(n) for n in raw_routing or ()),
            quarantine={member_text(n): float(s) for n, s in raw_quarantine or ()},
            nodes={member_text(n): _status_obj(v) for n, v in (raw_nodes or {}).items()},
            errors=tuple(problems),
            weights=parse_weights(raw_weights or {})[0],
        ))
    return out


def _ms(us: object) -> str:
    if isinstance(us, int | float) and not isinstance(us, bool) and math.isfinite(us):
        return f"{us / 1000:.1f}"
    return "-"


def _num(x: object, fmt: str) -> str:
    if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x):
        return format(x, fmt)
    return "-"


def _raw_ratio(st: dict[str, Any]) -> str:
    def num(key: str) -> float | None:
        x = st.get(key)
        return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None
    return _num(p99_p50_ratio(num("p50_us"), num("p99_us")), ".2f")


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _override_text(o: dict[str, Any], now_s: float) -> str:
    text = f"{o['action']} by operator"
    if o.get("by"):
        text += f" {o['by']}"
    if o.get("reason"):
        text += f": {o['reason']}"
    until = o.get("until")
    if isinstance(until, int | float) and not isinstance(until, bool):
        text += f" (ends in {_age(until - now_s)})"
    return text


def format_table(statuses: list[ModelStatus], now_s: float,
                 stale_after_s: float | None = None) -> str:
    """The human table: one block per model; its title says when the worker last wrote it
    (flagged when that is more than ``stale_after_s`` ago)."""
    header = ("node", "state", "routed", "p50 ms", "p99 ms", "p99/p50", "samples", "since",
              "probe in", "reason")
    blocks: list[str] = []
    for ms in statuses:
        rows: list[tuple[str, ...]] = []
        for n in ms.all_nodes():
            st = ms.nodes.get(n, {})
            since = st.get("since")
            probe = ms.quarantine.get(n)
            routed = "yes" if n in ms.routing else "no"
            reason = printable(str(st.get("reason", "-")))
            override = st.get("override")
            if isinstance(override, dict) and override.get("action") in ("drain", "pin"):
                routed += " (drained)" if override["action"] == "drain" else " (pinned)"
                reason += f"; {_override_text(override, now_s)}"
            elif st.get("mode") == "observe" and st.get("routed_by_rules") is False:
                routed += " (observe)"
            elif n in ms.routing and n in ms.weights:
                routed += f" (weight {ms.weights[n]:g})"
            rows.append((
                printable(n),
                str(st.get("state", "?")),
                routed,
                _ms(st.get("p50_us")),
                _ms(st.get("p99_us")),
                _raw_ratio(st),
                _num(st.get("samples"), "d"),
                _age(now_s - since) if isinstance(since, int | float) else "-",
                "-" if probe is None else ("now" if probe <= now_s else _age(probe - now_s)),
                reason,
            ))
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        title = (f"model {printable(ms.model)}  version {ms.version if ms.version is not None else '-'}  "
                 f"routed {len(ms.routing)}/{len(rows)}  quarantined {len(ms.quarantine)}")
        modes = {str(st.get("mode")) for st in ms.nodes.values()} & {"observe", "enforce"}
        if modes:
            title += f"  mode {'/'.join(sorted(modes))}"
        signals = {str(sig) for st in ms.nodes.values() if (sig := st.get("signal"))}
        if signals:   # one per model; more while stage 2's choice has not reached every worker
            title += f"  signal {printable('/'.join(sorted(signals)))}"
            if any(st.get("signal_local") for st in ms.nodes.values()):
                title += " (chosen per worker: no stage-2 choice yet)"
        if ms.errors:
            title += "  UNREADABLE"
        written = [u for st in ms.nodes.values() if isinstance(u := st.get("updated"), int | float)]
        if written:
            age_s = now_s - max(written)
            title += f"  written {_age(age_s)} ago"
            if stale_after_s is not None and age_s > stale_after_s:
                title += " (stale: is tailguard worker running?)"
        lines = [title]
        lines += [f"  unreadable: {p.text()} (something else wrote it: delete the key, "
                  "tailguard worker rewrites it)" for p in ms.errors]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard status",
        description="Per-model table of nodes (state, routing, latency), read from Redis "
                    "(TAILGUARD_REDIS_URL, TAILGUARD_KEY_PREFIX).",
    )
    p.add_argument("--model", action="append", metavar="M",
                   help="show only this model (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO,
               clock: Callable[[], float]) -> int:
    settings = load()
    statuses = await call_redis(settings, "status", err,
                                lambda c: read_status(c, keys_for(settings), args.model))
    if statuses is None:
        return 1
    if args.model:
        missing = [s.model for s in statuses if s.version is None and not s.routing and not s.nodes]
        if missing:
            print(f"tailguard status: no routing state in Redis for model(s) {', '.join(missing)} "
                  f"(key prefix {settings.key_prefix!r}, TAILGUARD_KEY_PREFIX)", file=err)
            return 1
    if args.json:
        json.dump({"key_prefix": settings.key_prefix, "ts": clock(),
                   "models": [s.to_dict() for s in statuses]}, out, indent=2)
        out.write("\n")
    elif not statuses:
        print(f"no models in Redis under key prefix {settings.key_prefix!r} yet "
              "(tailguard worker writes them each tick)", file=out)
    else:
        print(format_table(statuses, clock(), 3 * settings.detector.tick_interval_s), file=out)
    problems = [p for s in statuses for p in s.errors]
    for p in problems:
        print(f"tailguard status: model shown as unreadable: {p.text()}", file=err)
    return EXIT_UNREADABLE if problems else 0


def main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None,
         clock: Callable[[], float] = time.time) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(_run(args, out or sys.stdout, err or sys.stderr, clock))
