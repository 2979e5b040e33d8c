"""The replace hook: run a configured action once per retirement, publish its outcome.

When a (node, model) is retired, the worker that owns the model runs the configured action —
a shell command (``TAILGUARD_REPLACE_COMMAND``; its environment holds ``TAILGUARD_NODE_ID``,
``TAILGUARD_MODEL``, ``TAILGUARD_REASON``, ``TAILGUARD_RETIRED_TS``,
``TAILGUARD_RETIREMENT_ID``, ``TAILGUARD_ATTEMPT``, and of the worker's only ``PATH``, the
``TAILGUARD_REPLACE_*`` settings and what ``TAILGUARD_REPLACE_ENV`` names) or an HTTP POST of
the retirement as JSON (``TAILGUARD_REPLACE_WEBHOOK_URL``, header ``Idempotency-Key``) — with
``replace_attempts`` tries and back-off, then publishes one outcome on ``node-replacements``
(key = node id; :func:`outcome_event`). Why it works this way: docs/diagnostics.md.

Guarantees: level-triggered (every stage-2 tick offers the retired statuses it owns,
:meth:`ReplaceHook.offer`, so a retirement seen just before a crash is still seen after);
once per retirement (model, node, retired time) across restarts and workers, through a claim
in Redis (``<prefix>:replace:<retirement_id>``, SET-if-absent, kept ``LEDGER_TTL_S``) with a
lease over every attempt — twice only when a worker dies mid-action (``runs: 2``, the same
``TAILGUARD_RETIREMENT_ID``); retirements older than ``replace_max_age_s`` with no ledger
entry are logged once, not acted on; failures never stop the stream (logged, retried); what
the action printed is cleaned and redacted (:class:`tailguard.redact.Redactor`) before it is
logged, published or recorded, ``DETAIL_CHARS`` of it kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tailguard.core.contract.types import HealthState, NodeStatus
from tailguard.redact import Redactor
from tailguard.settings import Settings, replace_command_env, secret_values

log = logging.getLogger(__name__)

LEDGER_TTL_S = 30 * 86400          # how long a retirement's claim and outcome are remembered
BACKOFF_INITIAL_S = 5.0            # between attempts: 5 s, 10 s, 20 s, … at most BACKOFF_MAX_S
BACKOFF_MAX_S = 60.0
MAX_CONCURRENT = 4                 # actions running at once
SETTLED_MEMORY = 100_000           # retirement ids known settled, kept in memory (LRU)
PUBLISH_TRIES = 5
OUTPUT_KEPT_BYTES = 64 * 1024      # of an action's output, before redaction
DETAIL_CHARS = 300                 # of the redacted output, in the log, the outcome and Redis


@dataclass(frozen=True, slots=True)
class Retirement:
    node_id: str
    model: str
    reason: str
    retired_ts: float

    @property
    def retirement_id(self) -> str:
        key = f"{self.model}\x1f{self.node_id}\x1f{self.retired_ts!r}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def env(self, attempt: int) -> dict[str, str]:
        return {"TAILGUARD_NODE_ID": self.node_id, "TAILGUARD_MODEL": self.model,
                "TAILGUARD_REASON": self.reason, "TAILGUARD_RETIRED_TS": f"{self.retired_ts:.3f}",
                "TAILGUARD_RETIREMENT_ID": self.retirement_id, "TAILGUARD_ATTEMPT": str(attempt)}

    def to_dict(self) -> dict[str, Any]:
        return {"retirement_id": self.retirement_id, "node_id": self.node_id, "model": self.model,
                "reason": self.reason, "retired_ts": self.retired_ts}


def retirements(statuses: Iterable[NodeStatus]) -> list[Retirement]:
    """The retired pairs among ``statuses``."""
    return [Retirement(s.node_id, s.model, s.reason, s.since_ts) for s in statuses
            if s.state is HealthState.RETIRED]


@dataclass(frozen=True, slots=True)
class Attempt:
    ok: bool
    detail: str


class Action(Protocol):
    kind: str

    async def run(self, r: Retirement, attempt: int) -> Attempt: ...


class CommandAction:
    """``/bin/sh -c COMMAND``; exit code 0 is success. Values reach it only through its environment.

    ``env``: the whole environment it starts from (:func:`tailguard.settings.replace_command_env`;
    default only a standard ``PATH``), plus the retirement's fields: never the worker's own.
    """

    kind = "command"

    def __init__(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> None:
        self.command, self.timeout_s = command, timeout_s
        self.env = {"PATH": os.defpath} if env is None else dict(env)

    async def run(self, r: Retirement, attempt: int) -> Attempt:
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", self.command, env={**self.env, **r.env(attempt)},
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            return Attempt(False, f"cannot start /bin/sh: {e}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 2.0)
            return Attempt(False, f"timed out after {self.timeout_s:g} s (TAILGUARD_REPLACE_TIMEOUT_S)")
        # The end of its output, whole: the hook redacts it before keeping DETAIL_CHARS of it.
        tail = out[-OUTPUT_KEPT_BYTES:].decode(errors="replace").strip()
        return Attempt(proc.returncode == 0, f"exit {proc.returncode}" + (f": {tail}" if tail else ""))


class WebhookAction:
    """POST the retirement as JSON; any 2xx is success."""

    kind = "webhook"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s

    async def run(self, r: Retirement, attempt: int) -> Attempt:
        import aiohttp

        body = {**r.to_dict(), "attempt": attempt}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as s, \
                    s.post(self.url, json=body, headers={"Idempotency-Key": r.retirement_id}) as resp:
                text = (await resp.text(errors="replace")).strip()[:OUTPUT_KEPT_BYTES]
                return Attempt(200 <= resp.status < 300, f"HTTP {resp.status}" + (f": {text}" if text else ""))
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return Attempt(False, f"{type(e).__name__}: {e}")


class Ledger(Protocol):
    async def claim(self, rid: str, record: dict[str, Any], now_s: float) -> int:
        """Runs so far including this one (≥ 1) when claimed; 0 when done; -1 when leased elsewhere."""
        ...

    async def finish(self, rid: str, record: dict[str, Any]) -> None: ...


_CLAIM = """
local v = redis.call('GET', KEYS[1])
local runs = 1
if v then
  local ok, rec = pcall(cjson.decode, v)
  if not ok or rec['state'] ~= 'running' then return 0 end
  if tonumber(rec['lease_until']) >= tonumber(ARGV[2]) then return -1 end
  runs = (tonumber(rec['runs']) or 1) + 1
end
local new = cjson.decode(ARGV[1])
new['runs'] = runs
redis.call('SET', KEYS[1], cjson.encode(new), 'EX', ARGV[3])
return runs
"""


class RedisLedger:
    """Claims and outcomes in Redis: ``<prefix>:replace:<retirement_id>`` (JSON, TTL ``LEDGER_TTL_S``)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis, self.prefix = redis, prefix
        self._claim = redis.register_script(_CLAIM)

    def key(self, rid: str) -> str:
        return f"{self.prefix}:replace:{rid}"

    async def claim(self, rid: str, record: dict[str, Any], now_s: float) -> int:
        return int(await self._claim(keys=[self.key(rid)], args=[json.dumps(record), now_s, LEDGER_TTL_S]))

    async def finish(self, rid: str, record: dict[str, Any]) -> None:
        await self.redis.set(self.key(rid), json.dumps(record), ex=LEDGER_TTL_S)


def outcome_event(r: Retirement, action: str, ok: bool, attempts: int, runs: int, detail: str,
                  now_s: float, duration_s: float) -> dict[str, Any]:
    """The ``node-replacements`` message: ``event_id`` = the retirement id (drop repeats by it)."""
    return {"event_id": r.retirement_id, **r.to_dict(), "ts": now_s, "action": action,
            "outcome": "succeeded" if ok else "failed", "attempts": attempts, "runs": runs,
            "detail": detail, "duration_s": round(duration_s, 3)}


class ReplaceHook:
    """Offers in (each tick), actions out (in the background); see the module docstring."""

    def __init__(self, action: Action, ledger: Ledger,
                 publish: Callable[[dict[str, Any]], Awaitable[None]], *, attempts: int, timeout_s: float,
                 max_age_s: float, owner: str = "", clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 backoff_s: float = BACKOFF_INITIAL_S,
                 redact: Callable[[str], str] | None = None) -> None:
        self.action, self.ledger, self.publish = action, ledger, publish
        self.redact = Redactor() if redact is None else redact
        self.attempts, self.timeout_s, self.max_age_s = attempts, timeout_s, max_age_s
        self.owner = owner or f"pid-{os.getpid()}"
        self.clock, self.sleep, self.backoff_s = clock, sleep, backoff_s
        self._queue: asyncio.Queue[Retirement] = asyncio.Queue()
        self._inflight: set[str] = set()
        self._settled: OrderedDict[str, None] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self.outcomes: list[dict[str, Any]] = []   # this process's outcomes, newest last (bounded)

    def lease_s(self) -> float:
        waits = sum(min(BACKOFF_MAX_S, self.backoff_s * 2.0 ** i) for i in range(self.attempts - 1))
        return self.attempts * self.timeout_s + waits + 60.0

    def offer(self, statuses: Iterable[NodeStatus]) -> int:
        """Queue the retirements among ``statuses`` not yet settled here; how many were queued."""
        now = self.clock()
        n = 0
        for r in retirements(statuses):
            rid = r.retirement_id
            if rid in self._inflight or rid in self._settled:
                continue
            if now - r.retired_ts > self.max_age_s:
                log.info("not replacing %s/%s: retired %.0f s ago, before the hook could act "
                         "(TAILGUARD_REPLACE_MAX_AGE_S=%g)", r.node_id, r.model, now - r.retired_ts,
                         self.max_age_s)
                self._settle(rid)
                continue
            self._inflight.add(rid)
            self._queue.put_nowait(r)
            n += 1
        return n

    def _settle(self, rid: str) -> None:
        self._settled[rid] = None
        self._settled.move_to_end(rid)
        while len(self._settled) > SETTLED_MEMORY:
            self._settled.popitem(last=False)

    async def run(self) -> None:
        """Take offered retirements and handle each in the background, forever."""
        while True:
            r = await self._queue.get()
            task = asyncio.create_task(self._guarded(r))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _guarded(self, r: Retirement) -> None:
        async with self._slots:
            try:
                await self.handle(r)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replace hook for %s/%s failed; retried at the next tick", r.node_id, r.model)
            finally:
                self._inflight.discard(r.retirement_id)

    async def handle(self, r: Retirement) -> dict[str, Any] | None:
        """Claim, act with retries, publish, record. The outcome, or None when not ours to run."""
        rid = r.retirement_id
        now = self.clock()
        runs = await self.ledger.claim(rid, {**r.to_dict(), "state": "running", "owner": self.owner,
                                             "claimed_ts": now, "lease_until": now + self.lease_s()}, now)
        if runs == 0:
            self._settle(rid)
            return None
        if runs < 0:
            return None   # another worker holds the lease; offered again next tick
        log.info("replacing %s/%s (retired: %s; run %d): %s", r.node_id, r.model, r.reason, runs,
                 self.action.kind)
        t0 = time.monotonic()
        res = Attempt(False, "not run")
        tries = 0
        for tries in range(1, self.attempts + 1):
            res = await self.action.run(r, tries)
            # Redacted before anything sees it: the log, node-replacements, the Redis ledger.
            res = Attempt(res.ok, self.redact(res.detail)[-DETAIL_CHARS:])
            if res.ok:
                break
            log.warning("replace action for %s/%s, attempt %d of %d failed: %s", r.node_id, r.model,
                        tries, self.attempts, res.detail)
            if tries < self.attempts:
                await self.sleep(min(BACKOFF_MAX_S, self.backoff_s * 2 ** (tries - 1)))
        ev = outcome_event(r, self.action.kind, res.ok, tries, runs, res.detail, self.clock(),
                           time.monotonic() - t0)
        await self._publish(ev)
        await self.ledger.finish(rid, {**ev, "state": ev["outcome"], "owner": self.owner})
        self._settle(rid)
        self.outcomes = [*self.outcomes[-999:], ev]
        (log.info if res.ok else log.error)("replace action for %s/%s %s after %d attempt(s): %s",
                                            r.node_id, r.model, ev["outcome"], tries, res.detail)
        return ev

    async def _publish(self, ev: dict[str, Any]) -> None:
        for i in range(PUBLISH_TRIES):
            try:
                await self.publish(ev)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("publishing the replace outcome of %s failed (%s: %s)", ev["node_id"],
                            type(e).__name__, e)
                await self.sleep(min(BACKOFF_MAX_S, 1.0 * 2 ** i))
        log.error("replace outcome of %s/%s not published after %d tries: %s", ev["node_id"], ev["model"],
                  PUBLISH_TRIES, ev)

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def action_from(settings: Settings, environ: Mapping[str, str] | None = None) -> Action | None:
    """The configured action of ``settings``, or None (``environ``: the worker's, default
    ``os.environ``, of which the command gets only :func:`~tailguard.settings.replace_command_env`)."""
    if settings.replace_command:
        return CommandAction(settings.replace_command, settings.replace_timeout_s,
                             replace_command_env(settings, environ))
    if settings.replace_webhook_url:
        return WebhookAction(settings.replace_webhook_url.reveal(), settings.replace_timeout_s)
    return None


def build_hook(settings: Settings, publish: Callable[[dict[str, Any]], Awaitable[None]],
               clock: Callable[[], float] = time.time) -> tuple[ReplaceHook | None, Any]:
    """The worker's hook and its own Redis client (both None when no action is configured)."""
    action = action_from(settings)
    if action is None:
        return None, None
    from tailguard.routing.client import connect_for

    client = connect_for(settings)   # credentials and TLS, like every other Redis client
    hook = ReplaceHook(action, RedisLedger(client, settings.key_prefix), publish,
                       attempts=settings.replace_attempts, timeout_s=settings.replace_timeout_s,
                       max_age_s=settings.replace_max_age_s, clock=clock,
                       redact=Redactor(secret_values(settings)),
                       owner=f"{settings.app_id}@{socket.gethostname()}:{os.getpid()}")
    return hook, client
