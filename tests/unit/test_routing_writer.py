"""RoutingWriter's own logic, over a fake script transport: refusal, retry, back-off, latest-wins.

What Redis does with the script (atomicity, idempotence, pub/sub, NOSCRIPT) is
tested against the real server in tests/integration/test_routing_redis.py;
here the fake only answers or fails, so the retry logic runs without sleeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import NO_EXTRAS, Extras
from tailguard.routing.writer import RoutingWriter


class FakeScript:
    """Stands in for redis-py's AsyncScript: records calls, fails while ``down``."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[Any]]] = []
        self.written: list[tuple[str, list[str]]] = []   # (model, routing) of successful runs
        self.down = False
        self.error: BaseException = RedisConnectionError("Connection refused")
        self.poisoned: dict[str, BaseException] = {}   # model -> error its keys answer
        self.version = 0

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> list[int]:
        self.calls.append((list(keys), list(args)))
        await asyncio.sleep(0)
        if self.down:
            raise self.error
        if str(args[1]) in self.poisoned:
            raise self.poisoned[str(args[1])]
        n = int(args[2])
        model = str(args[1])
        if n == 0 and any(m == model and r for m, r in self.written):
            return [0, -1, self.version, 0]       # as the script: never empty an existing set
        self.version += 1
        self.written.append((model, [str(a) for a in args[11:11 + n]]))
        return [1, 0, self.version, 0]


class FakeRedis:
    def __init__(self) -> None:
        self.script = FakeScript()

    def register_script(self, text: str) -> FakeScript:
        assert "PUBLISH" in text
        return self.script


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.t += s
        await asyncio.sleep(0)


class Recorder:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.rejected: list[str] = []
        self.refused: list[str] = []
        self.ok: list[tuple[str, bool, int]] = []

    def write_failed(self, model: str, error: BaseException) -> None:
        self.failed.append(model)

    def model_rejected(self, model: str, error: BaseException) -> None:
        self.rejected.append(model)

    def empty_refused(self, model: str) -> None:
        self.refused.append(model)

    def written(self, model: str, *, changed: bool, version: int) -> None:
        self.ok.append((model, changed, version))


def tick(model: str, routing: set[str], quarantine: dict[str, float] | None = None,
         ts: float = 0.0) -> ModelTick:
    statuses = tuple(
        NodeStatus(node_id=n, model=model, state=HealthState.HEALTHY, routed=True, since_ts=ts,
                   reason="normal", samples=100)
        for n in sorted(routing)
    )
    return ModelTick(model=model, ts=ts, transitions=(), routing=frozenset(routing),
                     quarantine=dict(quarantine or {}), statuses=statuses)


def make(**kw: Any) -> tuple[RoutingWriter, FakeScript, FakeClock, Recorder]:
    fake, clock, rec = FakeRedis(), FakeClock(), Recorder()
    w = RoutingWriter(cast(Any, fake), "tg", clock=lambda: 5.0, monotonic=clock,
                      sleep=clock.sleep, metrics=rec, **kw)
    return w, fake.script, clock, rec


async def test_apply_sends_one_script_call_with_keys_and_sorted_args() -> None:
    w, script, _, rec = make()
    assert await w.apply(tick("m:1", {"b", "a"}, {"c": 1.5}))
    assert len(script.calls) == 1
    keys, args = script.calls[0]
    assert keys == ["tg:routing:m%3A1", "tg:routing:m%3A1:version", "tg:quarantine:m%3A1",
                    "tg:nodes:m%3A1", "tg:models", "tg:routing-shadow:m%3A1",
                    "tg:events:m%3A1", "tg:held-out:m%3A1", "tg:weights:m%3A1"]
    # Without extras the shadow set is left alone (-1), no event is pushed; the held-out set
    # is derived from the statuses (nobody here), no node has a weight; the version floor is
    # 0 before the writer wrote the model. (The history is never this script's: write_history.)
    assert args[:11] == ["tg:routing:changes", "m:1", 2, 1, 2, -1, 0, 50, 0, 0, 0]
    assert args[11:15] == ["a", "b", "1.5", "c"]
    assert args[15] == "a" and json.loads(args[16])["updated"] == 5.0
    assert args[17] == "b" and len(args) == 19
    assert w.pending == frozenset() and rec.ok == [("m:1", True, 1)]
    assert w.last_results["m:1"].version == 1
    # The next call carries the version just written as its floor (after a Redis failover that
    # lost writes, the script moves the version past it).
    assert await w.apply(tick("m:1", {"a"}, {}))
    assert script.calls[1][1][10] == 1


async def test_empty_routing_is_refused_and_counted() -> None:
    w, script, _, rec = make()
    assert await w.apply(tick("m", {"a"}))
    assert not await w.apply(tick("m", set()))
    assert len(script.calls) == 1 and rec.refused == ["m"] and w.pending == frozenset()


async def test_empty_routing_refused_by_the_script_is_counted_and_not_retried() -> None:
    # another writer (a restarted worker) wrote the set: the script refuses, the writer counts it
    w, script, _, rec = make()
    script.written.append(("m", ["a"]))
    assert not await w.apply(tick("m", set()))
    assert len(script.calls) == 1 and rec.refused == ["m"] and w.pending == frozenset()
    assert w.last_results["m"].refused_empty


async def test_a_model_with_no_admitted_node_is_written_without_a_routing_set() -> None:
    w, script, _, rec = make()
    new = NodeStatus(node_id="new", model="m", state=HealthState.WARMING, routed=False, since_ts=0.0,
                     reason="first_seen")
    gone = NodeStatus(node_id="old", model="m", state=HealthState.GONE, routed=False, since_ts=0.0,
                      reason="silent")
    assert await w.apply(ModelTick(model="m", ts=0.0, transitions=(), routing=frozenset(), quarantine={},
                                   statuses=(new, gone)))
    (_keys, args), = script.calls
    assert args[2] == 0 and args[4] == 2 and rec.refused == []
    assert args[8] == 1 and args[-1] == "old"      # held out: the gone node, not the new one
    assert script.written == [("m", [])]


async def test_empty_routing_never_replaces_a_pending_verdict() -> None:
    w, script, clock, _ = make()
    script.down = True
    assert not await w.apply(tick("m", {"a", "b"}))
    assert not await w.apply(tick("m", set()))
    script.down = False
    clock.t += 60
    assert await w.flush()
    assert script.written == [("m", ["a", "b"])]


async def test_redis_down_returns_false_keeps_latest_and_backs_off() -> None:
    w, script, clock, rec = make(retry_initial_s=1.0, retry_max_s=4.0)
    script.down = True
    assert not await w.apply(tick("m", {"a"}))
    assert rec.failed == ["m"] and w.pending == {"m"} and w.failing
    # In back-off: apply does not touch Redis, the newer verdict replaces the older one.
    assert not await w.apply(tick("m", {"a", "b"}))
    assert not await w.apply(tick("other", {"x"}))
    assert len(script.calls) == 1 and w.pending == {"m", "other"}
    script.down = False
    clock.t += 1.0
    assert await w.apply(tick("third", {"z"}))
    assert sorted(script.written) == [("m", ["a", "b"]), ("other", ["x"]), ("third", ["z"])]
    assert not w.failing and w.pending == frozenset()


async def test_a_connection_warning_names_where_redis_is(caplog: pytest.LogCaptureFixture) -> None:
    w, script, _, _ = make(where="redis://u:***@h:6379/0 (TAILGUARD_REDIS_URL)")
    script.down = True
    assert not await w.apply(tick("m", {"a"}))
    (record,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert record.getMessage().startswith(
        "Redis write at redis://u:***@h:6379/0 (TAILGUARD_REDIS_URL) of model 'm' failed (ConnectionError")


async def test_backoff_doubles_up_to_the_cap() -> None:
    w, script, clock, _ = make(retry_initial_s=0.5, retry_max_s=3.0)
    script.down = True
    await w.apply(tick("m", {"a"}))
    delays = []
    for _ in range(5):
        delays.append(w._retry_at - clock.t)
        assert not await w.flush()
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("error", [TimeoutError("slow"), OSError("unreachable"),
                                   RedisTimeoutError("Timeout reading from socket"),
                                   ResponseError("WRONGTYPE Operation against a key")])
async def test_every_redis_failure_is_kept_pending_not_raised(error: BaseException) -> None:
    w, script, _, rec = make()
    script.down, script.error = True, error
    assert not await w.apply(tick("m", {"a"}))
    assert w.pending == {"m"} and rec.failed == ["m"]


WRONGTYPE = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")


@pytest.mark.parametrize("error", [WRONGTYPE, NoPermissionError("NOPERM no permissions"),
                                   ReadOnlyError("READONLY You can't write against a replica")])
async def test_a_model_error_backs_off_that_model_and_writes_the_others(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    w, script, clock, rec = make(retry_initial_s=1.0, retry_max_s=4.0)
    script.poisoned["bad"] = error
    for m in ("a", "bad", "c"):
        w._pending[m] = (tick(m, {"n1"}), NO_EXTRAS)
    assert not await w.flush()
    assert sorted(m for m, _ in script.written) == ["a", "c"]
    assert w.pending == {"bad"} and w.rejected == {"bad"} and not w.failing
    assert rec.rejected == ["bad"] and rec.failed == ["bad"]
    assert [r.levelname for r in caplog.records if "'bad'" in r.message] == ["ERROR"]
    assert "tg:routing:bad" in caplog.text and "other models are still written" in caplog.text
    # The poisoned model is in its own back-off; other models are written at once.
    calls = len(script.calls)
    assert await w.apply(tick("d", {"n1"}))
    assert len(script.calls) == calls + 1 and w.pending == {"bad"}
    assert not await w.apply(tick("bad", {"n2"}))         # newer verdict kept, no attempt yet
    assert len(script.calls) == calls + 1
    clock.t += 1.0
    assert await w.apply(tick("e", {"n1"}))               # "bad" is due: tried, refused again
    assert rec.rejected == ["bad", "bad"] and w._model_backoff["bad"][1] == clock.t + 2.0
    # Someone repairs the key: the latest verdict is written, the back-off forgotten.
    del script.poisoned["bad"]
    clock.t += 2.0
    assert await w.flush()
    assert script.written[-1] == ("bad", ["n2"]) and w.rejected == frozenset()


async def test_a_connection_error_ends_the_round() -> None:
    w, script, _, rec = make()
    script.down = True
    for m in ("a", "b", "c"):
        w._pending[m] = (tick(m, {"n1"}), NO_EXTRAS)
    assert not await w.flush()
    assert len(script.calls) == 1 and rec.failed == ["a"] and rec.rejected == []
    assert w.failing and w.rejected == frozenset() and w.pending == {"a", "b", "c"}


async def test_background_task_retries_a_rejected_model_on_its_own_schedule() -> None:
    w, script, clock, rec = make(retry_initial_s=1.0, retry_max_s=2.0)
    script.poisoned["bad"] = WRONGTYPE
    async with w:
        assert not await w.apply(tick("bad", {"n1"}))
        assert await w.apply(tick("good", {"n1"}))
        for _ in range(50):
            await asyncio.sleep(0)
        tries = [keys for keys, _ in script.calls if keys[0] == "tg:routing:bad"]
        assert len(tries) > 3 and not w.failing            # retried, capped back-off, no spin
        assert clock.t - 1000.0 >= 2.0 * (len(tries) - 2)
        del script.poisoned["bad"]
        for _ in range(50):
            if not w.pending:
                break
            await asyncio.sleep(0)
        assert w.pending == frozenset()
    bad_calls = [keys for keys, _ in script.calls if keys[0] == "tg:routing:bad"]
    assert script.written[-1] == ("bad", ["n1"]) and len(rec.rejected) == len(bad_calls) - 1


async def test_background_task_catches_up_when_redis_returns() -> None:
    w, script, clock, _ = make(retry_initial_s=1.0)
    async with w:
        script.down = True
        assert not await w.apply(tick("m", {"a"}))
        assert not await w.apply(tick("m", {"b"}))
        for _ in range(20):          # the fake sleep advances the clock; Redis stays down
            await asyncio.sleep(0)
        assert w.pending == {"m"} and len(script.calls) > 2
        script.down = False
        for _ in range(200):
            if not w.pending:
                break
            await asyncio.sleep(0)
        assert w.pending == frozenset()
    assert script.written == [("m", ["b"])]
    assert clock.t > 1000.0


async def test_close_makes_one_last_attempt() -> None:
    w, script, _, _ = make()
    script.down = True
    await w.apply(tick("m", {"a"}))
    script.down = False
    await w.aclose()              # in back-off, but closing tries anyway
    assert script.written == [("m", ["a"])]


@pytest.mark.parametrize(
    "bad",
    [
        ModelTick("", 0.0, (), frozenset({"a"}), {}, ()),
        ModelTick("m", 0.0, (), frozenset({""}), {}, ()),
        ModelTick("m", 0.0, (), frozenset({"a"}), {"q": float("nan")}, ()),
        ModelTick("m", 0.0, (), frozenset({"a"}), {}, (NodeStatus(
            "a", "other-model", HealthState.HEALTHY, True, 0.0, "normal"),)),
    ],
)
async def test_malformed_ticks_raise_value_error(bad: ModelTick) -> None:
    w, script, _, _ = make()
    with pytest.raises(ValueError):
        await w.apply(bad)
    assert script.calls == []


def test_bad_constructor_arguments_name_the_culprit() -> None:
    with pytest.raises(ValueError, match="retry_initial_s"):
        RoutingWriter(cast(Any, FakeRedis()), retry_initial_s=5.0, retry_max_s=1.0)
    with pytest.raises(ValueError, match="write_timeout_s"):
        RoutingWriter(cast(Any, FakeRedis()), write_timeout_s=0)


step = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from(["m1", "m2"]),
              st.frozensets(st.sampled_from("abcd"), max_size=4)),
    st.tuples(st.just("down"), st.booleans(), st.just(frozenset())),
    st.tuples(st.just("flush"), st.just(""), st.just(frozenset())),
    st.tuples(st.just("wait"), st.just(""), st.just(frozenset())),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step, max_size=30))
def test_latest_non_empty_verdict_always_wins(steps: list[tuple[str, Any, frozenset[str]]]) -> None:
    async def run() -> None:
        w, script, clock, _ = make()
        latest: dict[str, list[str]] = {}
        for kind, arg, nodes in steps:
            if kind == "tick":
                await w.apply(tick(arg, set(nodes)))
                if nodes:
                    latest[arg] = sorted(nodes)
            elif kind == "down":
                script.down = arg
            elif kind == "flush":
                await w.flush()
            else:
                clock.t += 100
        script.down = False
        assert await w.flush()
        # Empty only for a model with no set yet (nobody admitted): never over a written one.
        has_set: set[str] = set()
        for m, routing in script.written:
            assert routing or m not in has_set, "an empty set replaced a written one"
            if routing:
                has_set.add(m)
        last = {m: r for m, r in script.written if r}
        assert last == latest

    asyncio.run(run())


async def test_events_of_a_superseded_verdict_are_written_with_the_next_one() -> None:
    w, script, clock, _ = make()
    script.down = True
    assert not await w.apply(tick("m", {"a"}), Extras(events=("e1",)))
    assert not await w.apply(tick("m", {"a", "b"}), Extras(events=("e2",)))
    script.down = False
    clock.t += 60
    assert await w.flush()
    _keys, args = script.calls[-1]
    assert args[5:8] == [-1, 2, 50]               # no shadow, two events
    assert args[-2:] == ["e1", "e2"]              # both ticks' events
