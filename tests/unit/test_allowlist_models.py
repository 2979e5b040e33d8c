"""The allowlist covers model names too (tailguard.core.contract.ids.Allowlist, the settings, the decoder):
a flood of model names is dead-lettered before it reaches a window."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from tailguard.core.contract import binary
from tailguard.core.contract.config import SettingError
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.ids import Allowlist
from tailguard.core.window.accumulate import Accumulator
from tailguard.settings import load
from tailguard.streaming import allowlist

T = 1_764_680_000.0


def docs(node: str, model: str) -> list[Any]:
    return [orjson.dumps({"node_id": node, "model": model, "latency_us": 5.0, "ts": T}),
            orjson.dumps({"type": "heartbeat", "node_id": node, "model": model, "ts": T}),
            orjson.dumps({"node_id": node, "model": model, "samples": [[T, 5.0]]}).decode(),
            binary.encode(node, model, None, np.array([T]), np.array([1.0]))]


def test_models_off_the_allowlist_are_dead_lettered_on_every_decode_path() -> None:
    allow = Allowlist(models=frozenset({"llama"}), model_pattern=r"qwen-\d+", nodes_on=False)
    acc = Accumulator(now_s=T + 10, allow=allow)
    for raw in docs("any-node", "llama") + docs("other", "qwen-7"):
        acc.add(raw)
    for raw in docs("any-node", "flood-000001"):
        with pytest.raises(BadEvent) as e:
            acc.add(raw)
        assert e.value.reason == "not_allowlisted" and "model 'flood-000001'" in str(e.value)
    assert {e.model for e in acc.drain()} == {"llama", "qwen-7"}


def test_node_and_model_rules_apply_together_and_no_model_rule_allows_every_model() -> None:
    both = Allowlist(frozenset({"gpu-1"}), models=frozenset({"llama"}))
    both.check("gpu-1", "llama")
    for node, model in (("gpu-9", "llama"), ("gpu-1", "other")):
        with pytest.raises(BadEvent):
            both.check(node, model)
    nodes_only = Allowlist(frozenset({"gpu-1"}))
    nodes_only.check("gpu-1", "anything")
    assert not nodes_only.models_on


async def test_the_settings_turn_the_model_allowlist_on() -> None:
    s = load({"TAILGUARD_ALLOWLIST_MODELS": "llama, mistral",
              "TAILGUARD_ALLOWLIST_MODEL_PATTERN": "qwen-.*"})
    assert s.allowlist_on and not s.allowlist_nodes_on
    got = await allowlist.load(s, None)
    assert got.models == {"llama", "mistral"} and not got.nodes_on
    got.check("whatever-node", "qwen-72b")
    with pytest.raises(BadEvent):
        got.check("whatever-node", "flood")
    with pytest.raises(SettingError, match="TAILGUARD_ALLOWLIST_MODEL_PATTERN"):
        load({"TAILGUARD_ALLOWLIST_MODEL_PATTERN": "("})
