"""The two key layouts: plain (today's documented names) and hash-tagged (Redis Cluster).

Slots are computed with redis-py's own ``key_slot`` (CRC16 of the hash tag, as Redis
Cluster does); tests/integration/test_redis_cluster.py asks a real cluster (CLUSTER KEYSLOT).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from tailguard.core.contract.config import SettingError
from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing.apply_script import NO_EXTRAS, forget_call, script_call
from tailguard.routing.client import keys_for
from tailguard.routing.keys import Keys, as_keys, decode_model
from tailguard.routing.writer import RoutingWriter
from tailguard.settings import Settings, load

models = st.text(min_size=1, max_size=40)


def slot(key: str) -> int:
    return int(key_slot(key.encode("utf-8")))


def test_the_plain_layout_keeps_the_documented_names() -> None:
    k = Keys("tg")
    assert k.layout == "plain"
    assert k.model_keys("m:1") == (
        "tg:routing:m%3A1", "tg:routing:m%3A1:version", "tg:quarantine:m%3A1", "tg:nodes:m%3A1",
        "tg:routing-shadow:m%3A1", "tg:history:m%3A1", "tg:events:m%3A1", "tg:held-out:m%3A1",
        "tg:weights:m%3A1")
    assert (k.models, k.overrides, k.mode, k.channel) == (
        "tg:models", "tg:overrides", "tg:mode", "tg:routing:changes")


def test_the_tagged_layout_names() -> None:
    k = Keys("tg", tagged=True)
    assert k.layout == "tagged"
    assert k.model_keys("m:1") == (
        "tg:{m%3A1}:routing", "tg:{m%3A1}:routing:version", "tg:{m%3A1}:quarantine",
        "tg:{m%3A1}:nodes", "tg:{m%3A1}:routing-shadow", "tg:{m%3A1}:history",
        "tg:{m%3A1}:events", "tg:{m%3A1}:held-out", "tg:{m%3A1}:weights")
    # the global keys keep their names in both layouts
    assert (k.models, k.overrides, k.mode, k.channel) == (
        "tg:models", "tg:overrides", "tg:mode", "tg:routing:changes")
    # braces in a name are encoded: the tag is the whole name, never a piece of it
    assert k.routing("a{b}c") == "tg:{a%7Bb%7Dc}:routing"
    assert Keys("tg").routing("a{b}c") == "tg:routing:a{b}c"     # plain names unchanged


@given(models)
def test_every_tagged_key_of_a_model_is_in_one_slot(model: str) -> None:
    k = Keys("tailguard", tagged=True)
    assert len({slot(key) for key in k.model_keys(model)}) == 1
    tag = k.routing(model).split("{", 1)[1].split("}", 1)[0]
    assert decode_model(tag) == model


def test_the_plain_layout_spreads_a_model_over_slots() -> None:
    # why the tagged layout exists: the plain keys of one model hash to different slots
    assert len({slot(key) for key in Keys("tailguard").model_keys("llama")}) > 1


@given(models, models)
def test_tagged_keys_of_two_models_never_collide(a: str, b: str) -> None:
    k = Keys("tailguard", tagged=True)
    if a != b:
        assert not set(k.model_keys(a)) & set(k.model_keys(b))
    assert not set(k.model_keys(a)) & {k.models, k.overrides, k.mode, k.channel}


def test_as_keys_takes_a_prefix_as_the_plain_layout() -> None:
    tagged = Keys("x", tagged=True)
    assert as_keys(tagged) is tagged
    assert as_keys("x") == Keys("x")


def tick(model: str, routing: set[str]) -> ModelTick:
    statuses = tuple(NodeStatus(node_id=n, model=model, state=HealthState.HEALTHY, routed=True,
                                since_ts=0.0, reason="normal", samples=100)
                     for n in sorted(routing))
    return ModelTick(model=model, ts=0.0, transitions=(), routing=frozenset(routing),
                     quarantine={}, statuses=statuses)


def test_the_apply_script_gets_one_slot_of_keys_in_the_tagged_layout() -> None:
    tagged, _ = script_call(Keys("tg", tagged=True), tick("m", {"a"}), NO_EXTRAS, 1.0)
    assert len(tagged) == 8 and "tg:models" not in tagged
    assert len({slot(key) for key in tagged}) == 1
    plain, _ = script_call(Keys("tg"), tick("m", {"a"}), NO_EXTRAS, 1.0)
    assert len(plain) == 9 and plain[4] == "tg:models"        # the plain layout: the models SET too
    keys, args = forget_call(Keys("tg"), "m")
    assert keys[0] == "tg:models" and args == ["m"]


class FakeClusterRedis:
    """Records the commands a tagged writer sends (the script answers "written, version 7")."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []

    def register_script(self, text: str) -> Any:
        async def run(keys: list[str], args: list[Any]) -> list[int]:
            self.log.append(("script", tuple(keys)))
            return [1, 0, 7, 0]
        return run

    async def sadd(self, key: str, *members: str) -> int:
        self.log.append(("sadd", key, *members))
        return 1

    async def srem(self, key: str, *members: str) -> int:
        self.log.append(("srem", key, *members))
        return 1

    async def delete(self, *keys: str) -> int:
        self.log.append(("delete", *keys))
        return len(keys)


async def test_a_tagged_writer_lists_the_model_first_and_forgets_it_first() -> None:
    fake = FakeClusterRedis()
    keys = Keys("tg", tagged=True)
    w = RoutingWriter(cast(Any, fake), keys, clock=lambda: 5.0)
    assert await w.apply(tick("m", {"a", "b"}))
    assert fake.log[0] == ("sadd", "tg:models", "m")
    assert fake.log[1][0] == "script" and "tg:models" not in fake.log[1][1]
    fake.log.clear()
    gone = ModelTick(model="m", ts=0.0, transitions=(), routing=frozenset(), quarantine={},
                     statuses=(), forgotten=True)
    assert await w.apply(gone)
    assert fake.log == [("srem", "tg:models", "m"), ("delete", *keys.model_keys("m"))]


@pytest.mark.parametrize(("env", "tagged"), [
    ({}, False),
    ({"TAILGUARD_KEY_LAYOUT": "tagged"}, True),               # a single Redis, ahead of a move
    ({"TAILGUARD_REDIS_CLUSTER": "true"}, True),              # auto on a cluster
    ({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_KEY_LAYOUT": "tagged"}, True),
    ({"TAILGUARD_KEY_LAYOUT": "plain"}, False),
])
def test_the_settings_choose_the_layout(env: dict[str, str], tagged: bool) -> None:
    s = load(env)
    assert s.tagged_keys is tagged
    assert keys_for(s) == Keys("tailguard", tagged=tagged)


@pytest.mark.parametrize(("env", "var", "words"), [
    ({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_KEY_LAYOUT": "plain"},
     "TAILGUARD_KEY_LAYOUT", "must share a hash slot"),
    ({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_SENTINELS": "127.0.0.1:26379"},
     "TAILGUARD_REDIS_CLUSTER", "without sentinels"),
    ({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": "redis://127.0.0.1:7000/3"},
     "TAILGUARD_REDIS_URL", "db 0 only"),
    ({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": "unix:///run/redis.sock"},
     "TAILGUARD_REDIS_URL", "db 0 only"),
])
def test_cluster_settings_that_cannot_work_are_refused(env: dict[str, str], var: str,
                                                        words: str) -> None:
    with pytest.raises(SettingError) as e:
        load(env)
    assert e.value.name == var and words in str(e.value)


def test_a_cluster_url_with_db_0_is_accepted() -> None:
    s = load({"TAILGUARD_REDIS_CLUSTER": "true", "TAILGUARD_REDIS_URL": "redis://127.0.0.1:7000/0"})
    assert s.redis_cluster and s.tagged_keys and Settings().key_layout == "auto"
