"""Key layout: names are unambiguous for any model name, messages round-trip, statuses serialize."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.core.contract.types import HealthState, NodeStatus
from tailguard.routing.keys import (
    Keys,
    change_message,
    decode_model,
    encode_model,
    parse_change_message,
    status_json,
)

models = st.text(min_size=1, max_size=40)


@pytest.mark.parametrize(
    ("model", "encoded"),
    [
        ("llama-3-70b", "llama-3-70b"),
        ("bge/large-en_v1.5", "bge/large-en_v1.5"),
        ("Qwen2.5 7B", "Qwen2.5%207B"),
        ("org:model", "org%3Amodel"),
        ("100%", "100%25"),
        ("tab\there", "tab%09here"),
        ("ünïcode", "ünïcode"),
    ],
)
def test_encode_model_table(model: str, encoded: str) -> None:
    assert encode_model(model) == encoded
    assert decode_model(encoded) == model


@given(models)
def test_encode_round_trips_and_leaves_no_separator(model: str) -> None:
    enc = encode_model(model)
    assert decode_model(enc) == model
    assert ":" not in enc
    assert not any(c.isspace() for c in enc)


@given(models, models)
def test_distinct_models_never_share_a_key(a: str, b: str) -> None:
    k = Keys("tg")
    keys_a = {k.routing(a), k.version(a), k.quarantine(a), k.nodes(a), k.models}
    keys_b = {k.routing(b), k.version(b), k.quarantine(b), k.nodes(b), k.models}
    if a == b:
        assert keys_a == keys_b
    else:
        assert keys_a & keys_b == {k.models}


def test_version_key_of_one_model_is_not_the_routing_key_of_another() -> None:
    k = Keys()
    assert k.version("foo") == "tailguard:routing:foo:version"
    assert k.routing("foo:version") == "tailguard:routing:foo%3Aversion"
    assert k.routing("foo:version") != k.version("foo")


def test_contract_key_names() -> None:
    k = Keys("tailguard")
    assert k.routing("llama-3-70b") == "tailguard:routing:llama-3-70b"
    assert k.version("llama-3-70b") == "tailguard:routing:llama-3-70b:version"
    assert k.quarantine("llama-3-70b") == "tailguard:quarantine:llama-3-70b"
    assert k.nodes("llama-3-70b") == "tailguard:nodes:llama-3-70b"
    assert k.models == "tailguard:models"
    assert k.channel == "tailguard:routing:changes"


@pytest.mark.parametrize("prefix", ["", "has space", "tab\t"])
def test_bad_prefix_is_rejected_naming_the_setting(prefix: str) -> None:
    with pytest.raises(ValueError, match="TAILGUARD_KEY_PREFIX"):
        Keys(prefix)


def test_empty_model_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        encode_model("")


@given(models, st.integers(min_value=0, max_value=2**62))
def test_change_message_round_trips(model: str, version: int) -> None:
    assert parse_change_message(change_message(model, version)) == (model, version)
    assert parse_change_message(change_message(model, version).encode()) == (model, version)


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"[]", b'{"model": "m"}', b'{"model": "", "version": 1}',
     b'{"model": "m", "version": "3"}', b'{"model": "m", "version": true}',
     b'{"model": 5, "version": 1}', b"\xff\xfe"],
)
def test_malformed_change_messages_are_ignored(data: bytes) -> None:
    assert parse_change_message(data) is None


def test_lua_cjson_message_shape_is_understood() -> None:
    # Redis' cjson escapes "/" and orders keys arbitrarily.
    assert parse_change_message(b'{"version":7,"model":"bge\\/large"}') == ("bge/large", 7)


def test_status_json_fields_and_no_nan() -> None:
    s = NodeStatus(
        node_id="gpu-1", model="m", state=HealthState.QUARANTINED, routed=False, since_ts=100.0,
        reason="quarantine", p50=2.0, p99=math.nan, ratio=math.inf, samples=1000,
        latency_p50_us=180000.0, latency_p99_us=None, hardware="A100", probe_after_ts=160.0,
    )
    obj = json.loads(status_json(s, updated_ts=123.0))
    assert obj == {
        "state": "quarantined", "routed": False, "since": 100.0, "reason": "quarantine",
        "p50_us": 180000.0, "p99_us": None, "ratio": None, "samples": 1000, "signal": None,
        "signal_p50": 2.0, "signal_p99": None, "signal_ratio": None, "hardware": "A100",
        "probe_after": 160.0, "updated": 123.0,
    }


def test_status_json_takes_numpy_numbers_and_writes_no_non_finite_number_anywhere() -> None:
    s = NodeStatus(
        node_id="gpu-1", model="m", state=HealthState.HEALTHY, routed=True, since_ts=100.0,
        reason="normal", p50=np.float64(2.5), p99=np.float32(4.0), ratio=1.6, samples=1000,
        latency_p50_us=np.float64(180000.0), weight=math.nan,
    )
    text = status_json(s, updated_ts=math.inf, extra={"note": np.float64(math.nan)})
    obj = json.loads(text)
    assert "NaN" not in text and "Infinity" not in text
    assert obj["signal_p50"] == 2.5 and obj["signal_p99"] == 4.0 and obj["p50_us"] == 180000.0
    assert obj["updated"] is None and obj["weight"] is None and obj["note"] is None


def test_status_json_ratio_is_raw_and_signal_ratio_is_the_signals() -> None:
    s = NodeStatus(
        node_id="gpu-1", model="m", state=HealthState.HEALTHY, routed=True, since_ts=100.0,
        reason="normal", p50=40.0, p99=48.0, ratio=1.2, samples=1000, signal="tpot",
        latency_p50_us=200000.0, latency_p99_us=920000.0,
    )
    obj = json.loads(status_json(s, updated_ts=123.0))
    assert obj["ratio"] == pytest.approx(obj["p99_us"] / obj["p50_us"]) == pytest.approx(4.6)
    assert obj["signal_ratio"] == 1.2
