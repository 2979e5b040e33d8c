"""``tailguard drain|pin|release|mode`` — operator controls, written to Redis.

* ``tailguard drain NODE [--model M] [--reason TEXT] [--ttl S]`` — take the node
  out of routing (every model it serves, or ``M``), for ``S`` seconds or until
  released.
* ``tailguard pin NODE [--model M] [--reason TEXT] [--ttl S]`` — keep it in
  routing whatever the rules say.
* ``tailguard release NODE [--model M]`` — end the node's drain or pin (all of
  its overrides without ``--model``).
* ``tailguard mode [observe|enforce|default] [--model M]`` — set (or, without
  a mode, show) the mode; ``default`` removes the setting, so ``TAILGUARD_MODE``
  (or the every-model setting) applies again.

The worker applies a change at its next tick (see :mod:`tailguard.streaming.edge`);
these commands only write :mod:`tailguard.routing.operators`' keys. Exit codes: 0
done, 1 Redis unreachable or nothing to release, 2 bad arguments or settings.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import getpass
import math
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from redis.exceptions import RedisError

from tailguard.routing.client import call_redis, keys_for
from tailguard.routing.keys import Keys, member_text
from tailguard.routing.operators import (
    MODES,
    Action,
    Override,
    clear_overrides,
    read_operator_state,
    set_mode,
    set_override,
)
from tailguard.settings import Settings, load
from tailguard.text import printable


def _ttl(text: str) -> float:
    try:
        ttl = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ttl wants seconds, got {text!r}") from None
    if not (math.isfinite(ttl) and ttl > 0):
        raise argparse.ArgumentTypeError(f"--ttl must be > 0 seconds, got {text!r}")
    return ttl


def _node(text: str) -> str:
    if not text or len(text) > 256:
        raise argparse.ArgumentTypeError("NODE must be a node id of 1 to 256 characters")
    return text


def _override_parser(action: str, what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"tailguard {action}", description=what)
    p.add_argument("node", type=_node, metavar="NODE", help="the node id, as in the events")
    p.add_argument("--model", metavar="M", help="only for this model (default: every model)")
    p.add_argument("--reason", default="", metavar="TEXT",
                   help="why (published with the health change, shown in status)")
    p.add_argument("--ttl", type=_ttl, metavar="S", help="end by itself after S seconds")
    return p


async def _with_redis(settings: Settings, err: TextIO, prog: str,
                      body: Callable[[Any, Keys], Awaitable[int]]) -> int:
    code = await call_redis(settings, prog, err,
                            lambda c: body(c, keys_for(settings)))
    return 1 if code is None else code


def _override_main(action: Action, what: str, argv: list[str], out: TextIO, err: TextIO,
                   clock: Callable[[], float]) -> int:
    args = _override_parser(action, what).parse_args(argv)
    settings = load()
    now = clock()
    o = Override(args.node, args.model, action, reason=args.reason, set_ts=now,
                 until_ts=None if args.ttl is None else now + args.ttl, by=_user())

    async def body(redis: Any, keys: Keys) -> int:
        await set_override(redis, keys, o)
        scope = f"model {args.model!r}" if args.model else "every model"
        until = f" for {args.ttl:g} s" if args.ttl else " until released"
        print(f"{action} {args.node!r} on {scope}{until}; the worker applies it at its next tick",
              file=out)
        warning = await _unknown_target(redis, keys, args.node, args.model)
        if warning:
            print(f"tailguard {action}: warning: {warning}; the {action} is stored and applies "
                  f"if it appears (`tailguard release {args.node}` removes it)", file=err)
        return 0
    return asyncio.run(_with_redis(settings, err, action, body))


async def _unknown_target(redis: Any, keys: Keys, node: str, model: str | None) -> str | None:
    """Why ``node`` (on ``model``) is unknown to the worker's Redis keys, with the nearest
    known names; None when it is known (or Redis will not say: an ACL)."""
    try:
        models = sorted(map(member_text, await redis.smembers(keys.models)))
        if model is not None and model not in models:
            near = difflib.get_close_matches(model, models, n=3)
            return (f"no model {model!r} under key prefix {keys.prefix!r}"
                    + (f" (did you mean {', '.join(map(repr, near))}?)" if near else ""))
        nodes: set[str] = set()
        for m in [model] if model is not None else models:
            nodes.update(map(member_text, await redis.hkeys(keys.nodes(m))))
    except (RedisError, UnicodeDecodeError):
        return None
    if node in nodes:
        return None
    near = difflib.get_close_matches(node, sorted(nodes), n=3)
    scope = f"model {model!r}" if model is not None else "any model"
    return (f"no node {node!r} on {scope} under key prefix {keys.prefix!r}"
            + (f" (did you mean {', '.join(map(repr, near))}?)" if near else ""))


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""


def drain_main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None,
               clock: Callable[[], float] = time.time) -> int:
    return _override_main("drain", "Take NODE out of routing (maintenance), whatever the "
                          "rules say, until released or --ttl passes.", argv,
                          out or sys.stdout, err or sys.stderr, clock)


def pin_main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None,
             clock: Callable[[], float] = time.time) -> int:
    return _override_main("pin", "Keep NODE in routing whatever the rules say, until "
                          "released or --ttl passes.", argv, out or sys.stdout,
                          err or sys.stderr, clock)


def release_main(argv: list[str], *, out: TextIO | None = None,
                 err: TextIO | None = None) -> int:
    p = argparse.ArgumentParser(prog="tailguard release",
                                description="End NODE's drain or pin (all of them without --model).")
    p.add_argument("node", type=_node, metavar="NODE")
    p.add_argument("--model", metavar="M", help="only the override for this model")
    args = p.parse_args(argv)
    o, e = out or sys.stdout, err or sys.stderr

    async def body(redis: Any, keys: Keys) -> int:
        n = await clear_overrides(redis, keys, args.node, args.model)
        if n == 0:
            print(f"tailguard release: no override of {args.node!r}"
                  + (f" for model {args.model!r}" if args.model else ""), file=e)
            return 1
        print(f"released {n} override(s) of {args.node!r}; the worker publishes the release "
              "at its next tick", file=o)
        return 0
    return asyncio.run(_with_redis(load(), e, "release", body))


def mode_main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tailguard mode",
        description="Show or set observe/enforce mode (no restart of anything needed). "
                    "observe: verdicts are published, the routing set keeps every node.")
    p.add_argument("mode", nargs="?", choices=[*MODES, "default"],
                   help="the mode to set; 'default' removes the setting; none: show")
    p.add_argument("--model", metavar="M", help="only this model (default: every model)")
    args = p.parse_args(argv)
    o, e = out or sys.stdout, err or sys.stderr
    settings = load()

    async def body(redis: Any, keys: Keys) -> int:
        if args.mode is not None:
            await set_mode(redis, keys, args.model, None if args.mode == "default" else args.mode)
        state = await read_operator_state(redis, keys)
        every = state.modes.get("", f"{settings.mode} (TAILGUARD_MODE)")
        print(f"every model: {every}", file=o)
        for model, mode in sorted(state.modes.items()):
            if model:
                print(f"model {printable(model)}: {mode}", file=o)
        return 0
    return asyncio.run(_with_redis(settings, e, "mode", body))
