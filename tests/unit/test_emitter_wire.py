"""What the emitter puts on the wire decodes with tailguard.core.contract.events.decode, sample for sample."""

from __future__ import annotations

import itertools
import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.events import Heartbeat, SampleBatch, decode
from tailguard.emitter.wire import (
    Sample,
    SeriesKey,
    check_series,
    encode_batches,
    encode_heartbeat,
    message_key,
    sample_values,
)

SERIES: SeriesKey = ("gpu-node-07", "llama-3-70b", "A100")
_seq = itertools.count(1)


def sample(ts: float, latency_us: float, inp: int | None = None, out: int | None = None,
           ttft: float | None = None, *, ok: bool = True, probe: bool = False) -> Sample:
    return (next(_seq), 0.0, ts, latency_us, inp, out, ttft, ok, probe)


def decoded(series: SeriesKey, samples: list[Sample]) -> list[SampleBatch]:
    out = []
    for value, group in encode_batches(series, samples):
        ev = decode(value)
        assert isinstance(ev, SampleBatch) and ev.rejected == 0
        assert len(ev) == len(group)
        out.append(ev)
    return out


def test_plain_samples_are_one_batch_in_the_contract_form() -> None:
    samples = [sample(1764680000.123, 183000), sample(1764680000.2, 190000.5)]
    [(value, _)] = encode_batches(SERIES, samples)
    assert orjson.loads(value) == {"node_id": "gpu-node-07", "model": "llama-3-70b", "hardware": "A100",
                                   "samples": [[1764680000.123, 183000], [1764680000.2, 190000.5]]}
    [ev] = decoded(SERIES, samples)
    assert (ev.node_id, ev.model, ev.hardware) == SERIES
    np.testing.assert_array_equal(ev.ts, [1764680000.123, 1764680000.2])
    np.testing.assert_array_equal(ev.latency_us, [183000, 190000.5])
    assert ev.ok.all() and not ev.probe.any()
    assert ev.input_tokens is None and ev.ttft_us is None


def test_token_fields_use_the_five_element_form_with_nulls_for_missing() -> None:
    samples = [sample(10.0, 5000, 100, 20, 800.0), sample(11.0, 6000, 50, None, None), sample(12.0, 7000)]
    [(value, _)] = encode_batches(SERIES, samples)
    assert orjson.loads(value)["samples"] == [[10.0, 5000, 100, 20, 800.0], [11.0, 6000, 50, None, None],
                                              [12.0, 7000]]
    [ev] = decoded(SERIES, samples)
    assert ev.input_tokens is not None and ev.output_tokens is not None and ev.ttft_us is not None
    np.testing.assert_array_equal(ev.input_tokens, [100, 50, np.nan])
    np.testing.assert_array_equal(ev.output_tokens, [20, np.nan, np.nan])
    np.testing.assert_array_equal(ev.ttft_us, [800.0, np.nan, np.nan])


def test_failed_and_probe_requests_go_in_flagged_batches() -> None:
    samples = [sample(1.0, 10), sample(2.0, 20, ok=False), sample(3.0, 30, probe=True),
               sample(4.0, 40, ok=False, probe=True), sample(5.0, 50), sample(6.0, 60, ok=False)]
    docs = [orjson.loads(v) for v, _ in encode_batches(SERIES, samples)]
    flags = [(d.get("ok"), d.get("probe"), [s[1] for s in d["samples"]]) for d in docs]
    assert flags == [(None, None, [10, 50]), (False, None, [20, 60]), (None, True, [30]), (False, True, [40])]
    by_latency = {}
    for ev in decoded(SERIES, samples):
        for lat, ok, probe in zip(ev.latency_us, ev.ok, ev.probe, strict=True):
            by_latency[int(lat)] = (bool(ok), bool(probe))
    assert by_latency == {10: (True, False), 20: (False, False), 30: (True, True), 40: (False, True),
                          50: (True, False), 60: (False, False)}


def test_hardware_none_is_omitted_and_heartbeats_decode() -> None:
    series: SeriesKey = ("n1", "m1", None)
    [(value, _)] = encode_batches(series, [sample(1.0, 10)])
    assert "hardware" not in orjson.loads(value)
    assert decode(value).hardware is None  # type: ignore[union-attr]
    hb = decode(encode_heartbeat(SERIES, 1764680000.5))
    assert hb == Heartbeat("gpu-node-07", "llama-3-70b", "A100", 1764680000.5)
    assert orjson.loads(encode_heartbeat(series, 3.0)) == {"type": "heartbeat", "node_id": "n1", "model": "m1",
                                                           "ts": 3.0}


def test_message_key_is_node_pipe_model() -> None:
    assert message_key(SERIES) == b"gpu-node-07|llama-3-70b"


@pytest.mark.parametrize(("args", "culprit"), [
    ((0, 1.0, None, None, None), "latency_us"),
    ((-5, 1.0, None, None, None), "latency_us"),
    ((math.nan, 1.0, None, None, None), "latency_us"),
    ((math.inf, 1.0, None, None, None), "latency_us"),
    ((True, 1.0, None, None, None), "latency_us"),
    (("100", 1.0, None, None, None), "latency_us"),
    ((100, -1.0, None, None, None), "ts"),
    ((100, math.nan, None, None, None), "ts"),
    ((100, 1.0, -1, None, None), "input_tokens"),
    ((100, 1.0, 1.5, None, None), "input_tokens"),
    ((100, 1.0, None, True, None), "output_tokens"),
    ((100, 1.0, None, 10**8, None), "output_tokens"),
    ((100, 1.0, None, None, 101), "ttft_us"),
    ((100, 1.0, None, None, -1), "ttft_us"),
])
def test_sample_values_rejects_what_the_decoder_would(args: tuple[object, ...], culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        sample_values(*args)


def test_sample_values_converts_numpy_scalars_to_plain_numbers() -> None:
    got = sample_values(np.float64(1500.5), np.float32(2.0), np.int64(12), np.int32(3), np.float64(10.0))
    assert got == (1500.5, 2.0, 12, 3, 10.0)
    assert [type(v) for v in got] == [float, float, int, int, float]
    assert orjson.dumps(list(got)) == b"[1500.5,2.0,12,3,10.0]"


@pytest.mark.parametrize(("node", "model", "hw", "culprit"), [
    ("", "m", None, "node_id"), ("n", "", None, "model"), ("n" * 257, "m", None, "node_id"),
    (7, "m", None, "node_id"), ("n", "m", 3, "hardware"), ("n", "m", "h" * 257, "hardware"),
])
def test_check_series_rejects_bad_names(node: object, model: object, hw: object, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        check_series(node, model, hw)


finite_ts = st.floats(0, 2e9, allow_nan=False)
size = st.one_of(st.none(), st.integers(0, 10_000_000))


@st.composite
def samples_st(draw: st.DrawFn) -> Sample:
    lat = draw(st.one_of(st.integers(1, 3_600_000_000), st.floats(1e-3, 3.6e9, allow_nan=False)))
    ttft = draw(st.one_of(st.none(), st.floats(0, 1).map(lambda f: f * lat)))
    return sample(draw(finite_ts), lat, draw(size), draw(size), ttft,
                  ok=draw(st.booleans()), probe=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(samples=st.lists(samples_st(), min_size=1, max_size=50),
       hw=st.one_of(st.none(), st.text(min_size=0, max_size=20)))
def test_any_checked_sample_round_trips_through_the_decoder(samples: list[Sample], hw: str | None) -> None:
    for s in samples:
        assert sample_values(s[3], s[2], s[4], s[5], s[6]) == (s[3], s[2], s[4], s[5], s[6])
    series: SeriesKey = ("gpu-node-01:8000", "meta-llama/Llama-3.1-8B-Instruct", hw)  # unicode: hw
    got = []
    for ev in decoded(series, samples):
        assert (ev.node_id, ev.model, ev.hardware) == series
        for i in range(len(ev)):
            def col(a: np.ndarray | None, i: int = i) -> float | None:
                return None if a is None or np.isnan(a[i]) else float(a[i])
            got.append((float(ev.ts[i]), float(ev.latency_us[i]), col(ev.input_tokens), col(ev.output_tokens),
                        col(ev.ttft_us), bool(ev.ok[i]), bool(ev.probe[i])))
    want = [(float(s[2]), float(s[3]), None if s[4] is None else float(s[4]), None if s[5] is None else float(s[5]),
             None if s[6] is None else float(s[6]), s[7], s[8]) for s in samples]
    assert sorted(got, key=repr) == sorted(want, key=repr)
