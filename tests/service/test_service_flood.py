"""Floods of new node ids: stage 1's admission limit, known series first, the send budget,
memory given back, and stage 2 counting every summary it does not evaluate."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, batch, single, summary

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import WindowStore
from tailguard.settings import Settings
from tailguard.streaming import ingest
from tailguard.streaming.ingest import IngestService
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.stage2 import Stage2

NOW = 3_000_000.0
DET = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0, tick_interval_s=2.0,
                       max_new_pairs_per_tick=50)


def make(det: DetectorSettings = DET) -> tuple[Stage1, WorkerMetrics]:
    m = WorkerMetrics(CollectorRegistry())
    return Stage1(WindowStore(det), det, m), m


def value(m: WorkerMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def flood(first: int, n: int, model: str = "m", ts: float = NOW - 1) -> list[Rec]:
    return [Rec(single(f"flood-{i:06d}", model, 500.0, ts), offset=i)
            for i in range(first, first + n)]


def real(model: str = "m", ts: float = NOW - 1) -> list[Rec]:
    return [Rec(batch(f"real-{i}", model, [1000.0] * 20, ts)) for i in range(6)]


def test_new_pairs_over_the_limit_are_dropped_counted_and_logged_once_per_tick(
        caplog: pytest.LogCaptureFixture) -> None:
    s1, m = make()
    s1.ingest(0, real(), NOW)
    s1.summaries(NOW)                                   # a tick: the real series are known
    caplog.set_level(logging.WARNING, logger="tailguard.streaming.stage1")
    for k in range(4):                                  # 4 polls of one tick
        assert s1.ingest(0, flood(k * 1000, 1000) + real(), NOW) == []   # never dead-lettered
    assert s1.store.series_count() == 6 + 50
    assert value(m, "tailguard_samples_dropped_total", reason="new_pair_limit") == 4000 - 50
    assert value(m, "tailguard_samples_in_total") == 6 * 20 * 5 + 50
    assert not caplog.records                           # no line per dropped record
    sums = s1.summaries(NOW + 2)
    assert len(caplog.records) == 1
    assert "'m': 50 new (node, model) pairs" in caplog.text and "3950 more messages" in caplog.text
    # The admitted ones are the first 50 seen; the real series kept every sample.
    assert {s.node_id for s in sums} == {f"real-{i}" for i in range(6)} | {
        f"flood-{i:06d}" for i in range(50)}
    assert all(s.samples == 100 for s in sums if s.node_id.startswith("real"))
    # The next tick admits 50 more; a quiet tick logs nothing.
    s1.ingest(0, flood(4000, 60), NOW + 2)
    assert s1.store.series_count() == 6 + 100
    caplog.clear()
    s1.summaries(NOW + 4)
    s1.summaries(NOW + 6)
    assert len(caplog.records) == 1 and "10 more messages" in caplog.text


def test_the_limit_is_per_model_and_counts_heartbeats_and_zero_turns_it_off() -> None:
    s1, m = make()
    s1.ingest(0, flood(0, 80, "a") + flood(0, 80, "b"), NOW)
    hb = [Rec(b'{"type": "heartbeat", "node_id": "hb-%d", "model": "a", "ts": %f}' % (i, NOW - 1))
          for i in range(5)]
    s1.ingest(0, hb, NOW)
    assert sorted(s.model for s in s1.summaries(NOW)).count("a") == 50
    assert s1.store.series_count() == 100
    assert value(m, "tailguard_samples_dropped_total", reason="new_pair_limit") == 30 + 30 + 5
    off, m_off = make(DET.replace(max_new_pairs_per_tick=0))
    off.ingest(0, flood(0, 3000), NOW)
    assert off.store.series_count() == 3000
    assert value(m_off, "tailguard_samples_dropped_total", reason="new_pair_limit") == 0


def test_summaries_list_known_series_before_new_ones() -> None:
    s1, _ = make(DET.replace(max_new_pairs_per_tick=0))
    s1.ingest(0, [Rec(single(f"zz-real-{i}", "m", 900.0, NOW - 1)) for i in range(3)], NOW)
    s1.summaries(NOW)
    s1.ingest(0, [*flood(0, 200), Rec(single("zz-real-1", "m", 900.0, NOW - 1))], NOW)
    s1.ingest(1, [Rec(single("aa-late", "m", 900.0, NOW - 1), partition=1)], NOW)
    order = [s.node_id for s in s1.summaries(NOW + 2)]
    assert order[:3] == ["zz-real-0", "zz-real-1", "zz-real-2"]
    assert order[3:] == [f"flood-{i:06d}" for i in range(200)] + ["aa-late"]
    owned = [s.node_id for s in s1.summaries(NOW + 4, owned_partitions={1})]
    assert owned == ["aa-late"]


def test_forgetting_a_flood_gives_the_maps_and_slabs_back() -> None:
    det = DET.replace(max_new_pairs_per_tick=0, forget_after_s=60.0)
    s1, _ = make(det)
    s1.ingest(0, flood(0, 20_000, ts=NOW - 100), NOW - 99)
    s1.ingest(0, real(ts=NOW - 1) + flood(5, 1, ts=NOW - 1), NOW)
    store = s1.store
    assert isinstance(store, WindowStore)
    peak = store.nbytes()
    assert s1.forget_silent(NOW) == 20_000 - 1
    assert s1.store.series_count() == 7
    assert store.nbytes() < peak / 50
    # Admission order survives the rebuilt map (flood-000005 came first).
    assert [s.node_id for s in s1.summaries(NOW)] == ["flood-000005"] + [
        f"real-{i}" for i in range(6)]
    # revoke() compacts too.
    s1.ingest(1, [Rec(single(f"p1-{i}", "m", 5.0, NOW - 1), partition=1)
                  for i in range(5_000)], NOW)
    assert s1.revoke([1]) == 5_000
    assert store.nbytes() < peak / 50


class SlowSink:
    """Every send of summaries advances a fake monotonic clock by ``cost_s``."""

    def __init__(self, clock: list[float], cost_s: float) -> None:
        self.clock, self.cost_s = clock, cost_s
        self.summaries: list[WindowSummary] = []

    async def send_summaries(self, summaries: Sequence[WindowSummary]) -> None:
        self.clock[0] += self.cost_s
        self.summaries.extend(summaries)

    async def send_cluster(self, digests: Sequence[Any]) -> None:
        pass

    async def send_diagnostics(self, results: Sequence[Any]) -> None:
        pass

    async def dead_letter(self, letters: Sequence[Any]) -> None:
        pass


class OwnAll:
    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("latency-events", 0)}


async def test_the_tick_sends_known_series_first_and_drops_what_misses_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mono = [0.0]
    monkeypatch.setattr(ingest.time, "monotonic", lambda: mono[0])
    monkeypatch.setattr(ingest, "SEND_SLICE", 100)
    det = DET.replace(max_new_pairs_per_tick=0)
    s1 = Stage1(WindowStore(det), det)
    s1.ingest(0, real(), NOW)
    s1.summaries(NOW)
    s1.ingest(0, flood(0, 1000), NOW)
    metrics = WorkerMetrics(CollectorRegistry())
    sink = SlowSink(mono, cost_s=0.3)          # budget 0.5 × 2 s: 4 slices go out
    svc = IngestService(settings=Settings(app_id="t", detector=det), stage1=s1, sink=sink,
                        metrics=metrics, clock=lambda: NOW + 2)
    svc._consumer = OwnAll()  # type: ignore[assignment]
    assert await svc.tick() == 400
    assert [s.node_id for s in sink.summaries[:6]] == [f"real-{i}" for i in range(6)]
    assert metrics.registry.get_sample_value(
        "tailguard_summaries_dropped_total", {"reason": "send_deadline"}) == 1006 - 400
    # A tick that starts 0.8 s after its boundary has 0.2 s left: one slice goes out.
    sink.summaries.clear()
    assert await svc.tick(due_s=NOW + 2 - 0.8) == 100
    assert [s.node_id for s in sink.summaries[:6]] == [f"real-{i}" for i in range(6)]


def test_stage2_counts_summaries_of_pairs_it_forgets() -> None:
    det = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0, forget_after_s=60.0)
    s2 = Stage2(FleetEvaluator(det), {}, stale_after_s=3.0)
    for i in range(4):
        s2.on_summary(summary(f"n{i}", "m", 1000.0, 1000.0, 1500.0))
    old = summary("ghost", "m", 1000.0, 1000.0, 1500.0)._replace(last_seen_ts=1000.0 - 600)
    s2.on_summary(old)
    s2.on_summary(summary("late", "m", 990.0, 1000.0, 1500.0))
    (out,) = s2.tick(1000.5, lambda m: True)
    assert {st.node_id for st in out.tick.statuses} == {"n0", "n1", "n2", "n3"}
    assert s2.dropped == {"forgotten": 1, "stale": 1}


def test_once_the_budget_is_used_up_keyed_records_of_new_pairs_are_not_decoded() -> None:
    s1, m = make()
    s1.ingest(0, real(), NOW)
    s1.ingest(0, flood(0, 60), NOW)     # 6 real + 44 flood admitted: the budget is used up
    undecodable = b"{not json"
    recs = [Rec(undecodable, key=b"flood-999999|m"),          # new pair of a full model
            Rec(undecodable, key=b"real-0|m"),                # a known pair: decoded
            Rec(undecodable, key=b"other|m2"),                # another model: decoded
            Rec(undecodable, key=b"\xff|m"),                  # not UTF-8: decoded
            Rec(undecodable, key=b"no-bar")]                  # not node|model: decoded
    dead = s1.ingest(0, recs, NOW)
    assert [d.key for d in dead] == [b"real-0|m", b"other|m2", b"\xff|m", b"no-bar"]
    assert value(m, "tailguard_samples_dropped_total", reason="new_pair_limit") == 16 + 1
    s1.summaries(NOW + 2)                           # a new tick: the budget is back
    s1.ingest(0, [Rec(single("flood-999999", "m", 5.0, NOW + 1), key=b"flood-999999|m")],
              NOW + 2)
    assert ("flood-999999", "m") in s1.store      # type: ignore[operator]
