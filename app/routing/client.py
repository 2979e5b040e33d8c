"""Building the Redis client that the routing writer, reader and ``tailguard status`` use.

redis-py's defaults (5 s socket timeouts, 10 retries with back-off) can hold a caller for many
seconds when Redis is down; tailguard's writer and reader retry by themselves, so the client here
fails fast: short timeouts, one immediate retry (a pooled connection a restart closed).

:func:`connect_for` builds it from the settings, with the credentials and TLS
options of :func:`tailguard.security.redis_client_options` (``rediss://``, ACL user); with
``TAILGUARD_REDIS_SENTINELS`` set it is a Sentinel-managed client
(:func:`connect_sentinel`) that finds the current primary again after a failover; with
``TAILGUARD_REDIS_CLUSTER`` a Redis Cluster client (:func:`connect_cluster`).
:func:`keys_for` is the key layout the settings choose (plain, or hash-tagged).

:func:`call_redis` is how the ``tailguard`` commands that read or write Redis
(status, explain, drain/pin/release/mode) run one step: with the same
credentials and TLS (:func:`connect_for`, after :func:`check_redis` names a refused
login, ACL or certificate: one PING, its failures turned into
:class:`tailguard.security.AccessRefused` naming the setting), and an unreachable
Redis reported the same way (password redacted). This module imports
:mod:`tailguard.security` (the options, the error), never the other way round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, TypeVar, cast
from urllib.parse import parse_qs, urlparse

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tailguard.core.contract.config import SettingError
from tailguard.routing.errors import RoutingError
from tailguard.routing.keys import Keys
from tailguard.security import AccessRefused, _cert_problem, redis_client_options
from tailguard.settings import Settings, redact_url


def connect(url: str, *, timeout_s: float = 2.0, **options: Any) -> aioredis.Redis:
    """A client for ``url`` (``TAILGUARD_REDIS_URL``) that fails within about ``2 × timeout_s``.

    ``options`` go to ``Redis.from_url`` (credentials, ``ssl_*``).
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        decode_responses=False,
        **options,
    )


def connect_sentinel(sentinels: str, master: str, *, db: int = 0, timeout_s: float = 2.0,
                     **options: Any) -> aioredis.Redis:
    """A client of the primary that the sentinels at ``sentinels`` (``host:port,…``) name
    ``master``. Each new connection asks them where the primary is, so after a failover
    the client's next retry reaches the new one; ``options`` as for :func:`connect`."""
    from redis.asyncio.sentinel import Sentinel

    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    hosts = [(h.rsplit(":", 1)[0].strip("[]"), int(h.rsplit(":", 1)[1]))
             for h in (x.strip() for x in sentinels.split(",")) if h]
    sentinel = Sentinel(hosts, sentinel_kwargs={"socket_connect_timeout": timeout_s,
                                                "socket_timeout": timeout_s})
    client: aioredis.Redis = sentinel.master_for(
        master, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1), decode_responses=False, db=db, **options)
    return client


def connect_cluster(url: str, *, timeout_s: float = 2.0, **options: Any) -> aioredis.Redis:
    """A Redis Cluster client that finds every node from the one of ``url``; ``options`` as for
    :func:`connect`. Typed as a Redis: the routing code calls only what both implement
    (one model's keys share a slot, so its ``MULTI``/``EXEC`` and script run on one node)."""
    from redis.asyncio import cluster

    if not hasattr(cluster, "TransactionStrategy"):   # MULTI/EXEC in cluster pipelines
        raise SettingError("TAILGUARD_REDIS_CLUSTER", "true", "a redis-py with transactions in "
                           "asyncio cluster pipelines (pip install -U 'redis>=8'), or false")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    client: Any = cluster.RedisCluster.from_url(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1), decode_responses=False, **options)
    return cast(aioredis.Redis, client)


def keys_for(settings: Settings) -> Keys:
    """The key names ``settings`` choose: ``TAILGUARD_KEY_PREFIX`` in the plain or the
    hash-tagged layout (``TAILGUARD_KEY_LAYOUT``, ``TAILGUARD_REDIS_CLUSTER``)."""
    return Keys(settings.key_prefix, tagged=settings.tagged_keys)


def connect_for(settings: Settings, *, timeout_s: float = 2.0) -> aioredis.Redis:
    """:func:`connect` to ``settings.redis_url`` with its credentials and TLS settings
    (through the sentinels when ``settings.redis_sentinels`` is set, as a cluster client with
    ``settings.redis_cluster``)."""
    options = redis_client_options(settings)
    if settings.redis_cluster:
        return connect_cluster(settings.redis_url, timeout_s=timeout_s, **options)
    if settings.redis_sentinels:
        url = urlparse(settings.redis_url)
        db = int(url.path.removeprefix("/") or parse_qs(url.query).get("db", ["0"])[0])
        if url.username and "username" not in options:
            options["username"] = url.username
        if url.password and "password" not in options:
            options["password"] = url.password
        if url.scheme == "rediss":
            options["ssl"] = True
        return connect_sentinel(settings.redis_sentinels, settings.redis_sentinel_master,
                                db=db, timeout_s=timeout_s, **options)
    return connect(settings.redis_url, timeout_s=timeout_s, **options)


T = TypeVar("T")


async def call_redis(settings: Settings, prog: str, err: TextIO,
                     body: Callable[[aioredis.Redis], Awaitable[T]]) -> T | None:
    """Run ``body`` on a client for ``settings`` (:func:`connect_for`); None (after a
    message naming ``TAILGUARD_REDIS_URL`` on ``err``) when Redis cannot be reached, and
    None after a message saying what Redis answered when it refused a command (a key of the
    wrong type, a :class:`~tailguard.routing.errors.RoutingError`): that is no unreachable Redis.

    A refused login, ACL or certificate raises :class:`tailguard.security.AccessRefused`
    (a ``SettingError`` naming the setting) from :func:`check_redis`.
    """
    await check_redis(settings)
    client = connect_for(settings)
    try:
        return await body(client)
    except RoutingError as e:
        print(f"tailguard {prog}: {e}", file=err)
        return None
    except ResponseError as e:
        print(f"tailguard {prog}: Redis at {redact_url(settings.redis_url)} refused a command: "
              f"{e}", file=err)
        return None
    except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as e:
        print(f"tailguard {prog}: cannot reach Redis at {redact_url(settings.redis_url)} "
              f"({type(e).__name__}: {e}). Start it (scripts/redis) or point TAILGUARD_REDIS_URL "
              "at the Redis that tailguard writes to.", file=err)
        return None
    except RedisError as e:
        print(f"tailguard {prog}: Redis at {redact_url(settings.redis_url)} failed: "
              f"{type(e).__name__}: {e}", file=err)
        return None
    finally:
        await client.aclose()


async def check_redis(s: Settings, *, timeout_s: float = 5.0) -> None:
    """PING Redis once with the credentials and TLS settings (see module docstring)."""
    where = f"Redis at {redact_url(s.redis_url)}"
    user = s.redis_username or urlparse(s.redis_url).username or "default"
    client = connect_for(s, timeout_s=timeout_s)
    try:
        await asyncio.wait_for(client.ping(), 2 * timeout_s + 1)
    except AuthenticationError as e:
        raise AccessRefused("TAILGUARD_REDIS_PASSWORD", (
            f"{where} refused the login of user {user!r} ({str(e).rstrip('.')}): check "
            "TAILGUARD_REDIS_USERNAME and TAILGUARD_REDIS_PASSWORD (or its _FILE, or the "
            "URL's user:password)")) from None
    except NoPermissionError:
        raise AccessRefused("TAILGUARD_REDIS_USERNAME", (
            f"the ACL of Redis user {user!r} at {where} does not allow PING: give it the ACL "
            "of docs/production.md")) from None
    except ResponseError as e:
        if "NOAUTH" in str(e) or "AUTH" in str(e).split(" ", 1)[0]:
            raise AccessRefused("TAILGUARD_REDIS_PASSWORD", (
                f"{where} wants a password ({str(e).split(' ', 1)[0]}): set "
                "TAILGUARD_REDIS_PASSWORD (or its _FILE) or put user:password in the URL")) from None
        fix = ("use a /db below the server's `databases` (16 by default)" if "DB index" in str(e)
               else "check that it is the Redis tailguard writes to")
        raise AccessRefused("TAILGUARD_REDIS_URL",
                            f"{where} refused the connection ({str(e).rstrip('.')}): {fix}") from None
    except RedisClusterException as e:   # not a RedisError
        if "not enabled" not in str(e):
            raise
        acl = user != "default"   # an ACL user without CLUSTER SLOTS gets the same answer
        fix = (f"give Redis user {user!r} +cluster|slots +command on every node (docs/production.md)"
               " or, for a single Redis, set TAILGUARD_REDIS_CLUSTER=false" if acl else
               "for a single Redis set TAILGUARD_REDIS_CLUSTER=false; for a cluster point "
               "TAILGUARD_REDIS_URL at one of its nodes")
        raise AccessRefused("TAILGUARD_REDIS_USERNAME" if acl else "TAILGUARD_REDIS_CLUSTER",
                            f"{where} gives no cluster slot map ({e}): {fix}") from None
    except (RedisError, OSError, TimeoutError) as e:
        problem = _cert_problem(e, "TAILGUARD_REDIS_SSL", s.redis_ssl_cafile, where)
        if problem is None and "certificate verify failed" in str(e).lower():
            problem = AccessRefused("TAILGUARD_REDIS_SSL_CAFILE", (
                f"the certificate of {where} is not trusted by "
                f"{s.redis_ssl_cafile or 'the system CAs'} ({e}): point TAILGUARD_REDIS_SSL_CAFILE "
                "at the CA that signed it"))
        if problem is not None:
            raise problem from None
    finally:
        await client.aclose()
