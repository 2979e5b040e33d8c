"""Input from any Kafka client: odd values, huge dead letters, codecs, rebalances (no broker)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, single

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.window.window import WindowStore
from tailguard.settings import Settings
from tailguard.streaming import ingest
from tailguard.streaming.deadletter import MAX_OUT_BYTES, DeadLetter
from tailguard.streaming.ingest import IngestService, _Listener, missing_codecs
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1

NOW = 2_000_000.0
DET = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0)


@pytest.mark.parametrize(("value", "reason"), [
    (None, "empty_message"), (b"", "empty_message"), (b"\xff\xfe\x00", "bad_json"),
    (b"[1, 2]", "not_object"), (b"42", "not_object"), (b"null", "not_object"),
    (b'"x"', "not_object"), (b"\xef\xbb\xbf{}", "bad_json"),
])
def test_odd_values_are_dead_lettered_good_ones_kept(value: bytes | None, reason: str) -> None:
    s1 = Stage1(WindowStore(DET), DET)
    recs = [Rec(single("a", "m", 1000.0, NOW), offset=0, key=b"\xff\x00"),
            Rec(value, offset=1, key=None, headers=(("h", b"v"),)),
            Rec(single("b", "m", 1000.0, NOW), offset=2, key=None)]
    dead = s1.ingest(0, recs, NOW)
    assert [(d.offset, d.reason) for d in dead] == [(1, reason)]
    assert dead[0].headers == (("h", b"v"),)
    assert s1.store.series_count() == 2


def test_an_unexpected_parser_error_is_dead_lettered(monkeypatch: pytest.MonkeyPatch) -> None:
    import tailguard.streaming.stage1 as stage1_mod

    class Boom:
        def __init__(self, **_: Any) -> None:
            pass

        def add(self, raw: bytes) -> float:
            raise KeyError("bug")

        def drain(self) -> list[Any]:
            return []
    monkeypatch.setattr(stage1_mod, "Accumulator", Boom)
    dead = Stage1(WindowStore(DET), DET).ingest(0, [Rec(b"{}")], NOW)
    assert [(d.reason, d.error) for d in dead] == [("internal_error", "KeyError: 'bug'")]


def _size(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    return (len(key) if key else 0) + len(value) + sum(len(k) + len(v or b"") for k, v in headers)


def test_small_dead_letters_are_sent_unchanged() -> None:
    d = DeadLetter.of(Rec(b"junk", key=b"k", headers=(("t", b"1"),)), "bad_json", "x")
    key, value, headers = d.out_record()
    assert (key, value) == (b"k", b"junk") and headers == d.out_headers()


@given(st.integers(0, 3_000_000), st.integers(0, 400_000), st.integers(0, 400_000))
def test_dead_letters_fit_the_dead_letter_topic(n_value: int, n_key: int, n_hdr: int) -> None:
    rec = Rec(b"v" * n_value, key=b"k" * n_key, headers=(("big", b"h" * n_hdr), ("nil", None)))  # type: ignore[arg-type]
    key, value, headers = DeadLetter.of(rec, "bad_json", "e" * 5000).out_record()
    assert _size(key, value, headers) <= MAX_OUT_BYTES
    h = dict(headers)
    cut = h.get("tailguard.truncated", b"").decode()
    assert (f"value={n_value}" in cut) == (len(value) < n_value)
    assert (f"key={n_key}" in cut) == (len(key or b"") < n_key)
    assert rec.value is not None and rec.value.startswith(value) and (key is None or rec.key.startswith(key))
    assert h["tailguard.reason"] == b"bad_json"


def test_missing_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_codecs() == []  # cramjam is a dependency
    monkeypatch.setattr(ingest.kafka_codec, "has_lz4", lambda: False)
    assert missing_codecs() == ["lz4"]


class _Consumer:
    def assignment(self) -> set[TopicPartition]:
        return set()

    async def commit(self, offsets: Any) -> None:
        pass


async def test_a_rebalance_keeps_the_windows_of_partitions_assigned_again() -> None:
    settings = Settings(app_id="t", topics=Settings().topics)
    topic = settings.topics.latency_events
    s1 = Stage1(WindowStore(DET), DET)
    svc = IngestService(settings=settings, stage1=s1, sink=None,  # type: ignore[arg-type]
                        metrics=WorkerMetrics(CollectorRegistry()), clock=lambda: NOW)
    svc._consumer = _Consumer()  # type: ignore[assignment]
    for p, node in enumerate(["a", "b", "c"]):
        s1.ingest(p, [Rec(single(node, "m", 1000.0, NOW), partition=p)], NOW)
    svc._next_offsets = {TopicPartition(topic, p): 5 for p in range(3)}
    lst = _Listener(svc)
    await lst.on_partitions_revoked({TopicPartition(topic, p) for p in range(3)})
    assert s1.store.series_count() == 3  # nothing forgotten before the new assignment
    await lst.on_partitions_assigned({TopicPartition(topic, p) for p in (0, 2, 3)})
    assert s1.store.series_count() == 2
    assert {s.node_id for s in s1.summaries(NOW, {0, 2})} == {"a", "c"}
    assert set(svc._next_offsets) == {TopicPartition(topic, 0), TopicPartition(topic, 2)}
