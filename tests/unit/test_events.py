"""Latency-event decoding: every validation rule, the three forms, batching."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract import events
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.errors import BadEvent, CoreError
from tailguard.core.contract.events import (
    MAX_BATCH_SAMPLES,
    REASONS,
    Heartbeat,
    SampleBatch,
    decode,
    parse_event,
)
from tailguard.core.window.accumulate import Accumulator, decode_many

BASE: dict[str, Any] = {"node_id": "gpu-node-07", "model": "llama-3-70b",
                        "latency_us": 183000, "ts": 1764680000.123}
NOW = 1764680000.0


def ev(**changes: Any) -> dict[str, Any]:
    d = dict(BASE)
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DROP = object()


def batch(samples: Any, **header: Any) -> dict[str, Any]:
    return {"node_id": "n1", "model": "m", "hardware": "A100", "samples": samples, **header}


# ---------------------------------------------------------------- valid input

def test_single_event_decodes_to_batch_of_one() -> None:
    b = decode(json.dumps(ev(hardware="A100", request_id="r1")))
    assert isinstance(b, SampleBatch)
    assert (b.node_id, b.model, b.hardware, len(b), b.rejected) == \
        ("gpu-node-07", "llama-3-70b", "A100", 1, 0)
    assert b.ts.tolist() == [1764680000.123]
    assert b.latency_us.tolist() == [183000.0]
    assert b.ok.tolist() == [True] and b.probe.tolist() == [False]
    assert b.input_tokens is None and b.output_tokens is None and b.ttft_us is None


def test_single_event_with_sizes_and_flags() -> None:
    b = decode(json.dumps(ev(ok=False, probe=True, input_tokens=374, output_tokens=44,
                             ttft_us=21000.5)).encode())
    assert isinstance(b, SampleBatch)
    assert b.ok.tolist() == [False] and b.probe.tolist() == [True]
    assert b.input_tokens is not None and b.input_tokens.tolist() == [374.0]
    assert b.output_tokens is not None and b.output_tokens.tolist() == [44.0]
    assert b.ttft_us is not None and b.ttft_us.tolist() == [21000.5]


def test_null_optional_fields_mean_absent() -> None:
    b = decode(json.dumps(ev(hardware=None, ok=None, probe=None, input_tokens=None,
                             output_tokens=12, ttft_us=None)))
    assert isinstance(b, SampleBatch)
    assert b.hardware is None and b.ok.tolist() == [True] and b.probe.tolist() == [False]
    assert b.input_tokens is None and b.ttft_us is None
    assert b.output_tokens is not None and b.output_tokens.tolist() == [12.0]


def test_integral_float_token_count_is_accepted() -> None:
    b = decode(json.dumps(ev(output_tokens=12.0)))
    assert isinstance(b, SampleBatch) and b.output_tokens is not None
    assert b.output_tokens.tolist() == [12.0]


def test_heartbeat() -> None:
    hb = decode(json.dumps({"type": "heartbeat", "node_id": "n", "model": "m",
                            "hardware": "A10", "ts": 12}))
    assert hb == Heartbeat("n", "m", "A10", 12.0)
    assert hb.key == ("n", "m")


def test_batch_two_and_five_element_samples() -> None:
    b = decode(json.dumps(batch([[1.0, 10], [2, 20, 5, 7, 3], [3, 30, None, 9, None]],
                                probe=True)))
    assert isinstance(b, SampleBatch)
    assert b.ts.tolist() == [1.0, 2.0, 3.0] and b.latency_us.tolist() == [10.0, 20.0, 30.0]
    assert b.probe.all() and b.ok.all()
    assert b.input_tokens is not None and b.output_tokens is not None and b.ttft_us is not None
    np.testing.assert_array_equal(b.input_tokens, [np.nan, 5, np.nan])
    np.testing.assert_array_equal(b.output_tokens, [np.nan, 7, 9])
    np.testing.assert_array_equal(b.ttft_us, [np.nan, 3, np.nan])


def test_batch_of_pairs_has_no_size_columns() -> None:
    b = decode(json.dumps(batch([[1, 10], [2, 20]])))
    assert isinstance(b, SampleBatch)
    assert b.input_tokens is None and b.output_tokens is None and b.ttft_us is None


def test_batch_keeps_good_samples_and_counts_bad_ones() -> None:
    samples = [[1, 10], [2, -1], [3, True], "x", [4, 40, 1.5, 2, 1], [5, 50, 1, 2, 60],
               [6, 60], [7, 70, 1, 2]]
    b = decode(json.dumps(batch(samples)))
    assert isinstance(b, SampleBatch)
    assert b.ts.tolist() == [1.0, 6.0]
    assert b.rejected == 6


def test_all_samples_bad_rejects_the_batch_with_first_reason() -> None:
    with pytest.raises(BadEvent) as e:
        decode(json.dumps(batch([[1, -5], [2, 0]])))
    assert e.value.reason == "bad_latency" and "samples[0]" in str(e.value)


def test_unknown_keys_are_ignored() -> None:
    b = decode(json.dumps(ev(request_id=7, extra={"a": 1})))
    assert isinstance(b, SampleBatch) and len(b) == 1


def test_forms_may_be_named_by_type() -> None:
    single = parse_event(ev(type="single"))
    assert isinstance(single, SampleBatch)
    assert (single.node_id, single.latency_us.tolist(), single.ts.tolist()) == (
        "gpu-node-07", [183000.0], [1764680000.123])
    batch_ev = parse_event(batch([[NOW, 1.0]], type="batch"))
    assert isinstance(batch_ev, SampleBatch) and batch_ev.latency_us.tolist() == [1.0]
    acc = Accumulator()
    acc.add(json.dumps(ev(type="single")))
    acc.add(json.dumps(ev()))
    (grouped,) = acc.drain()
    assert len(grouped.latency_us) == 2


def test_future_check_only_with_now() -> None:
    far = ev(ts=NOW + 10_000)
    assert isinstance(decode(json.dumps(far)), SampleBatch)
    with pytest.raises(BadEvent) as e:
        decode(json.dumps(far), now_s=NOW)
    assert e.value.reason == "future_ts" and e.value.field == "ts"
    edge = ev(ts=NOW + DetectorSettings().max_future_skew_s)
    assert isinstance(decode(json.dumps(edge), now_s=NOW), SampleBatch)


def test_settings_bound_latency() -> None:
    s = DetectorSettings(max_latency_us=1000.0)
    assert isinstance(decode(json.dumps(ev(latency_us=1000)), settings=s), SampleBatch)
    with pytest.raises(BadEvent) as e:
        decode(json.dumps(ev(latency_us=1001)), settings=s)
    assert e.value.reason == "bad_latency"


# ---------------------------------------------------------------- bad input, table-driven

LONG = "x" * 257
BAD_SINGLE = [
    # (description, object, reason, field)
    ("missing node_id", ev(node_id=_DROP), "missing_field", "node_id"),
    ("null node_id", ev(node_id=None), "missing_field", "node_id"),
    ("empty node_id", ev(node_id=""), "empty_field", "node_id"),
    ("long node_id", ev(node_id=LONG), "bad_node_id", "node_id"),
    ("int node_id", ev(node_id=7), "bad_type", "node_id"),
    ("missing model", ev(model=_DROP), "missing_field", "model"),
    ("empty model", ev(model=""), "empty_field", "model"),
    ("long model", ev(model=LONG), "bad_model", "model"),
    ("list model", ev(model=["m"]), "bad_type", "model"),
    ("missing latency", ev(latency_us=_DROP), "missing_field", "latency_us"),
    ("bool latency", ev(latency_us=True), "bad_latency", "latency_us"),
    ("string latency", ev(latency_us="183000"), "bad_latency", "latency_us"),
    ("zero latency", ev(latency_us=0), "bad_latency", "latency_us"),
    ("negative latency", ev(latency_us=-1.5), "bad_latency", "latency_us"),
    ("huge latency", ev(latency_us=3.7e9), "bad_latency", "latency_us"),
    ("nan latency", ev(latency_us=math.nan), "bad_latency", "latency_us"),
    ("inf latency", ev(latency_us=math.inf), "bad_latency", "latency_us"),
    ("missing ts", ev(ts=_DROP), "missing_field", "ts"),
    ("string ts", ev(ts="2025-01-01"), "bad_ts", "ts"),
    ("bool ts", ev(ts=False), "bad_ts", "ts"),
    ("negative ts", ev(ts=-1), "bad_ts", "ts"),
    ("inf ts", ev(ts=math.inf), "bad_ts", "ts"),
    ("nan ts", ev(ts=math.nan), "bad_ts", "ts"),
    ("int hardware", ev(hardware=100), "bad_type", "hardware"),
    ("long hardware", ev(hardware=LONG), "too_long", "hardware"),
    ("string ok", ev(ok="yes"), "bad_type", "ok"),
    ("int ok", ev(ok=1), "bad_type", "ok"),
    ("int probe", ev(probe=0), "bad_type", "probe"),
    ("negative tokens", ev(input_tokens=-1), "bad_tokens", "input_tokens"),
    ("fractional tokens", ev(output_tokens=1.5), "bad_tokens", "output_tokens"),
    ("bool tokens", ev(output_tokens=True), "bad_tokens", "output_tokens"),
    ("string tokens", ev(output_tokens="12"), "bad_tokens", "output_tokens"),
    ("huge tokens", ev(output_tokens=10**8), "bad_tokens", "output_tokens"),
    ("inf tokens", ev(input_tokens=math.inf), "bad_tokens", "input_tokens"),
    ("negative ttft", ev(ttft_us=-1), "bad_ttft", "ttft_us"),
    ("ttft above latency", ev(ttft_us=183001), "bad_ttft", "ttft_us"),
    ("bool ttft", ev(ttft_us=False), "bad_ttft", "ttft_us"),
    ("unknown type", ev(type="metric"), "unknown_form", "type"),
    ("batch type without samples", ev(type="batch"), "missing_field", "samples"),
    ("heartbeat without ts", {"type": "heartbeat", "node_id": "n", "model": "m"},
     "missing_field", "ts"),
    ("heartbeat without node", {"type": "heartbeat", "model": "m", "ts": 1},
     "missing_field", "node_id"),
    ("heartbeat bad hardware", {"type": "heartbeat", "node_id": "n", "model": "m", "ts": 1,
                                "hardware": 3}, "bad_type", "hardware"),
    ("batch samples not list", batch({"a": 1}), "bad_batch", "samples"),
    ("batch samples null", batch(None), "bad_batch", "samples"),
    ("batch empty", batch([]), "empty_batch", "samples"),
    ("batch bad header", batch([[1, 2]], node_id=""), "empty_field", "node_id"),
    ("batch header ok flag", batch([[1, 2]], ok="no"), "bad_type", "ok"),
    ("batch 3-element sample", batch([[1, 2, 3]]), "bad_sample", "samples"),
    ("batch non-list sample", batch([5]), "bad_sample", "samples"),
    ("batch bool sample", batch([[True, 2]]), "bad_sample", "samples"),
    ("batch string sample", batch([["1", 2]]), "bad_sample", "samples"),
    ("batch sample bad ts", batch([[-1, 2]]), "bad_ts", "samples"),
    ("batch sample bad tokens", batch([[1, 2, -3, 4, 1]]), "bad_tokens", "samples"),
    ("batch sample bad ttft", batch([[1, 2, 3, 4, 5]]), "bad_ttft", "samples"),
    ("batch sample huge int", batch([[1, 10**400]]), "bad_latency", "samples"),
]


@pytest.mark.parametrize(("obj", "reason", "field"), [c[1:] for c in BAD_SINGLE],
                         ids=[c[0] for c in BAD_SINGLE])
def test_bad_event_reason_and_field(obj: dict[str, Any], reason: str, field: str) -> None:
    assert reason in REASONS
    with pytest.raises(BadEvent) as e:
        parse_event(obj)
    assert e.value.reason == reason
    assert e.value.field == field
    assert field in str(e.value)
    # Through JSON too, where JSON can carry the value (not NaN/inf).
    try:
        text = json.dumps(obj, allow_nan=False)
    except ValueError:
        return
    with pytest.raises(BadEvent) as e2:
        decode(text)
    # orjson refuses integers beyond 64 bits as JSON; the stdlib would decode them.
    expected = "bad_json" if "0" * 30 in text and events.json_loads is not json.loads else reason
    assert e2.value.reason == expected


def test_too_many_samples() -> None:
    with pytest.raises(BadEvent) as e:
        parse_event(batch([[1, 2]] * (MAX_BATCH_SAMPLES + 1)))
    assert e.value.reason == "too_long"


def test_batch_sample_future_ts() -> None:
    with pytest.raises(BadEvent) as e:
        parse_event(batch([[NOW + 1e6, 2]]), now_s=NOW)
    assert e.value.reason == "future_ts"


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{", "bad_json"),
    (b"", "bad_json"),
    (b"\xff\xfe", "bad_json"),
    (b'{"latency_us": NaN}', "bad_json"),
    (b'{"latency_us": Infinity}', "bad_json"),
    ("[1, 2]", "not_object"),
    ("42", "not_object"),
    ("null", "not_object"),
    ('"text"', "not_object"),
])
def test_bad_json(raw: bytes | str, reason: str) -> None:
    with pytest.raises(BadEvent) as e:
        decode(raw)
    assert e.value.reason == reason


@pytest.mark.parametrize("raw", ['{"a": NaN}', '{"a": -Infinity}', "{"])
def test_stdlib_fallback_rejects_what_orjson_rejects(raw: str) -> None:
    with pytest.raises(ValueError):
        events._std_loads()(raw)


def test_stdlib_fallback_decodes_same_values() -> None:
    text = json.dumps(ev(input_tokens=3, output_tokens=4, ttft_us=5.5))
    assert events._std_loads()(text) == events.json_loads(text)


def test_bad_event_is_core_error_and_pickles() -> None:
    import pickle

    e = BadEvent("bad_ts", "ts is bad", field="ts")
    assert isinstance(e, CoreError)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.reason, e2.field, str(e2)) == ("bad_ts", "ts", "ts is bad")


# ---------------------------------------------------------------- accumulator

def test_accumulator_groups_singles_per_series_in_order() -> None:
    acc = Accumulator()
    lines = [json.dumps(ev(node_id=n, ts=float(i), latency_us=100 + i))
             for i, n in enumerate("abab")]
    assert [acc.add(x) for x in lines] == [0.0, 1.0, 2.0, 3.0]
    assert len(acc) == 4
    out = acc.drain()
    assert len(acc) == 0 and acc.drain() == []
    by_node = {b.node_id: b for b in out if isinstance(b, SampleBatch)}
    assert by_node["a"].ts.tolist() == [0.0, 2.0]
    assert by_node["b"].latency_us.tolist() == [101.0, 103.0]


def test_accumulator_keeps_per_series_order_around_heartbeats_and_batches() -> None:
    acc = Accumulator()
    acc.add(json.dumps(ev(node_id="a", ts=1.0)))
    acc.add(json.dumps({"type": "heartbeat", "node_id": "a", "model": BASE["model"], "ts": 2}))
    acc.add(json.dumps(ev(node_id="a", ts=3.0, output_tokens=5)))
    assert acc.add(json.dumps({"node_id": "a", "model": BASE["model"],
                               "samples": [[9, 1], [4, 1]]})) == 9.0
    out = acc.drain()
    kinds = [(type(x).__name__, x.ts if isinstance(x, Heartbeat) else x.ts.tolist())
             for x in out]
    assert kinds == [("SampleBatch", [1.0]), ("Heartbeat", 2.0), ("SampleBatch", [3.0]),
                     ("SampleBatch", [9.0, 4.0])]


def test_accumulator_bad_line_leaves_state_unchanged() -> None:
    acc = Accumulator()
    acc.add(json.dumps(ev(ts=1.0)))
    with pytest.raises(BadEvent):
        acc.add(json.dumps(ev(ts=2.0, latency_us=-1)))
    with pytest.raises(BadEvent):
        acc.add(b"nope")
    out = acc.drain()
    assert len(out) == 1 and isinstance(out[0], SampleBatch) and out[0].ts.tolist() == [1.0]


def test_grouped_batch_mixes_sized_and_unsized_rows() -> None:
    acc = Accumulator()
    acc.add(json.dumps(ev(ts=1.0)))
    acc.add(json.dumps(ev(ts=2.0, output_tokens=7)))
    (b,) = acc.drain()
    assert isinstance(b, SampleBatch)
    assert b.input_tokens is None and b.ttft_us is None
    assert b.output_tokens is not None
    np.testing.assert_array_equal(b.output_tokens, [np.nan, 7.0])


def test_decode_many_reports_bad_indices() -> None:
    lines = [json.dumps(ev()), "garbage", json.dumps(ev(latency_us=0)), json.dumps(ev(ts=5.0))]
    got, bad = decode_many(lines)
    assert [i for i, _ in bad] == [1, 2]
    assert [e.reason for _, e in bad] == ["bad_json", "bad_latency"]
    assert sum(len(b) for b in got if isinstance(b, SampleBatch)) == 2


# ---------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12)
field_values = st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=3) \
    | st.floats(-1e3, 1e10) | st.lists(st.integers(0, 5), max_size=5)
event_like = st.fixed_dictionaries({}, optional={
    k: field_values for k in ("node_id", "model", "latency_us", "ts", "hardware", "ok", "probe",
                              "input_tokens", "output_tokens", "ttft_us", "type")
}) | st.fixed_dictionaries({"node_id": st.just("n"), "model": st.just("m"),
                            "samples": st.lists(st.lists(field_values, max_size=6),
                                                max_size=5)})


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, event_like))
def test_any_json_decodes_or_raises_bad_event(obj: Any) -> None:
    text = json.dumps(obj)
    try:
        out = decode(text, now_s=NOW)
    except BadEvent as e:
        assert e.reason in REASONS
        return
    assert isinstance(out, SampleBatch | Heartbeat)
    if isinstance(out, SampleBatch):
        assert len(out) > 0
        assert np.all(out.latency_us > 0) and np.all(np.isfinite(out.ts))


# Any id of the default rule: printable ASCII 0x21-0x7E except '|'.
ID_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="|")


@settings(max_examples=200, deadline=None)
@given(node=st.text(ID_CHARS, min_size=1, max_size=20), lat=st.floats(1e-3, 3.6e9),
       ts=st.floats(0, 2e9), out=st.none() | st.integers(0, 10**6),
       ok=st.booleans(), probe=st.booleans())
def test_valid_events_round_trip(node: str, lat: float, ts: float, out: int | None,
                                 ok: bool, probe: bool) -> None:
    b = decode(json.dumps(ev(node_id=node, latency_us=lat, ts=ts, output_tokens=out, ok=ok,
                             probe=probe)))
    assert isinstance(b, SampleBatch)
    assert b.node_id == node and b.latency_us[0] == lat and b.ts[0] == ts
    assert bool(b.ok[0]) is ok and bool(b.probe[0]) is probe
    if out is None:
        assert b.output_tokens is None
    else:
        assert b.output_tokens is not None and b.output_tokens[0] == out
