"""Building the Redis client that the routing writer, reader and ``tailguard status`` use.

redis-py's defaults (5 s socket timeouts, 10 retries with back-off) can hold a
caller for many seconds when Redis is down. tailguard's writer and reader have
their own retry loops, so the client here fails fast: short timeouts and one
immediate retry (enough to replace a pooled connection that a Redis restart
closed).

:func:`call_redis` is how the ``tailguard`` commands that read or write Redis
(status, explain, drain/pin/release/mode) run one step and report an
unreachable Redis the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TextIO, TypeVar
from urllib.parse import urlparse, urlunparse

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError


def connect(url: str, *, timeout_s: float = 2.0) -> aioredis.Redis:
    """A client for ``url`` (``TAILGUARD_REDIS_URL``) that fails within about ``2 × timeout_s``."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        decode_responses=False,
    )


T = TypeVar("T")


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages)."""
    u = urlparse(url)
    if u.password is None:
        return url
    netloc = u.netloc.replace(f":{u.password}@", ":***@", 1)
    return urlunparse(u._replace(netloc=netloc))


async def call_redis(url: str, prog: str, err: TextIO,
                     body: Callable[[aioredis.Redis], Awaitable[T]]) -> T | None:
    """Run ``body`` on a client for ``url``; None (after a message naming
    ``TAILGUARD_REDIS_URL`` on ``err``) when Redis cannot be reached."""
    client = connect(url)
    try:
        return await body(client)
    except (RedisError, OSError, TimeoutError) as e:
        print(f"tailguard {prog}: cannot reach Redis at {redacted(url)} "
              f"({type(e).__name__}: {e}). Start it (scripts/redis) or point TAILGUARD_REDIS_URL "
              "at the Redis that tailguard writes to.", file=err)
        return None
    finally:
        await client.aclose()
