"""The summary batch on node-window-stats: round trip, chunking, and broken bytes."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.types import WindowSummary
from tailguard.streaming.summary_batch import (
    HEADER,
    MAGIC,
    ROW,
    SummaryBatch,
    decode_batch,
    encode_batches,
)
from tailguard.streaming.wire import decode_stage2, encode_summary


def full(i: int, model: str = "m") -> WindowSummary:
    """A summary with every field set, varied by ``i`` (some optional ones left at none)."""
    return WindowSummary(
        node_id=f"node-{i}", model=model, tick_ts=1_764_680_000.0 + i, signal=("latency", "tpot")[i % 2],
        samples=500 + i, p50=1000.5 + i, p99=None if i % 5 == 0 else 4000.25,
        latency_p50_us=1000.5, latency_p99_us=4000.25, failed=i % 3,
        hardware=None if i % 4 == 0 else ("A100", "H100")[i % 2], first_seen_ts=10.0,
        last_seen_ts=1_764_679_999.5, probe_samples=i % 2, probe_p50=900.0 if i % 2 else None,
        probe_p99=None, extra={"judged_since": 12.5, "fleet_fit": {"a": [1.0, 2.0]}} if i % 3 == 0
        else WindowSummary._field_defaults["extra"],
        fresh_samples=40, fresh_p50=1100.0, requests_total=10_000 + i, failed_total=i,
        instance_ts=None if i % 2 else 77.0, resumed_ts=None, fresh_over=None if i % 3 else 2)


def unpack(messages: list[bytes]) -> list[WindowSummary]:
    return [s for m in messages for s in decode_batch(m).summaries]


def test_round_trip_keeps_every_field_and_the_order() -> None:
    rows = [full(i) for i in range(50)]
    messages = encode_batches("m", rows)
    assert len(messages) == 1 and messages[0][:3] == MAGIC
    got = decode_batch(messages[0])
    assert got.model == "m" and list(got.summaries) == rows
    assert [s.extra for s in got.summaries] == [dict(s.extra) for s in rows]
    # The same summaries as the JSON message of one summary gives.
    assert list(got.summaries) == [decode_stage2(encode_summary(s)) for s in rows]


def test_decode_stage2_reads_a_batch_by_its_magic() -> None:
    msg = decode_stage2(encode_batches("m", [full(1)])[0])
    assert isinstance(msg, SummaryBatch) and msg.summaries == (full(1),)


finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)
maybe = st.none() | finite
name = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
count = st.integers(min_value=0, max_value=2**40)


@st.composite
def summaries(draw: st.DrawFn) -> WindowSummary:
    fresh = draw(count)
    requests = draw(count)
    return WindowSummary(
        node_id=draw(name), model="model ü", tick_ts=draw(finite), signal=draw(name),
        samples=draw(count), p50=draw(maybe), p99=draw(maybe), latency_p50_us=draw(maybe),
        latency_p99_us=draw(maybe), failed=draw(count), hardware=draw(st.none() | name),
        first_seen_ts=draw(maybe), last_seen_ts=draw(maybe), probe_samples=draw(count),
        probe_p50=draw(maybe), probe_p99=draw(maybe),
        fresh_samples=fresh, fresh_p50=draw(st.none() | st.floats(min_value=1e-3, max_value=1e9)),
        requests_total=requests, failed_total=draw(st.integers(0, requests)),
        instance_ts=draw(maybe), resumed_ts=draw(maybe),
        fresh_over=draw(st.none() | st.integers(0, fresh)))


@settings(max_examples=60, deadline=None)
@given(st.lists(summaries(), max_size=40), st.integers(1, 7))
def test_any_summaries_round_trip_in_chunks(rows: list[WindowSummary], max_rows: int) -> None:
    messages = encode_batches("model ü", rows, max_rows=max_rows)
    assert unpack(messages) == rows
    assert all(len(decode_batch(m).summaries) <= max_rows for m in messages)


def test_chunks_stay_under_the_byte_limit_when_extras_are_large() -> None:
    big = {"hist": {"e2e": {"bounds_s": [0.1 * k for k in range(200)]}}}
    rows = [full(i)._replace(extra=big) for i in range(300)]
    messages = encode_batches("m", rows, max_bytes=20_000)
    assert len(messages) > 1
    assert max(map(len, messages)) <= 20_000
    assert unpack(messages) == rows


def test_default_chunks_of_many_summaries() -> None:
    rows = [full(i)._replace(extra=WindowSummary._field_defaults["extra"]) for i in range(4500)]
    messages = encode_batches("m", rows)
    assert [len(decode_batch(m).summaries) for m in messages] == [2000, 2000, 500]
    assert unpack(messages) == rows
    assert encode_batches("m", []) == []


def test_bad_optional_fields_are_repaired_like_the_json_form() -> None:
    rows = [full(1)._replace(fresh_samples=-3), full(2)._replace(fresh_p50=-1.0),
            full(3)._replace(failed_total=20_000, requests_total=5),
            full(4)._replace(fresh_over=41), full(5)._replace(instance_ts=float("inf"))]
    got = unpack(encode_batches("m", rows))
    assert got == [decode_stage2(encode_summary(s)) for s in rows[:4]] + [
        rows[4]._replace(instance_ts=None)]
    assert got[0].fresh_samples == 0 and got[0].fresh_p50 is None
    assert (got[2].requests_total, got[2].failed_total) == (0, 0)
    assert got[3].fresh_over is None


def _broken(good: bytes) -> dict[str, bytes]:
    names_len = struct.unpack_from("<I", good, 10)[0]
    names = good[HEADER.size:HEADER.size + names_len]
    rows_at = len(good) - ROW.itemsize

    def patch(at: int, raw: bytes) -> bytes:
        b = bytearray(good)
        b[at:at + len(raw)] = raw
        return bytes(b)

    return {
        "short": good[:10],
        "truncated": good[:-1],
        "trailing": good + b"\0",
        "version": patch(3, b"\x02"),
        "flags": patch(4, b"\x01"),
        "reserved": patch(5, b"\x01"),
        "rows": patch(6, struct.pack("<I", 2)),
        "names not json": patch(HEADER.size, b"["),
        "names swapped": patch(HEADER.size, names.replace(b'"nodes"', b'"nodez"')),
        "signal index": patch(rows_at + ROW.fields["signal"][1], struct.pack("<i", 9)),
        "hardware index": patch(rows_at + ROW.fields["hardware"][1], struct.pack("<i", -2)),
        "tick_ts": patch(rows_at + ROW.fields["tick_ts"][1], struct.pack("<d", float("nan"))),
        "magic only": good[:3],
    }


@pytest.mark.parametrize("case", list(_broken(encode_batches("m", [full(3)])[0])))
def test_a_broken_batch_is_bad_batch(case: str) -> None:
    raw = _broken(encode_batches("m", [full(3)])[0])[case]
    with pytest.raises(BadEvent) as e:
        decode_stage2(raw)
    assert e.value.reason == "bad_batch", e.value
    assert str(e.value).startswith("summary batch: ")


def test_corrupted_bytes_raise_nothing_but_bad_event() -> None:
    good = encode_batches("m", [full(i) for i in range(6)])[0]
    rng = random.Random(29)
    for _ in range(2000):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.2:
            b = b[:rng.randrange(len(b))]
        try:
            got = decode_batch(bytes(b))
        except BadEvent as e:
            assert e.reason == "bad_batch"
        else:   # a flip inside the numbers still decodes: into well-formed summaries
            assert all(isinstance(s.node_id, str) and isinstance(s.tick_ts, float)
                       for s in got.summaries)
