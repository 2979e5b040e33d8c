"""The fresh P50 of a window summary on the stage-1 → stage-2 wire (``node-window-stats``).

Stage 1 sends ``fresh_samples``/``fresh_p50`` with every summary; stage 2 must get
them back exactly, and a message from an older stage 1 (without them) or with
unusable values must still decode — as a summary without a fresh P50, judged on
its window alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, single

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch, decode
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.replay.detector import Detector
from tailguard.core.window.window import WindowStore
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.wire import decode_stage2, encode_summary

SETTINGS = DetectorSettings()


def _summaries() -> list[WindowSummary]:
    """Six nodes at 20 req/s for 60 s; n05 3x slower for its last 20 s."""
    rng = np.random.default_rng(7)
    store = WindowStore(SETTINGS)
    n = 1200
    ts = np.linspace(0.05, 60.0, n)
    for i in range(6):
        lat = rng.lognormal(np.log(4e6), 1.0, n) * np.where((i == 5) & (ts > 40), 3.0, 1.0)
        store.observe(SampleBatch(f"n{i:02}", "llm", "A100", ts, lat, np.ones(n, bool),
                                  np.zeros(n, bool)))
    return store.summaries(60.0)


def test_fresh_fields_survive_the_wire() -> None:
    sums = _summaries()
    assert all(s.fresh_p50 is not None and 0 < s.fresh_samples < s.samples for s in sums)
    for s in sums:
        got = decode_stage2(encode_summary(s))
        assert got == s
        assert isinstance(got, WindowSummary)
        assert (got.fresh_samples, got.fresh_p50) == (s.fresh_samples, s.fresh_p50)


def test_message_without_fresh_fields_decodes_as_before() -> None:
    for s in _summaries():
        d = json.loads(encode_summary(s))
        del d["fresh_samples"], d["fresh_p50"]
        got = decode_stage2(json.dumps(d).encode())
        assert got == s._replace(fresh_samples=0, fresh_p50=None)


@pytest.mark.parametrize("bad", [
    {"fresh_p50": "fast"}, {"fresh_p50": -3.0}, {"fresh_p50": 0}, {"fresh_p50": True},
    {"fresh_samples": -1}, {"fresh_samples": 2.5}, {"fresh_samples": None},
])
def test_unusable_fresh_values_are_dropped_not_fatal(bad: dict[str, object]) -> None:
    sums = _summaries()
    decoded = []
    for s in sums:
        d = json.loads(encode_summary(s)) | bad
        got = decode_stage2(json.dumps(d).encode())
        assert isinstance(got, WindowSummary)
        assert got == s._replace(fresh_samples=0, fresh_p50=None)
        decoded.append(got)
    # stage 2 judges such summaries on their windows alone (no warm-up: admitted on them at once)
    tick = FleetEvaluator(SETTINGS.replace(warmup_s=0.0)).evaluate("llm", decoded, 60.0)
    assert tick.routing == frozenset(s.node_id for s in sums)


def test_unknown_summary_fields_from_a_newer_stage1_are_ignored() -> None:
    (s, *_) = _summaries()
    d = json.loads(encode_summary(s)) | {"fresh_p99": 1.0e7}
    assert decode_stage2(json.dumps(d).encode()) == s


def test_streaming_stage1_over_the_wire_gives_the_replay_paths_summaries_and_verdicts() -> None:
    """Stage 1 of the worker (Kafka records in, summaries out, encoded for stage 2) and the
    replay path (decoded events into one Detector) agree on every field, fresh P50 included,
    and stage 2 reaches the same verdicts from the decoded messages."""
    rng = np.random.default_rng(8)
    now = 1_000_020.0                                # a tick boundary (multiple of 30 s)
    records: list[Rec] = []
    for i in range(6):
        ts = np.sort(rng.uniform(now - 60.0, now, 1200))
        lat = rng.lognormal(np.log(4e6), 1.0, ts.size) * np.where((i == 5) & (ts > now - 20), 3.0, 1.0)
        records += [Rec(single(f"n{i:02}", "llm", float(x), float(t)), offset=k)
                    for k, (t, x) in enumerate(zip(ts, lat, strict=True))]
    stage1 = Stage1(WindowStore(SETTINGS), SETTINGS, WorkerMetrics(CollectorRegistry()))
    assert stage1.ingest(0, records, now) == []
    wire = [decode_stage2(encode_summary(s)) for s in stage1.summaries(now)]
    det = Detector(SETTINGS)
    det.observe(decode(r.value, now_s=now) for r in records if r.value is not None)
    # The worker's summaries also carry what stage 2 chooses each model's signal from
    # (evidence=True: core/judge/signal_choice); the replay path asked for the same.
    direct = det.store.summaries(now, evidence=True)
    assert wire == direct
    assert {k for s in direct for k in s.extra} >= {"signal_local"}
    slowed = {s.node_id: s for s in direct}["n05"]
    assert slowed.fresh_p50 is not None and slowed.p50 is not None and slowed.fresh_p50 > slowed.p50
    summaries = [s for s in wire if isinstance(s, WindowSummary)]
    streamed = FleetEvaluator(SETTINGS).evaluate("llm", summaries, now)
    replayed = det.evaluate(now).models[0]
    assert streamed.transitions == replayed.transitions
    assert streamed.routing == replayed.routing
