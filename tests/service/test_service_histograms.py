"""Histogram events through the worker's code: stage-1 ingestion (fake consumer and sink), the
summary's wire form, and stage 2's evaluator — a 3x slower scraped node leaves, a bad histogram
event is dead-lettered with its reason and the good ones around it are kept."""

from __future__ import annotations

import json

import numpy as np
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry
from stream_fakes import Rec
from test_service_ingest import FakeConsumer, FakeSink

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.hist_rules import windows_of
from tailguard.core.window.window import WindowStore
from tailguard.settings import Settings
from tailguard.streaming.ingest import IngestService
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.wire import decode_stage2, encode_summary

T0 = 1_764_680_000.0
DET = DetectorSettings()
BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0]
TOPIC = "latency-events"


def hist_event(node: str, ts: float, rng: np.random.Generator, factor: float = 1.0) -> bytes:
    lat = 0.18 * factor * np.exp(rng.normal(0, 0.3, 200))
    counts = np.bincount(np.searchsorted(BOUNDS, lat), minlength=len(BOUNDS) + 1).tolist()
    return json.dumps({"type": "histogram", "node_id": node, "model": "llama", "hardware": "A100",
                       "metric": "e2e", "ts": ts, "interval_s": 10.0, "bounds_s": BOUNDS,
                       "counts": counts, "sum_s": float(lat.sum()), "requests": 200, "failed": 0,
                       "instance": node}).encode()


async def test_scraped_fleet_through_stage1_the_wire_and_stage2() -> None:
    rng = np.random.default_rng(7)
    now = [T0]
    svc = IngestService(settings=Settings(app_id="t", topics=Settings().topics),
                        stage1=Stage1(WindowStore(DET), DET), sink=(sink := FakeSink()),
                        metrics=WorkerMetrics(CollectorRegistry()), clock=lambda: now[0])
    tp = TopicPartition(TOPIC, 0)
    polls: list[dict[TopicPartition, list[Rec]]] = []
    svc._consumer = FakeConsumer(polls, owned={tp})
    ev = FleetEvaluator(DET)
    out_at = None
    offset = 0
    for k in range(1, 61):
        ts = T0 + 10 * k
        recs = [Rec(hist_event(f"vllm-{i}", ts, rng, 3.0 if i == 2 and k > 30 else 1.0), offset=offset + i)
                for i in range(6)]
        if k == 5:    # a bad one in the middle of the poll: dead-lettered, the others kept
            recs.insert(3, Rec(json.dumps({"type": "histogram", "node_id": "vllm-9", "model": "llama",
                                           "metric": "e2e", "ts": ts, "interval_s": 10.0,
                                           "bounds_s": [0.5, 0.3], "counts": [1, 2, 3]}).encode(),
                               offset=offset + 99))
        offset += 100
        polls.append({tp: recs})
        now[0] = ts
        await svc.poll_once()
        if k % 3:
            continue
        sink.summaries.clear()
        await svc.tick()
        summaries = [decode_stage2(encode_summary(s)) for s in sink.summaries]   # over Kafka
        assert all(isinstance(s, WindowSummary) and windows_of(s) for s in summaries)
        tick = ev.evaluate("llama", [s for s in summaries if isinstance(s, WindowSummary)], ts)
        for t in tick.transitions:
            assert t.node_id == "vllm-2" or t.reason in ("first_seen", "admitted"), t
            if t.node_id == "vllm-2" and not t.routed and t.to_state == "unhealthy" and out_at is None:
                out_at = ts
                assert (t.signal == "e2e_hist" and "above" in (t.detail or "")) or t.reason == "relative_p50"
    assert [(d.offset, d.reason) for d in sink.dead] == [(499, "bad_histogram")]
    assert out_at is not None and out_at - (T0 + 300) <= 120
