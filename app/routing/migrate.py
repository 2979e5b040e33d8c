"""``tailguard keys copy|drop`` — moving the routing keys between the plain and the hash-tagged layout.

* ``tailguard keys copy [--from-url URL] [--from-layout plain|tagged]`` copies every model of
  ``P:models`` from the source (default: the Redis of ``TAILGUARD_REDIS_URL``, plain names) to
  the Redis and layout the settings name (``TAILGUARD_REDIS_CLUSTER``, ``TAILGUARD_KEY_LAYOUT``),
  and ``P:overrides`` / ``P:mode`` when the source is another Redis.
* ``tailguard keys drop --layout plain|tagged`` deletes every model's keys of that layout (never
  the layout the settings use), once every reader reads the new names.

Guarantees: one model at a time, its keys read in one ``MULTI`` (``DUMP``) and written in one
``MULTI`` on the destination (``DEL`` of its keys there, ``RESTORE``), so a reader of the new
names sees a model whole or not at all; the model joins the destination's ``P:models`` after its
keys. Values, types and the version are copied as they are (the worker continues the version).
Run it with the worker stopped (docs/operations.md, "Redis Cluster"). Exit codes: 0 done, 1 Redis
unreachable or refused, 2 bad arguments or settings (nothing to copy: the same keys).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import Any, TextIO

from redis.exceptions import RedisError

from tailguard.core.contract.config import SettingError
from tailguard.routing.client import call_redis, connect_for, keys_for
from tailguard.routing.keys import Keys, member_text
from tailguard.settings import Settings, load, redact_url


async def copy_model(src: Any, src_keys: Keys, dst: Any, dst_keys: Keys, model: str) -> int:
    """Copy one model's keys (see the module docstring); the number of keys copied."""
    async with src.pipeline(transaction=True) as pipe:
        for key in src_keys.model_keys(model):
            pipe.dump(key)
        dumps = await pipe.execute()
    async with dst.pipeline(transaction=True) as pipe:
        pipe.delete(*dst_keys.model_keys(model))
        for key, value in zip(dst_keys.model_keys(model), dumps, strict=True):
            if value is not None:
                pipe.restore(key, 0, value, replace=True)
        await pipe.execute()
    await dst.sadd(dst_keys.models, model)
    return sum(v is not None for v in dumps)


async def copy_all(src: Any, src_keys: Keys, dst: Any, dst_keys: Keys, *, globals_too: bool,
                   out: TextIO) -> int:
    """Every model of the source's ``P:models`` (and, with ``globals_too``, the overrides and
    modes); prints one line per model. The number of models copied."""
    models = sorted(member_text(m) for m in await src.smembers(src_keys.models))
    for i, m in enumerate(models, 1):
        n = await copy_model(src, src_keys, dst, dst_keys, m)
        print(f"[{i}/{len(models)}] {m}: {n} key(s) -> {dst_keys.routing(m)} …", file=out)
    if globals_too:
        for key in (src_keys.overrides, src_keys.mode):
            value = await src.dump(key)
            if value is not None:
                await dst.restore(key, 0, value, replace=True)
                print(f"{key} copied", file=out)
    return len(models)


async def drop_layout(redis: Any, keys: Keys, out: TextIO) -> int:
    """Delete every model's keys named in ``keys``' layout; the number of keys deleted."""
    gone = 0
    for m in sorted(member_text(x) for x in await redis.smembers(keys.models)):
        gone += int(await redis.delete(*keys.model_keys(m)))
    print(f"{gone} key(s) of the {keys.layout} layout deleted under prefix {keys.prefix!r}",
          file=out)
    return gone


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailguard keys", description=(
        "Move the routing keys between the plain and the hash-tagged (Redis Cluster) layout; "
        "the destination is the Redis and layout of the settings."))
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("copy", help="copy every model's keys into the settings' Redis and layout")
    c.add_argument("--from-url", help="the source Redis (default: TAILGUARD_REDIS_URL, the same "
                                      "Redis); a single Redis or a Sentinel-less primary")
    c.add_argument("--from-layout", choices=("plain", "tagged"), default="plain",
                   help="the source's key names (default plain)")
    d = sub.add_parser("drop", help="delete every model's keys of one layout")
    d.add_argument("--layout", choices=("plain", "tagged"), required=True)
    return p


async def _run(args: argparse.Namespace, settings: Settings, out: TextIO, err: TextIO) -> int:
    dst_keys = keys_for(settings)
    if args.action == "drop":
        keys = Keys(settings.key_prefix, tagged=args.layout == "tagged")
        if keys == dst_keys:
            raise SettingError("--layout", args.layout, "the layout the settings do NOT use "
                               "(TAILGUARD_KEY_LAYOUT, TAILGUARD_REDIS_CLUSTER): it is the live one")
        done = await call_redis(settings, "keys drop", err, lambda r: drop_layout(r, keys, out))
        return 1 if done is None else 0
    src_keys = Keys(settings.key_prefix, tagged=args.from_layout == "tagged")
    same_redis = args.from_url in (None, settings.redis_url)
    if same_redis and src_keys == dst_keys:
        raise SettingError("--from-layout", args.from_layout, "another layout than the settings' "
                           f"({dst_keys.layout}) or --from-url another Redis: nothing to copy")
    src_settings = settings if same_redis else dataclasses.replace(
        settings, redis_url=args.from_url, redis_cluster=False, redis_sentinels="")
    src = connect_for(src_settings)
    try:
        if not same_redis:
            try:
                await src.ping()
            except (RedisError, OSError) as e:
                print(f"tailguard keys copy: cannot reach the source Redis at "
                      f"{redact_url(args.from_url)} (--from-url): {type(e).__name__}: {e}", file=err)
                return 1
        done = await call_redis(settings, "keys copy", err, lambda dst: copy_all(
            src, src_keys, dst, dst_keys, globals_too=not same_redis, out=out))
    finally:
        await src.aclose()
    if done is None:
        return 1
    print(f"{done} model(s) copied from {redact_url(src_settings.redis_url)} ({src_keys.layout}) "
          f"to {redact_url(settings.redis_url)} ({dst_keys.layout})", file=out)
    return 0


def main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(_run(args, load(), out or sys.stdout, err or sys.stderr))
