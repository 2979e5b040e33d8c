"""Loading the allowlist (node ids, model names) for the worker's ingest edge
(docs/operating.md#allowlist).

Owns the I/O half of the allowlist: reading ``TAILGUARD_ALLOWLIST_FILE`` (one node id a
line, ``#`` comments) and the Redis SET ``TAILGUARD_ALLOWLIST_REDIS_KEY`` into an
:class:`~tailguard.core.contract.ids.Allowlist` (with ``TAILGUARD_ALLOWLIST_PATTERN``, and the
model names of ``TAILGUARD_ALLOWLIST_MODELS``/``TAILGUARD_ALLOWLIST_MODEL_PATTERN``); the check
itself is pure and runs in the decoder (``Accumulator(allow=…)``), so every event of a
node id not on the list is dead-lettered with reason ``not_allowlisted``.

Guarantees:

* :func:`load` raises :class:`AllowlistError` naming the setting whose source cannot
  be read (missing file, not UTF-8, Redis refused or unreachable); it never returns a
  partial list.
* ``tailguard worker`` loads the list once before it starts (an unreadable source
  stops the start with that message); ingestion consumes nothing before its first
  load succeeds, and re-reads every ``TAILGUARD_ALLOWLIST_REFRESH_S``. A failed re-read
  keeps the last list and logs a warning: a Redis hiccup neither opens the gate nor
  dead-letters the fleet.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tailguard.core.contract.ids import Allowlist
from tailguard.settings import Settings
from tailguard.streaming.errors import AllowlistError


def _read_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AllowlistError(f"TAILGUARD_ALLOWLIST_FILE={path!r}: cannot read the allowlist"
                             f" ({type(e).__name__}: {e}); give a readable UTF-8 file of node"
                             " ids, one a line") from None


async def load(settings: Settings, redis: Any | None) -> Allowlist:
    """The allowlist the settings describe (module docstring); ``redis`` is needed only with
    ``allowlist_redis_key``."""
    lines: list[str] = []
    if settings.allowlist_file:
        lines += await asyncio.to_thread(_read_file, settings.allowlist_file)
    if settings.allowlist_redis_key:
        if redis is None:
            raise AllowlistError("TAILGUARD_ALLOWLIST_REDIS_KEY is set but there is no Redis"
                                 " client (TAILGUARD_REDIS_URL)")
        key = settings.allowlist_redis_key
        try:
            members = await redis.smembers(key)
        except Exception as e:
            raise AllowlistError(f"TAILGUARD_ALLOWLIST_REDIS_KEY={key!r}: cannot read the set"
                                 f" ({type(e).__name__}: {e}); it must be a Redis SET of node"
                                 " ids on TAILGUARD_REDIS_URL") from None
        lines += [m.decode("utf-8", "replace") if isinstance(m, bytes) else str(m)
                  for m in members]
    return Allowlist.parse_lines(lines, settings.allowlist_pattern,
                                 models=settings.allowlist_models.split(","),
                                 model_pattern=settings.allowlist_model_pattern,
                                 nodes_on=settings.allowlist_nodes_on)


async def check(settings: Settings) -> Allowlist | None:
    """Load once with a client of its own (``tailguard worker``'s start check); None when off."""
    if not settings.allowlist_on:
        return None
    redis = None
    if settings.allowlist_redis_key:
        from tailguard.routing.client import connect_for

        redis = connect_for(settings)
    try:
        return await load(settings, redis)
    finally:
        if redis is not None:
            await redis.aclose()
