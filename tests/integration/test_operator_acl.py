"""The documented minimal Redis ACL (tailguard.routing.acl) covers the operator features, on the real Redis.

Each test makes its own ACL users (exactly ``acl_rules(prefix, role)``, less the commands
``without``) for its own key prefix on the plain local Redis and deletes them afterwards.
Shown: the writer's extras (shadow set, events) and the history are written by a worker user; the
operator commands (``tailguard drain``/``mode``/``release``, through their CLI, so with the
``TAILGUARD_REDIS_USERNAME``/``_PASSWORD`` settings) work as that user; ``tailguard explain`` and
the status page's data work as a reader user; and a worker user that lacks a command the
script needs for the extras (``LPUSH``) is refused with NOPERM before anything is written. A
worker user writes and forgets a model in both key layouts (plain and hash-tagged: ``SREM``).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from acl_users import MakeUser, acl_users
from redis.exceptions import NoPermissionError

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing import explain, operators_cli
from tailguard.routing.apply_script import Extras
from tailguard.routing.keys import Keys
from tailguard.routing.operators import read_operator_state
from tailguard.routing.writer import RoutingWriter
from tailguard.streaming.page import page_data

pytestmark = pytest.mark.integration


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
async def acl_user(admin: aioredis.Redis, unique_name: Callable[[str], str]
                   ) -> AsyncIterator[MakeUser]:
    """``await acl_user(prefix, role, without=())`` → (user, password) on the plain Redis."""
    async with acl_users(admin, unique_name) as make:
        yield make


def as_user(redis_url: str, user: str, password: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(redis_url, username=user, password=password)


def a_tick(model: str) -> ModelTick:
    st = NodeStatus(node_id="a", model=model, state=HealthState.HEALTHY, routed=True,
                    since_ts=0.0, reason="normal")
    return ModelTick(model=model, ts=1.0, transitions=(), routing=frozenset({"a", "b"}),
                     quarantine={}, statuses=(st,))


EXTRAS = Extras(shadow=frozenset({"a"}), annotations={"a": {"mode": "observe"}},
                events=(json.dumps({"kind": "load_event", "model": "m", "ts": 1.0}),))
HISTORY = {"a": json.dumps([{"ts": 1.0, "state": "healthy"}])}


async def test_worker_and_reader_acl_cover_extras_operators_explain_and_page(
        admin: aioredis.Redis, acl_user: MakeUser, redis_url: str, tmp_path: Path,
        unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = unique_name("acl-ops")
    keys = Keys(prefix)
    worker_user, worker_pw = await acl_user(prefix, "worker")
    worker = as_user(redis_url, worker_user, worker_pw)
    try:
        w = RoutingWriter(worker, prefix, retry_initial_s=0.05, retry_max_s=0.1)
        assert await w.apply(a_tick("m"), EXTRAS), w.rejected
        assert await w.write_history("m", HISTORY)      # after the routing write, as the worker
    finally:
        await worker.aclose()
    assert await admin.smembers(keys.shadow("m")) == {b"a"}
    assert await admin.llen(keys.events("m")) == 1
    assert await admin.hgetall(keys.history("m")) == {b"a": HISTORY["a"].encode()}

    # The operator commands, with the credentials from the settings (call_redis → connect_for).
    pw_file = tmp_path / "worker.password"
    pw_file.write_text(worker_pw + "\n")
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_url)
    monkeypatch.setenv("TAILGUARD_KEY_PREFIX", prefix)
    monkeypatch.setenv("TAILGUARD_REDIS_USERNAME", worker_user)
    monkeypatch.setenv("TAILGUARD_REDIS_PASSWORD_FILE", str(pw_file))
    out, err = io.StringIO(), io.StringIO()
    # (The commands run asyncio.run themselves: in a thread, off this test's loop.)
    drain = ["a", "--model", "m", "--reason", "disk"]
    assert await asyncio.to_thread(operators_cli.drain_main, drain, out=out, err=err) == 0, err.getvalue()
    assert "warning" not in err.getvalue()
    # A node or model the worker never wrote (a typo) is stored, with a warning naming the
    # nearest known names (the role may read them).
    for typo, words in ((["a1", "--model", "m"], "no node 'a1' on model 'm'"),
                        (["a", "--model", "mm"], "no model 'mm' under key prefix")):
        err = io.StringIO()
        assert await asyncio.to_thread(operators_cli.drain_main, typo, out=out, err=err) == 0
        assert words in err.getvalue() and "did you mean" in err.getvalue(), err.getvalue()
        assert await asyncio.to_thread(operators_cli.release_main, [typo[0], "--model", typo[2]],
                                       out=out, err=err) == 0
    mode = ["observe", "--model", "m"]
    assert await asyncio.to_thread(operators_cli.mode_main, mode, out=out, err=err) == 0, err.getvalue()
    state = await read_operator_state(admin, keys)
    assert [(o.node_id, o.action) for o in state.overrides] == [("a", "drain")]
    assert state.mode_of("m", "enforce") == "observe"
    release = ["a", "--model", "m"]
    assert await asyncio.to_thread(operators_cli.release_main, release, out=out, err=err) == 0, \
        err.getvalue()
    assert (await read_operator_state(admin, keys)).overrides == ()

    # explain and the status page's data as a read-only user.
    reader_user, reader_pw = await acl_user(prefix, "reader")
    reader_file = tmp_path / "reader.password"
    reader_file.write_text(reader_pw + "\n")
    monkeypatch.setenv("TAILGUARD_REDIS_USERNAME", reader_user)
    monkeypatch.setenv("TAILGUARD_REDIS_PASSWORD_FILE", str(reader_file))
    out, err = io.StringIO(), io.StringIO()
    assert await asyncio.to_thread(explain.main, ["a", "--json"], out=out, err=err) == 0, err.getvalue()
    assert [n["model"] for n in json.loads(out.getvalue())["nodes"]] == ["m"]
    reader = as_user(redis_url, reader_user, reader_pw)
    try:
        data = await page_data(reader, prefix, 2.0, "enforce")
        [model] = data["models"]
        assert (model["model"], model["mode"], model["shadow"]) == ("m", "observe", ["a"])
        assert model["events"][0]["kind"] == "load_event"
        with pytest.raises(NoPermissionError):       # and it cannot drain a node
            await reader.hset(keys.overrides, "x", "y")
    finally:
        await reader.aclose()


async def test_a_worker_without_lpush_is_refused_before_anything_is_written(
        admin: aioredis.Redis, acl_user: MakeUser, redis_url: str,
        unique_name: Callable[[str], str], caplog: pytest.LogCaptureFixture) -> None:
    prefix = unique_name("acl-nolpush")
    keys = Keys(prefix)
    user, pw = await acl_user(prefix, "worker", without=("lpush",))
    worker = as_user(redis_url, user, pw)
    try:
        w = RoutingWriter(worker, prefix, retry_initial_s=5.0, retry_max_s=5.0)
        assert not await w.apply(a_tick("m"), EXTRAS)
        assert w.rejected == {"m"} and w.pending == {"m"}
    finally:
        await worker.aclose()
    assert f"this ACL user may not run LPUSH on {keys.events('m')}; nothing was written" in caplog.text
    for k in (keys.routing("m"), keys.version("m"), keys.nodes("m"), keys.shadow("m"),
              keys.history("m"), keys.events("m"), keys.models):
        assert not await admin.exists(k), k


@pytest.mark.parametrize("tagged", [False, True])
async def test_a_worker_user_writes_and_forgets_a_model_in_either_key_layout(
        redis_url: str, acl_user: MakeUser, admin: aioredis.Redis, unique_name: Callable[[str], str],
        tagged: bool) -> None:
    prefix = unique_name("acl-forget")
    keys = Keys(prefix, tagged=tagged)
    user, password = await acl_user(prefix, "worker")
    r = as_user(redis_url, user, password)
    try:
        w = RoutingWriter(r, keys)
        assert await w.apply(a_tick("m"))
        assert await admin.smembers(keys.routing("m")) == {b"a", b"b"}
        assert await admin.smembers(keys.models) == {b"m"}
        gone = ModelTick(model="m", ts=2.0, transitions=(), routing=frozenset(), quarantine={},
                         statuses=(), forgotten=True)
        assert await w.apply(gone), w.rejected      # SREM is in the worker's ACL
        assert not await admin.exists(keys.models, *keys.model_keys("m"))
    finally:
        await r.aclose()
