"""The stage-1 ingestion service's poll/tick logic with a fake consumer and sink."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, batch, llm_batch, single

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.window.quantiles import digest_quantiles, merge_digests
from tailguard.core.window.window import WindowStore
from tailguard.settings import Settings
from tailguard.streaming.deadletter import DeadLetter
from tailguard.streaming.hints import StageHints
from tailguard.streaming.ingest import IngestService, _Listener
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.wire import ClusterDigest, DiagnosticsResult

NOW = 2_000_000.0
DET = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0)
TOPIC = "latency-events"


@dataclass
class FakeConsumer:
    polls: list[dict[TopicPartition, list[Rec]]]
    owned: set[TopicPartition] = field(default_factory=lambda: {TopicPartition(TOPIC, 0),
                                                                 TopicPartition(TOPIC, 1)})
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Rec]]:
        return self.polls.pop(0) if self.polls else {}

    def assignment(self) -> set[TopicPartition]:
        return self.owned

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def highwater(self, tp: TopicPartition) -> int:
        return 100


@dataclass
class FakeSink:
    fail_dead_letters: int = 0
    summaries: list[WindowSummary] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    cluster: list[ClusterDigest] = field(default_factory=list)
    diagnostics: list[DiagnosticsResult] = field(default_factory=list)
    fail_diagnostics: int = 0

    async def send_summaries(self, summaries: Sequence[WindowSummary]) -> None:
        self.summaries.extend(summaries)

    async def send_cluster(self, digests: Sequence[ClusterDigest]) -> None:
        self.cluster.extend(digests)

    async def send_diagnostics(self, results: Sequence[DiagnosticsResult]) -> None:
        if self.fail_diagnostics:
            self.fail_diagnostics -= 1
            raise ConnectionError("broker down")
        self.diagnostics.extend(results)

    async def dead_letter(self, letters: Sequence[DeadLetter]) -> None:
        if self.fail_dead_letters:
            self.fail_dead_letters -= 1
            raise ConnectionError("broker down")
        self.dead.extend(letters)


def make(polls: list[dict[TopicPartition, list[Rec]]], sink: FakeSink,
         hints: Callable[[], StageHints] | None = None) -> tuple[IngestService, FakeConsumer]:
    settings = Settings(app_id="t", topics=Settings().topics)
    svc = IngestService(settings=settings, stage1=Stage1(WindowStore(DET), DET),
                        sink=sink, metrics=WorkerMetrics(CollectorRegistry()), clock=lambda: NOW,
                        hints=hints)
    consumer = FakeConsumer(polls)
    svc._consumer = consumer
    return svc, consumer


async def test_poll_windows_good_records_and_dead_letters_bad_ones(monkeypatch: Any) -> None:
    sleeps: list[float] = []

    async def no_sleep(s: float) -> None:
        sleeps.append(s)
    monkeypatch.setattr("tailguard.streaming.ingest.asyncio.sleep", no_sleep)
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    poll = {tp0: [Rec(single("a", "m", 5.0, NOW - 1), offset=7), Rec(b"bad", offset=8)],
            tp1: [Rec(batch("b", "m", [9.0] * 12, NOW - 1), offset=3, partition=1)]}
    sink = FakeSink(fail_dead_letters=2)
    svc, consumer = make([poll], sink)
    assert await svc.poll_once() == 3
    assert [(d.offset, d.reason) for d in sink.dead] == [(8, "bad_json")]
    assert len(sleeps) == 2                       # the dead letter was retried, not dropped
    await svc.commit()
    assert consumer.commits[-1] == {tp0: 9, tp1: 4}
    assert await svc.tick() == 2
    assert {s.node_id for s in sink.summaries} == {"a", "b"}


async def test_diagnostics_results_are_forwarded_and_bad_ones_dead_lettered(
        monkeypatch: Any) -> None:
    async def no_sleep(s: float) -> None:
        pass
    monkeypatch.setattr("tailguard.streaming.ingest.asyncio.sleep", no_sleep)
    diag = Settings().topics.diagnostics_results
    tp = TopicPartition(diag, 0)
    poll = {tp: [Rec(b'{"node_id": "n", "model": "m", "recoverable": false}', offset=4,
                     topic=diag),
                 Rec(b'{"node_id": "n", "model": "m", "recoverable": "maybe"}', offset=5,
                     topic=diag),
                 Rec(None, offset=6, topic=diag)],
            TopicPartition(TOPIC, 0): [Rec(single("a", "m", 5.0, NOW - 1), offset=2)]}
    sink = FakeSink(fail_diagnostics=2)
    svc, consumer = make([poll], sink)
    consumer.owned = {tp, TopicPartition(TOPIC, 0)}
    assert await svc.poll_once() == 4
    assert sink.diagnostics == [DiagnosticsResult("n", "m", recoverable=False)]  # retried, kept
    assert [(d.topic, d.offset, d.reason) for d in sink.dead] == [
        (diag, 5, "bad_diagnostics"), (diag, 6, "empty_message")]
    assert list(svc.stage1.store.keys()) == [("a", "m")]
    await svc.commit()
    assert consumer.commits[-1] == {tp: 7, TopicPartition(TOPIC, 0): 3}


async def test_tick_summarizes_only_owned_partitions() -> None:
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    poll = {tp0: [Rec(single("a", "m", 5.0, NOW - 1))],
            tp1: [Rec(single("b", "m", 5.0, NOW - 1), partition=1)]}
    sink = FakeSink()
    svc, consumer = make([poll], sink)
    await svc.poll_once()
    consumer.owned = {tp1}
    assert await svc.tick() == 1
    assert [s.node_id for s in sink.summaries] == ["b"]


async def test_tick_sends_one_cluster_digest_per_model_from_every_held_series() -> None:
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    poll = {tp0: [Rec(batch("a", "m", [100.0] * 30, NOW - 1)),
                  Rec(batch("c", "x", [7.0] * 12, NOW - 1))],
            tp1: [Rec(batch("b", "m", [300.0] * 10, NOW - 1), partition=1)]}
    sink = FakeSink()
    svc, _ = make([poll], sink)
    await svc.poll_once()
    await svc.tick()
    got = {c.model: c for c in sink.cluster}
    assert set(got) == {"m", "x"} and {c.source for c in sink.cluster} == {svc.source}
    assert got["m"].nodes == 2 and got["m"].tick_ts == NOW
    q = digest_quantiles(merge_digests([got["m"].digest]), (0.5, 1.0))
    assert q == [100.0, 300.0] and got["m"].digest["n_values"] == 40
    other, _ = make([], FakeSink())
    assert other.source != svc.source                 # unique per process/service


async def test_tick_passes_stage2_hints_to_the_windows() -> None:
    rng = np.random.default_rng(2)
    tp0 = TopicPartition(TOPIC, 0)
    poll = {tp0: [Rec(llm_batch(n, "llm", NOW - 5, rng), offset=i)
                  for i, n in enumerate(["a", "b", "c", "q"])]}
    current = StageHints()
    sink = FakeSink()
    svc, _ = make([poll], sink, hints=lambda: current)
    await svc.poll_once()
    await svc.tick()
    assert {s.extra["fleet_fit"]["nodes"] for s in sink.summaries} == {4}
    current = StageHints({("q", "llm"): NOW - 1.0}, frozenset({("q", "llm")}))
    sink.summaries.clear()
    await svc.tick()
    got = {s.node_id: s for s in sink.summaries}
    assert got["a"].extra["fleet_fit"]["nodes"] == 3
    assert got["q"].samples == 0 and got["q"].extra["judged_since"] == NOW - 1.0


async def test_tick_forgets_series_silent_for_forget_after_s() -> None:
    tp0 = TopicPartition(TOPIC, 0)
    poll = {tp0: [Rec(batch("gone", "m", [5.0] * 12, NOW - 901.0)),
                  Rec(json.dumps({"type": "heartbeat", "node_id": "idle", "model": "m",
                                  "ts": NOW - 899.0}).encode()),
                  Rec(batch("busy", "m", [5.0] * 12, NOW - 1.0))]}
    sink = FakeSink()
    svc, _ = make([poll], sink)
    await svc.poll_once()
    assert ("gone", "m") in svc.stage1.store
    await svc.tick()
    assert {s.node_id for s in sink.summaries} == {"idle", "busy"}
    assert ("gone", "m") not in svc.stage1.store
    # forget_after_s = 0: kept however long it is silent.
    keep = Stage1(WindowStore(DET.replace(forget_after_s=0.0)), DET.replace(forget_after_s=0.0))
    keep.ingest(0, [Rec(batch("gone", "m", [5.0] * 12, NOW - 5000.0))], NOW - 5000.0)
    assert keep.forget_silent(NOW) == 0 and ("gone", "m") in keep.store


async def test_tick_counts_fresh_samples_above_the_hinted_tail_threshold() -> None:
    rng = np.random.default_rng(4)
    tp0 = TopicPartition(TOPIC, 0)
    poll = {tp0: [Rec(llm_batch(n, "llm", NOW - 5, rng), offset=i) for i, n in enumerate("abc")]}
    sink = FakeSink()
    current = StageHints()
    svc, _ = make([poll], sink, hints=lambda: current)
    await svc.poll_once()
    await svc.tick()
    assert {s.fresh_over for s in sink.summaries} == {None}
    current = StageHints(tail_refs={"llm": 1e-9})      # every sample of any signal is above it
    sink.summaries.clear()
    await svc.tick()
    assert {s.node_id: s.fresh_over for s in sink.summaries} == {
        s.node_id: s.fresh_samples for s in sink.summaries}
    assert all(s.fresh_samples > 0 for s in sink.summaries)


async def test_results_partitions_without_a_committed_offset_start_at_their_end() -> None:
    diag = Settings().topics.diagnostics_results
    fresh, kept = TopicPartition(diag, 0), TopicPartition(diag, 1)

    sought: list[TopicPartition] = []

    class Committed(FakeConsumer):
        async def committed(self, tp: TopicPartition) -> int | None:
            return 17 if tp == kept else None

        async def seek_to_end(self, *tps: TopicPartition) -> None:
            sought.extend(tps)

        async def position(self, tp: TopicPartition) -> int:
            return 40

    svc, _ = make([], FakeSink())
    consumer = Committed([], owned={fresh, kept, TopicPartition(TOPIC, 0)})
    svc._consumer = consumer  # type: ignore[assignment]
    # Every partition the rebalance gives: latency events keep "earliest" (their windows need
    # them); a results partition this group never committed starts at its end (a result from
    # before the group answers no request of it), one it did resumes at the committed offset.
    await _Listener(svc, consumer).on_partitions_assigned({fresh, kept, TopicPartition(TOPIC, 0)})
    assert sought == [fresh]
    await svc.commit()     # the end is committed: results written while it is down are read
    assert consumer.commits[-1] == {fresh: 40}
