"""The id rule and the allowlist (tailguard.core.contract.ids), at every decode path of core.contract.events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from tailguard import settings as app_settings
from tailguard.core.contract import binary, events, ids
from tailguard.core.contract.config import DetectorSettings, SettingError
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import SampleBatch, decode
from tailguard.core.contract.ids import Allowlist, IdRule
from tailguard.core.window.accumulate import Accumulator, decode_many

T = 1_764_680_000.0

REALISTIC = [
    "gpu-node-05", "llama-3-70b-instruct-7d9f8b6c5-x2k4p", "ip-10-0-0-5.ec2.internal",
    "10.0.0.5:8000", "[fe80::1]:8000", "meta-llama/Llama-3.1-8B-Instruct", "org:model@rev",
    "Qwen/Qwen2.5-72B-Instruct-AWQ", "node_7~a+b=c", "x" * 128,
]
HOSTILE = {
    "control": "ctl\x01\x07",
    "escape": "ctl\x1b[31mred\x1b[0m",
    "pipe": "a|b",
    "space": "gpu node",
    "tab": "gpu\tnode",
    "newline": "gpu\nnode",
    "10KB": "n" * 10_240,
    "129": "x" * 129,
    "unicode": "nœud-☃",
    "nbsp": "gpu\u00a0node",
    "del": "gpu\x7f",
}


@pytest.mark.parametrize("name", REALISTIC)
def test_the_default_rule_takes_realistic_ids(name: str) -> None:
    assert ids.DEFAULT_RULE.ok(name)


@pytest.mark.parametrize("name", [*HOSTILE.values(), ""], ids=[*HOSTILE, "empty"])
def test_the_default_rule_refuses_hostile_ids(name: str) -> None:
    assert not IdRule().ok(name)


def test_a_custom_pattern_replaces_the_default_and_is_matched_whole() -> None:
    rule = IdRule(r"[a-z0-9-]+")
    assert rule.ok("gpu-node-05") and not rule.ok("Gpu-node") and not rule.ok("gpu-node-05/x")
    assert not IdRule(r".*").ok("x" * (ids.MAX_NAME_CHARS + 1)) and not IdRule(r".*").ok("")
    e = rule.error("node_id", "Gpu\x1b[2J")
    assert e.reason == "bad_node_id" and "TAILGUARD_ID_PATTERN" in str(e)
    assert "\x1b" not in str(e) and "\\x1b" in str(e)     # the message is safe to print


def test_accepted_ids_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    rule = IdRule()
    match = rule._match

    def counting(name: str) -> Any:
        calls.append(name)
        return match(name)

    rule._match = counting
    assert all(rule.ok("gpu-node-05") for _ in range(1000)) and calls == ["gpu-node-05"]
    monkeypatch.setattr(ids, "MAX_KNOWN", 10)
    for i in range(25):
        assert rule.ok(f"n{i}")
    assert len(rule._known) <= 10


def test_a_flood_of_ids_is_not_remembered_beyond_a_few_thousand() -> None:
    # Each remembered id is a string kept alive: a 200,000-id flood left ~26,000 of them spread
    # over CPython's small-object arenas, which stayed with the worker after the flood (issue 28).
    rule = IdRule()
    for i in range(40_000):
        assert rule.ok(f"flood-{i:06d}")
    assert len(rule._known) <= 4096
    assert rule.ok("flood-000001") and not rule.ok("bad id")


def test_a_bad_pattern_is_refused_at_start_naming_the_setting() -> None:
    with pytest.raises(SettingError) as e:
        app_settings.load({"TAILGUARD_ID_PATTERN": "gpu-(["})
    assert e.value.name == "TAILGUARD_ID_PATTERN"
    s = app_settings.load({"TAILGUARD_ID_PATTERN": "[a-z0-9.-]{1,63}"})
    assert s.detector.id_pattern == "[a-z0-9.-]{1,63}"
    assert "TAILGUARD_ID_PATTERN" in app_settings.env_names()


# ---------------------------------------------------------------- every decode path

def _single(node: str = "n", model: str = "m") -> dict[str, Any]:
    return {"node_id": node, "model": model, "latency_us": 5.0, "ts": T}


def _heartbeat(node: str = "n", model: str = "m") -> dict[str, Any]:
    return {"type": "heartbeat", "node_id": node, "model": model, "ts": T}


def _batch(node: str = "n", model: str = "m") -> dict[str, Any]:
    return {"node_id": node, "model": model, "samples": [[T, 5.0], [T + 1, 6.0]]}


def _batch_general(node: str = "n", model: str = "m") -> dict[str, Any]:
    # A sample of mixed shape: the typed decoders refuse it, the general path decides.
    return {"node_id": node, "model": model, "samples": [[T, 5.0], [T, 6.0, None, 3, None]]}


def _via_decode(doc: Callable[..., Any]) -> Callable[[str, str], Any]:
    return lambda node, model: decode(orjson.dumps(doc(node, model)), now_s=T + 10)


def _via_decode_str(doc: Callable[..., Any]) -> Callable[[str, str], Any]:
    return lambda node, model: decode(orjson.dumps(doc(node, model)).decode(), now_s=T + 10)


def _via_acc(doc: Callable[..., Any]) -> Callable[[str, str], Any]:
    def run(node: str, model: str) -> Any:
        acc = Accumulator(now_s=T + 10)
        acc.add(orjson.dumps(_single("good", "m")))       # a series already pending
        acc.add(orjson.dumps(doc(node, model)))
        return acc.drain()
    return run


def _via_binary(node: str, model: str) -> Any:
    return decode(binary.encode(node, model, None, np.array([T]), np.array([5.0])), now_s=T + 10)


PATHS: dict[str, Callable[[str, str], Any]] = {
    "single": _via_decode(_single), "single-text": _via_decode_str(_single),
    "single-accumulator": _via_acc(_single), "heartbeat": _via_decode(_heartbeat),
    "batch": _via_decode(_batch), "batch-accumulator": _via_acc(_batch),
    "batch-general": _via_decode(_batch_general), "binary": _via_binary,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", [*HOSTILE.values(), ""], ids=[*HOSTILE, "empty"])
@pytest.mark.parametrize("field", ["node_id", "model"])
def test_every_decode_path_dead_letters_hostile_ids(path: str, name: str, field: str) -> None:
    node, model = (name, "m") if field == "node_id" else ("n", name)
    with pytest.raises(BadEvent) as e:
        PATHS[path](node, model)
    assert e.value.reason == ("empty_field" if not name else f"bad_{field}")
    assert e.value.field == field
    assert e.value.reason in events.REASONS
    assert all(c.isprintable() for c in str(e.value))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", REALISTIC)
def test_every_decode_path_takes_realistic_ids(path: str, name: str) -> None:
    got = PATHS[path](name, "meta-llama/Llama-3.1-8B-Instruct")
    out = got if isinstance(got, list) else [got]
    assert [e.node_id for e in out if e.node_id != "good"] == [name]


def test_the_fast_path_gives_what_the_general_path_gives_for_hostile_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [orjson.dumps(doc(name, "m")) for name in HOSTILE.values()
             for doc in (_single, _batch, _heartbeat)]
    lines += [orjson.dumps(_single()), orjson.dumps(_batch())]
    fast = decode_many(lines, now_s=T + 10)
    monkeypatch.setattr(events, "FAST_DECODER", None)
    general = decode_many(lines, now_s=T + 10)
    assert [(i, e.reason, str(e)) for i, e in fast[1]] \
        == [(i, e.reason, str(e)) for i, e in general[1]]
    assert len(fast[1]) == 3 * len(HOSTILE)
    assert sorted(len(e) for e in fast[0] if isinstance(e, SampleBatch)) == [1, 2]


def test_good_messages_around_bad_ids_are_kept() -> None:
    lines = [orjson.dumps(_single("a|b")), orjson.dumps(_batch("gpu-1")),
             binary.encode("ctl\x1b", "m", None, np.array([T]), np.array([1.0])),
             orjson.dumps(_single("gpu-2")), orjson.dumps(_heartbeat("gpu-3", "m\x00"))]
    out, bad = decode_many(lines, now_s=T + 10)
    assert [(i, e.reason) for i, e in bad] == [(0, "bad_node_id"), (2, "bad_node_id"),
                                                (4, "bad_model")]
    assert sorted(e.node_id for e in out) == ["gpu-1", "gpu-2"]


def test_a_custom_pattern_applies_at_decode() -> None:
    s = DetectorSettings(id_pattern=r"gpu-[0-9]+|[a-z-]+")
    assert isinstance(decode(orjson.dumps(_single("gpu-7", "llama")), settings=s), SampleBatch)
    with pytest.raises(BadEvent) as e:
        decode(orjson.dumps(_single("gpu-7", "Llama")), settings=s)
    assert e.value.reason == "bad_model" and "TAILGUARD_ID_PATTERN" in str(e.value)
    acc = Accumulator(settings=s)
    with pytest.raises(BadEvent) as e:
        acc.add(orjson.dumps(_single("node 1")))        # outside the custom rule
    assert e.value.reason == "bad_node_id"


# ---------------------------------------------------------------- the allowlist

def test_allowlist_from_lines_and_pattern() -> None:
    a = Allowlist.parse_lines(["gpu-1", "  gpu-2  # rack 4", "", "# comment"], r"spare-\d+")
    assert a.ids == {"gpu-1", "gpu-2"}
    assert a.allows("gpu-1") and a.allows("spare-17") and not a.allows("spare-17x")
    assert not a.allows("gpu-3") and not Allowlist().allows("gpu-1")
    with pytest.raises(ValueError, match="regular expression"):
        Allowlist(pattern="(")


@pytest.mark.parametrize("doc", [_single, _heartbeat, _batch, _batch_general])
def test_the_accumulator_dead_letters_nodes_off_the_allowlist(doc: Callable[..., Any]) -> None:
    acc = Accumulator(now_s=T + 10, allow=Allowlist(frozenset({"gpu-1"})))
    for raw in (orjson.dumps(doc("gpu-1", "m")), orjson.dumps(doc("gpu-1", "m")).decode()):
        acc.add(raw)
    for raw in (orjson.dumps(doc("gpu-9", "m")), orjson.dumps(doc("gpu-9", "m")).decode(),
                binary.encode("gpu-9", "m", None, np.array([T]), np.array([1.0]))):
        with pytest.raises(BadEvent) as e:
            acc.add(raw)
        assert e.value.reason == "not_allowlisted" and "'gpu-9'" in str(e.value)
    with pytest.raises(BadEvent) as e:    # the id rule comes first
        acc.add(orjson.dumps(doc("gpu 9", "m")))
    assert e.value.reason == "bad_node_id"
    out = acc.drain()
    assert {e.node_id for e in out} == {"gpu-1"}
