"""The binary batch form (tailguard.core.contract.binary, docs/contracts-binary.md) and the typed JSON path.

Both fast paths must give what the general JSON path gives: the same values,
drops and errors. The emitter's stdlib writer and the core's numpy writer must
write the same bytes.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson
import pytest

from tailguard.core.contract import binary, events, ids
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import SampleBatch, decode
from tailguard.core.window.accumulate import Accumulator
from tailguard.emitter.wire import Sample, encode_batches, encode_binary

T = 1_764_680_000.0
SERIES = ("gpu-node-07", "llama-3-70b", "A100")


def sample(ts: float, lat: float, inp: int | None = None, out: int | None = None,
           ttft: float | None = None, ok: bool = True, probe: bool = False) -> Sample:
    return (0, 0.0, ts, lat, inp, out, ttft, ok, probe)


def fields(ev: SampleBatch) -> dict[str, Any]:
    def arr(a: Any) -> Any:
        return None if a is None else [None if math.isnan(v) else v for v in a.tolist()]
    return {"key": ev.key, "hardware": ev.hardware, "ts": arr(ev.ts), "lat": arr(ev.latency_us),
            "ok": ev.ok.tolist(), "probe": ev.probe.tolist(), "inp": arr(ev.input_tokens),
            "out": arr(ev.output_tokens), "ttft": arr(ev.ttft_us), "rejected": ev.rejected}


GROUPS = [
    [sample(T, 1000.0), sample(T + 1, 2000.5)],
    [sample(T, 1000.0, 100, 20, 700.0), sample(T + 1, 2000.0)],
    [sample(T, 900.0, ok=False), sample(T, 800.0, ok=False)],
    [sample(T, 900.0, probe=True, inp=5)],
]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize(("hardware", "instance"), [("A100", "pid-1"), (None, None),
                                                    ("ünïcode-GPU", None), (None, "i")])
def test_binary_and_json_batches_decode_to_the_same_samples(
        group: list[Sample], hardware: str | None, instance: str | None) -> None:
    series = (SERIES[0], SERIES[1], hardware)
    [(raw_b, _)] = encode_batches(series, group, instance, fmt="binary")
    [(raw_j, _)] = encode_batches(series, group, instance, fmt="json")
    assert binary.is_binary(raw_b) and not binary.is_binary(raw_j)
    ev_b, ev_j = decode(raw_b), decode(raw_j)
    assert isinstance(ev_b, SampleBatch) and isinstance(ev_j, SampleBatch)
    assert fields(ev_b) == fields(ev_j) and ev_b.instance == ev_j.instance == instance
    assert len(raw_b) < len(raw_j) or len(group) < 3


@pytest.mark.parametrize("group", GROUPS)
def test_the_emitter_and_the_core_write_the_same_bytes(group: list[Sample]) -> None:
    ok, probe = group[0][7], group[0][8]
    sized = any(s[4] is not None or s[5] is not None or s[6] is not None for s in group)

    def col(i: int) -> np.ndarray:
        return np.array([math.nan if s[i] is None else s[i] for s in group], dtype=np.float64)
    for instance in (None, "pid-7"):
        core = binary.encode(SERIES[0], SERIES[1], SERIES[2], col(2), col(3), ok=ok, probe=probe,
                             input_tokens=col(4) if sized else None,
                             output_tokens=col(5) if sized else None,
                             ttft_us=col(6) if sized else None, instance=instance)
        assert encode_binary(SERIES, group, ok=ok, probe=probe, instance=instance) == core


def test_the_layout_is_the_documented_one() -> None:
    raw = encode_binary(("n", "m", None), [sample(2.0, 3.0)], ok=True, probe=False)
    assert raw[:4] == b"\xf5TG\x01" and raw[4] == 0 and raw[5] == 0
    assert struct.unpack_from("<HHHHI", raw, 6) == (1, 1, 0, 0, 1)
    assert raw[18:20] == b"nm" and raw[20:24] == b"\0" * 4
    assert struct.unpack_from("<2d", raw, 24) == (2.0, 3.0) and len(raw) == 40
    raw = encode_binary(("n", "m", "h"), [sample(2.0, 3.0)], ok=False, probe=True, instance="i")
    assert raw[4] == 0x01 | 0x02 | 0x08 | 0x10 and raw[18:22] == b"nmhi" and len(raw) == 40


def _bin(**kw: Any) -> bytes:
    return binary.encode("n", "m", None, np.array([T, T + 1]), np.array([5.0, 6.0]), **kw)


GOOD = _bin()
BAD_BINARY = [
    (GOOD[:10], "shorter than the 18-byte header"),
    (GOOD[:-1], "where the header announces"),
    (GOOD + b"\0" * 8, "where the header announces"),
    (GOOD[:3] + b"\x02" + GOOD[4:], "version 2 is not supported"),
    (GOOD[:4] + b"\x40" + GOOD[4 + 1:], "unknown flag bits"),
    (GOOD[:5] + b"\x01" + GOOD[6:], "reserved byte"),
    (GOOD[:18] + b"\xff" + GOOD[19:], "node_id is not UTF-8"),
    (GOOD[:10] + b"\x01\x00" + GOOD[12:], "hardware length without the hardware flag"),
    (GOOD[:12] + b"\x01\x00" + GOOD[14:], "instance length without the instance flag"),
]


@pytest.mark.parametrize(("raw", "says"), BAD_BINARY)
def test_a_broken_binary_batch_is_bad_binary_and_says_what(raw: bytes, says: str) -> None:
    with pytest.raises(BadEvent) as e:
        decode(raw)
    assert e.value.reason == "bad_binary" and says in str(e.value)
    assert "bad_binary" in events.REASONS


def test_binary_samples_are_validated_like_json_ones() -> None:
    raw = binary.encode("n", "m", None, np.array([T, T, -1.0, T]),
                        np.array([5.0, -1.0, 6.0, math.inf]))
    ev = decode(raw, now_s=T + 10)
    assert isinstance(ev, SampleBatch)
    assert ev.latency_us.tolist() == [5.0] and ev.rejected == 3
    with pytest.raises(BadEvent) as e:
        decode(binary.encode("n", "m", None, np.array([T]), np.array([0.0])))
    assert e.value.reason == "bad_latency" and "samples[0]" in str(e.value)
    with pytest.raises(BadEvent) as e:
        decode(binary.encode("n", "m", None, np.array([T + 3600]), np.array([1.0])), now_s=T)
    assert e.value.reason == "future_ts"
    with pytest.raises(BadEvent) as e:
        decode(binary.encode("", "m", None, np.array([T]), np.array([1.0])))
    assert e.value.reason == "empty_field"
    with pytest.raises(BadEvent) as e:
        decode(binary.encode("n", "m" * 257, None, np.array([T]), np.array([1.0])))
    assert e.value.reason == "bad_model"
    with pytest.raises(BadEvent) as e:
        decode(binary.encode("n", "m", None, np.zeros(0), np.zeros(0)))
    assert e.value.reason == "empty_batch"
    with pytest.raises(BadEvent) as e:
        decode(binary.encode("n", "m", None, np.array([T]), np.array([9.0]),
                             input_tokens=np.array([1.5])))
    assert e.value.reason == "bad_tokens"


JSON_BATCHES: list[Any] = [
    {"node_id": "n", "model": "m", "samples": [[T, 5], [T + 1, 6.5]]},
    {"node_id": "n", "model": "m", "hardware": "A10", "ok": False, "probe": True,
     "samples": [[T, 5, 10, 3, 2.0], [T, 7, None, None, None]]},
    {"node_id": "n", "model": "m", "samples": [[T, 5], [T, -1], [T, 1e300]]},
    {"node_id": "n", "model": "m", "samples": [[T, 5], [T, True]]},
    {"node_id": "n", "model": "m", "samples": [[T, 5], [T, "6"]]},
    {"node_id": "n", "model": "m", "samples": [[T, 5], [T, 6, 1, 2, 3]]},
    {"node_id": "n", "model": "m", "samples": [[T, 5, 1.5, 2, 3]]},
    {"node_id": "n", "model": "m", "samples": [[T, 5, 1, 2, 9]]},
    {"node_id": "n", "model": "m", "samples": [[T, -5]]},
    {"node_id": "n", "model": "m", "samples": []},
    {"node_id": "", "model": "m", "samples": [[T, 5]]},
    {"node_id": "n", "model": "m", "hardware": None, "ok": None, "samples": [[T, 5]]},
    {"node_id": "n", "model": "m", "type": "heartbeat", "extra": {"x": 1}, "samples": [[T, 5]]},
    {"node_id": "n" * 300, "model": "m", "samples": [[T, 5]]},
    {"node_id": "n", "model": "m", "samples": [[T + 99_999, 5]]},
]


def _outcome(raw: bytes) -> Any:
    try:
        ev = decode(raw, now_s=T + 10)
    except BadEvent as e:
        return (e.reason, str(e))
    assert isinstance(ev, SampleBatch)
    return fields(ev)


@pytest.mark.parametrize("doc", JSON_BATCHES)
def test_the_typed_json_path_gives_what_the_general_path_gives(
        doc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = orjson.dumps(doc)
    assert events.FAST_DECODER is not None, "msgspec is a declared dependency"
    fast = _outcome(raw)
    acc = Accumulator(now_s=T + 10)
    try:
        acc.add(raw)
        via_acc: Any = [fields(e) for e in acc.drain() if isinstance(e, SampleBatch)]
    except BadEvent as e:
        via_acc = (e.reason, str(e))
    monkeypatch.setattr(events, "FAST_DECODER", None)
    general = _outcome(raw)
    assert fast == general
    assert via_acc == ([general] if isinstance(general, dict) else general)


SINGLES: list[Any] = [
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T},
    {"node_id": "n", "model": "m", "latency_us": 5.5, "ts": T, "hardware": "A10", "ok": False},
    {"node_id": "n", "model": "m", "latency_us": 5.5, "ts": T, "probe": True, "request_id": "x"},
    {"node_id": "n", "model": "m", "latency_us": 9, "ts": T, "input_tokens": 3, "output_tokens": 4.0,
     "ttft_us": 2},
    {"node_id": "n", "model": "m", "latency_us": 9, "ts": T, "ttft_us": 10},
    {"node_id": "n", "model": "m", "latency_us": 9, "ts": T, "input_tokens": 2.5},
    {"node_id": "n", "model": "m", "latency_us": 9, "ts": T, "input_tokens": -1},
    {"node_id": "n", "model": "m", "latency_us": 0, "ts": T},
    {"node_id": "n", "model": "m", "latency_us": True, "ts": T},
    {"node_id": "n", "model": "m", "latency_us": "5", "ts": T},
    {"node_id": "n", "model": "m", "latency_us": 4e9, "ts": T},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T + 3600},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": 1764680000000.0},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": -1},
    {"node_id": "n", "model": "m", "latency_us": 5},
    {"node_id": "", "model": "m", "latency_us": 5, "ts": T},
    {"node_id": "é" * 256, "model": "m", "latency_us": 5, "ts": T},
    {"node_id": "é" * 257, "model": "m", "latency_us": 5, "ts": T},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "hardware": "h" * 257},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "ok": None, "hardware": None},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "ok": 1},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "type": "single"},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "type": None},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "type": "heartbeat"},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "type": "other"},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "sam\u0070les": [[T, 5]]},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "instance": "pid-2"},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "instance": "i" * 257},
    {"node_id": "n", "model": "m", "latency_us": 5, "ts": T, "instance": 7},
    [1, 2],
]


def _acc_outcome(lines: list[bytes]) -> Any:
    acc = Accumulator(now_s=T + 10)
    got: list[Any] = []
    for raw in lines:
        try:
            got.append(acc.add(raw))
        except BadEvent as e:
            got.append((e.reason, str(e)))
    drained = [fields(e) if isinstance(e, SampleBatch) else e for e in acc.drain()]
    return got, sorted(drained, key=repr)    # the order between series is not kept


@pytest.mark.parametrize("doc", SINGLES)
def test_the_typed_single_path_gives_what_the_general_path_gives(
        doc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = orjson.dumps({"node_id": "n", "model": "m", "latency_us": 1, "ts": T - 1})
    lines = [plain, orjson.dumps(doc), plain]     # around a plain series' pending samples
    assert events.FAST_DECODER is not None, "msgspec is a declared dependency"
    fast = _acc_outcome(lines)
    monkeypatch.setattr(events, "FAST_DECODER", None)
    assert fast == _acc_outcome(lines)


@pytest.mark.parametrize("doc", SINGLES)
def test_many_lines_at_once_add_what_add_adds_line_by_line(doc: Any) -> None:
    plain = orjson.dumps({"node_id": "n", "model": "m", "latency_us": 1, "ts": T - 1})
    other = orjson.dumps({"node_id": "o", "model": "m", "latency_us": 2, "ts": T - 1, "probe": True})
    lines = [plain, other, orjson.dumps(doc), plain, b"{", other, plain]
    acc = Accumulator(now_s=T + 10)
    decoded = acc.decode_lines(lines)
    assert decoded is not None
    got: list[Any] = []
    i = 0
    while i < len(lines):        # runs at once, add() for each line the run stops at
        j, latest = acc.add_decoded(decoded, i, len(lines), math.inf)
        assert latest == max((decoded[x].ts for x in range(i, j)), default=-math.inf)
        got += [None] * (j - i)
        if j < len(lines):
            try:
                got.append(acc.add(lines[j]))
            except BadEvent as e:
                got.append((e.reason, str(e)))
        i = j + 1
    drained = [fields(e) if isinstance(e, SampleBatch) else e for e in acc.drain()]
    ref, ref_drained = _acc_outcome(lines)
    assert sorted(drained, key=repr) == ref_drained
    # taken at once: the lines add() takes by the typed path; the others give what add() gives
    assert [r for r, g in zip(ref, got, strict=True) if g is not None] == [g for g in got if g is not None]
    taken = [g is None for g in got]
    fast = events.FAST_DECODER
    assert fast is not None
    e = fast.single(lines[2], T + 10, 1e9)
    rule = ids.DEFAULT_RULE
    assert taken == [True, True, e is not None and rule.ok(e.node_id) and rule.ok(e.model),
                     True, False, True, True]


def test_consecutive_batches_of_a_series_come_out_as_one_with_their_message_sizes() -> None:
    acc = Accumulator(now_s=T + 10)
    acc.add(_bin())
    acc.add(orjson.dumps({"node_id": "n", "model": "m", "samples": [[T + 2, 7], [T, -1]]}))
    acc.add(binary.encode("n", "m", None, np.array([T + 3]), np.array([8.0]),
                          output_tokens=np.array([4.0])))
    acc.add(binary.encode("other", "m", None, np.array([T]), np.array([1.0])))
    acc.add(binary.encode("n", "m", None, np.array([T + 3]), np.array([9.0]), instance="new"))
    acc.add(orjson.dumps({"type": "heartbeat", "node_id": "n", "model": "m", "ts": T + 4}))
    acc.add(_bin(probe=True))
    out = acc.drain()
    got = [(type(e).__name__, e.node_id, e.instance,
            e.ts.tolist() if isinstance(e, SampleBatch) else e.ts) for e in out]
    assert got == [("SampleBatch", "n", None, [T, T + 1, T + 2, T + 3]),
                   ("SampleBatch", "other", None, [T]), ("SampleBatch", "n", "new", [T + 3]),
                   ("Heartbeat", "n", None, T + 4), ("SampleBatch", "n", None, [T, T + 1])]
    merged = out[0]
    assert isinstance(merged, SampleBatch) and merged.parts == (2, 1, 1)
    assert merged.latency_us.tolist() == [5.0, 6.0, 7.0, 8.0] and merged.rejected == 1
    assert merged.output_tokens is not None and merged.output_tokens.tolist()[3] == 4.0
    assert all(math.isnan(v) for v in merged.output_tokens.tolist()[:3])
    assert merged.input_tokens is None and not merged.probe.any()
    assert isinstance(out[4], SampleBatch) and out[4].probe.all() and out[4].parts == ()


def test_a_joined_batch_leaves_the_window_store_as_its_messages_one_by_one() -> None:
    from tailguard.core.contract.config import DetectorSettings
    from tailguard.core.window.window import WindowStore

    settings = DetectorSettings(restart_gap_s=5.0, window_size=100, min_samples=1)
    rng = np.random.default_rng(3)
    messages = []
    t = T
    for i in range(40):          # steady traffic, a long gap, traffic again: a restart
        t += 60.0 if i == 25 else 0.5
        n = int(rng.integers(1, 8))
        ok = bool(i % 7)
        messages.append(binary.encode("n", "m", "A100", t + np.arange(n) * 0.01,
                                      rng.lognormal(8, 0.3, n), ok=ok, instance="p1"))
    one, joined = WindowStore(settings), WindowStore(settings)
    for raw in messages:
        ev = decode(raw)
        assert isinstance(ev, SampleBatch)
        one.observe(ev)
    acc = Accumulator()
    for raw in messages:
        acc.add(raw)
    drained = acc.drain()
    assert len(drained) < len(messages)
    for ev in drained:
        assert isinstance(ev, SampleBatch)
        joined.observe(ev)
    # The same content; not always the same place in the ring's slots or time base (a batch
    # that fills the ring starts it at slot 0, with a base of its own).
    placed = ("base_us", "head", "cap")
    assert [{k: v for k, v in x.items() if k not in placed} for x in joined.snapshot()["series"]] == [
        {k: v for k, v in x.items() if k not in placed} for x in one.snapshot()["series"]]
    assert joined.summaries(t + 1) == one.summaries(t + 1)
    assert one.summaries(t + 1)[0].resumed_ts is not None


def test_the_fast_paths_take_the_well_formed_shapes() -> None:
    """The comparisons above mean something only if the fast paths are taken."""
    fast = events.FAST_DECODER
    assert fast is not None
    single = orjson.dumps({"node_id": "n", "model": "m", "latency_us": 5.0, "ts": T})
    got = fast.single(single, T + 10, 1e9)
    assert got is not None and (got.node_id, got.model, got.ts, got.latency_us) == ("n", "m", T, 5.0)
    assert fast.is_plain(got)
    sized = orjson.dumps({"node_id": "n", "model": "m", "latency_us": 5.0, "ts": T, "probe": True})
    probe = fast.single(sized, T + 10, 1e9)
    assert probe is not None and not fast.is_plain(probe) and fast.row(probe)[:4] == (T, 5.0, True, True)
    for samples in ([[T, 5.0], [T + 1, 6.0]], [[T, 5.0, 1, None, 2.0]]):
        b = fast.batch(orjson.dumps({"node_id": "n", "model": "m", "samples": samples}))
        assert b is not None and b[1].shape == (len(samples[0]), len(samples))
    assert fast.single(b"[1, 2]", T, 1e9) is None and fast.batch(b'{"samples": 3}') is None
