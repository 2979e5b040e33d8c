"""Redis ACL users with exactly the documented rules (tailguard.routing.acl), for one test.

``async with acl_users(admin, unique_name) as make:`` then ``await make(prefix, role,
without=())`` → ``(user, password)``: a new user with ``acl_rules(prefix, role)`` less the
commands ``without``. On exit the users and every key under their prefixes are deleted.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

import redis.asyncio as aioredis

from tailguard.routing.acl import acl_rules

MakeUser = Callable[..., Awaitable[tuple[str, str]]]


@contextlib.asynccontextmanager
async def acl_users(admin: aioredis.Redis, unique_name: Callable[[str], str]) -> AsyncIterator[MakeUser]:
    made: list[tuple[str, str]] = []

    async def make(prefix: str, role: str, without: tuple[str, ...] = ()) -> tuple[str, str]:
        user, password = unique_name(f"acl-{role}"), secrets.token_hex(16)
        rules = [r for r in acl_rules(prefix, role=role).split() if r.lstrip("+") not in without]
        await admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", *rules)
        made.append((user, prefix))
        return user, password

    try:
        yield make
    finally:
        for user, prefix in made:
            await admin.execute_command("ACL", "DELUSER", user)
            keys = [k async for k in admin.scan_iter(match=f"{prefix}:*")]
            if keys:
                await admin.delete(*keys)
