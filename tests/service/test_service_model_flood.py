"""Floods of model names: stage 1 holds at most ``max_models`` models (new ones dropped and
counted, never a held one's samples), releases a model when its series are forgotten, and
stage 2 judges at most ``max_models`` models."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, batch, single, summary
from test_service_flood import value

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import WindowStore
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.stage2 import Stage2

NOW = 3_000_000.0
DET = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0, tick_interval_s=2.0,
                       max_models=5, forget_after_s=60.0)


def make(det: DetectorSettings = DET) -> tuple[Stage1, WorkerMetrics]:
    m = WorkerMetrics(CollectorRegistry())
    return Stage1(WindowStore(det), det, m), m


def real(ts: float = NOW - 1) -> list[Rec]:
    return [Rec(batch(f"real-{i}", "llm", [1000.0] * 20, ts)) for i in range(3)]


def model_flood(first: int, n: int, ts: float = NOW - 1) -> list[Rec]:
    return [Rec(single("node", f"model-{i:06d}", 500.0, ts), key=f"node|model-{i:06d}".encode())
            for i in range(first, first + n)]


def test_new_models_over_max_models_are_dropped_counted_and_logged_once_per_tick(
        caplog: pytest.LogCaptureFixture) -> None:
    s1, m = make()
    s1.ingest(0, real(), NOW)
    caplog.set_level(logging.WARNING, logger="tailguard.streaming.stage1")
    for k in range(3):                           # 3 polls of one tick, the real model in each
        assert s1.ingest(0, model_flood(k * 1000, 1000) + real(), NOW) == []
    assert sorted(s1.store.models()) == ["llm"] + [f"model-{i:06d}" for i in range(4)]
    assert value(m, "tailguard_samples_dropped_total", reason="model_limit") == 3000 - 4
    assert not caplog.records
    sums = s1.summaries(NOW + 2)
    assert len(caplog.records) == 1 and "max_models" in caplog.text
    assert "2996 messages (2996 samples or heartbeats) of further models" in caplog.text
    assert "'model-000004', 'model-000005'" in caplog.text      # the first few are named
    # The held model lost nothing: all 4 polls' samples are in its windows.
    assert [s.samples for s in sums if s.model == "llm"] == [80, 80, 80]
    # New nodes of a held model are not refused by the model limit.
    s1.ingest(0, [Rec(single("real-new", "llm", 900.0, NOW + 1))], NOW + 2)
    assert ("real-new", "llm") in s1.store      # type: ignore[operator]


def test_a_forgotten_model_frees_its_place() -> None:
    s1, m = make()
    s1.ingest(0, model_flood(0, 5, ts=NOW - 100), NOW)
    assert len(s1.store.models()) == 5
    s1.ingest(0, real(), NOW)
    assert "llm" not in s1.store.models()
    assert value(m, "tailguard_samples_dropped_total", reason="model_limit") == 3 * 20
    assert s1.forget_silent(NOW) == 5              # the flood's models fell silent 100 s ago
    s1.summaries(NOW)
    s1.ingest(0, real(), NOW)
    assert s1.store.models() == ["llm"]


def test_zero_turns_the_model_limit_off() -> None:
    s1, m = make(DET.replace(max_models=0))
    s1.ingest(0, model_flood(0, 300), NOW)
    assert len(s1.store.models()) == 300
    assert value(m, "tailguard_samples_dropped_total", reason="model_limit") == 0


def test_stage2_judges_at_most_max_models_models() -> None:
    s2 = Stage2(FleetEvaluator(DET), {}, stale_after_s=3.0)
    for k in range(8):
        s2.on_summary(summary("n0", f"m{k}", 1000.0, 1000.0, 1500.0))
    outs = s2.tick(1000.5, lambda m: True)
    assert sorted(o.tick.model for o in outs) == [f"m{k}" for k in range(5)]
    assert s2.dropped.get("model_limit") == 3
    # a model already judged keeps being judged
    for k in range(8):
        s2.on_summary(summary("n0", f"m{k}", 1002.0, 1000.0, 1500.0))
    outs = s2.tick(1002.5, lambda m: True)
    assert sorted(o.tick.model for o in outs) == [f"m{k}" for k in range(5)]


def test_stage2_forgets_a_model_with_no_pair_left_and_frees_its_place() -> None:
    det = DET.replace(max_models=2, restart_gap_s=2.0, silent_after_s=10.0, forget_after_s=30.0)
    state: dict[bytes, object] = {}
    hints: dict[bytes, object] = {}
    s2 = Stage2(FleetEvaluator(det), state, stale_after_s=3.0, hints=hints)
    # one event of a flood's model: never admitted (too few samples), gone when silent
    s2.on_summary(summary("n0", "flood-1", 1000.0, 1000.0, 1500.0, samples=1))
    s2.on_summary(summary("n0", "llm", 1000.0, 1000.0, 1500.0))
    assert {o.tick.model for o in s2.tick(1000.5, lambda m: True)} == {"flood-1", "llm"}
    assert set(state) == {b"flood-1", b"llm"}
    t = 1000.0
    forgotten = []
    while t < 1200.0 and not forgotten:     # llm keeps reporting; flood-1 fell silent
        t += 2.0
        s2.on_summary(summary("n0", "llm", t, 1000.0, 1500.0))
        outs = s2.tick(t + 0.5, lambda m: True)
        forgotten = [o.tick for o in outs if o.tick.forgotten]
    (gone,) = forgotten
    assert gone.model == "flood-1" and not gone.statuses and not gone.routing
    assert t - 1000.0 >= 30.0               # silent for forget_after_s
    assert set(state) == {b"llm"} and b"flood-1" not in hints
    # flood-1 is no longer ticked, and its place is free for another model
    s2.on_summary(summary("n0", "other", t + 2, 1000.0, 1500.0))
    s2.on_summary(summary("n0", "llm", t + 2, 1000.0, 1500.0))
    assert {o.tick.model for o in s2.tick(t + 2.5, lambda m: True)} == {"llm", "other"}


def test_stage2_never_forgets_a_model_with_a_routed_node_whatever_the_silence() -> None:
    det = DET.replace(restart_gap_s=2.0, silent_after_s=10.0, forget_after_s=30.0)
    s2 = Stage2(FleetEvaluator(det), {}, stale_after_s=3.0)
    s2.on_summary(summary("n0", "llm", 1000.0, 1000.0, 1500.0))
    s2.tick(1000.5, lambda m: True)
    # stage 1 lags (or the telemetry is lost) for far longer than forget_after_s
    outs = [o for t in range(1002, 1300, 2) for o in s2.tick(t + 0.5, lambda m: True)]
    assert not any(o.tick.forgotten for o in outs)
    assert outs[-1].tick.routing == {"n0"}
