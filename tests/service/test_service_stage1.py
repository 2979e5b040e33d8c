"""Stage 1 (windows + dead letters) against the real WindowStore, no Kafka."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, batch, llm_batch, single

from tailguard.core.contract import binary
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.window.window import WindowStore
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1

NOW = 1_000_000.0
SETTINGS = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0)


def make() -> tuple[Stage1, WorkerMetrics]:
    m = WorkerMetrics(CollectorRegistry())
    return Stage1(WindowStore(SETTINGS), SETTINGS, m), m


def value(m: WorkerMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_good_and_bad_records_in_one_poll() -> None:
    s1, m = make()
    recs = [Rec(single("n1", "m", 1000.0 + i, NOW - 1), offset=i) for i in range(20)]
    recs.insert(5, Rec(b"{not json", offset=100, partition=3, key=b"n1|m"))
    recs.insert(9, Rec(single("n1", "m", -5.0, NOW - 1), offset=101))
    recs.append(Rec(None, offset=102))
    recs.append(Rec(batch("n2", "m", [2000.0] * 30, NOW - 1), offset=103))
    dead = s1.ingest(0, recs, NOW)
    assert [(d.offset, d.reason) for d in dead] == [
        (100, "bad_json"), (101, "bad_latency"), (102, "empty_message")]
    assert dead[0].partition == 3 and dead[0].key == b"n1|m" and dead[0].value == b"{not json"
    sums = {s.node_id: s for s in s1.summaries(NOW)}
    assert sums["n1"].samples == 20 and sums["n2"].samples == 30
    assert sums["n1"].latency_p50_us == np.median([1000.0 + i for i in range(20)])
    assert value(m, "tailguard_events_in_total") == len(recs)
    assert value(m, "tailguard_samples_in_total") == 50
    assert value(m, "tailguard_bad_events_total", topic="latency-events", reason="bad_json") == 1
    assert value(m, "tailguard_series_tracked") == 2


def test_heartbeat_makes_series_known() -> None:
    s1, _ = make()
    hb = b'{"type": "heartbeat", "node_id": "idle", "model": "m", "ts": %f}' % (NOW - 1)
    assert s1.ingest(0, [Rec(hb)], NOW) == []
    (s,) = s1.summaries(NOW)
    assert (s.node_id, s.samples, s.p50) == ("idle", 0, None)


def test_summaries_only_for_owned_partitions_and_revoke_forgets() -> None:
    s1, _ = make()
    s1.ingest(0, [Rec(single("a", "m", 10.0, NOW - 1))], NOW)
    s1.ingest(1, [Rec(single("b", "m", 10.0, NOW - 1), partition=1)], NOW)
    assert {s.node_id for s in s1.summaries(NOW, owned_partitions={1})} == {"b"}
    assert {s.node_id for s in s1.summaries(NOW, owned_partitions={0, 1})} == {"a", "b"}
    assert s1.revoke([0]) == 1
    assert s1.store.series_count() == 1
    assert {s.node_id for s in s1.summaries(NOW)} == {"b"}


def test_judge_since_hint_restricts_samples() -> None:
    s1, _ = make()
    s1.ingest(0, [Rec(batch("q", "m", [5000.0] * 20, NOW - 50))], NOW)
    s1.ingest(0, [Rec(batch("q", "m", [1000.0] * 12, NOW - 5))], NOW)
    (all_,) = s1.summaries(NOW)
    (hinted,) = s1.summaries(NOW, judge_since={("q", "m"): NOW - 10})
    assert all_.samples == 32
    assert hinted.samples == 12 and hinted.latency_p50_us == 1000.0


def test_future_events_are_dead_lettered() -> None:
    s1, _ = make()
    dead = s1.ingest(0, [Rec(single("n", "m", 10.0, NOW + 3600))], NOW)
    assert [d.reason for d in dead] == ["future_ts"]


def test_out_of_fit_hint_leaves_the_series_out_of_the_normalized_fit() -> None:
    s1, _ = make()
    rng = np.random.default_rng(1)
    for i, node in enumerate(["n0", "n1", "n2", "slow"]):
        s1.ingest(0, [Rec(llm_batch(node, "llm", NOW - 5, rng, us_per_token=90_000.0 if node == "slow"
                                    else 30_000.0), offset=i)], NOW)
    voted = {s.node_id: s for s in s1.summaries(NOW)}
    hinted = {s.node_id: s for s in s1.summaries(NOW, out_of_fit={("slow", "llm")})}
    assert {s.signal for s in voted.values()} == {"normalized"}
    assert voted["n0"].extra["fleet_fit"]["nodes"] == 4
    assert hinted["n0"].extra["fleet_fit"]["nodes"] == 3
    assert hinted["slow"].samples == 100                 # still summarized, only not voting


def test_samples_too_old_to_judge_are_counted_and_reported(caplog: Any) -> None:
    s1, m = make()
    old_ts = NOW - SETTINGS.max_sample_age_s - 60
    recs = [Rec(batch("a", "m", [1000.0] * 30, old_ts), offset=0),
            Rec(single("b", "m", 1000.0, NOW - 1), offset=1),
            Rec(single("b", "m", 1000.0, old_ts), offset=2)]
    with caplog.at_level(logging.WARNING, logger="tailguard.streaming.stage1"):
        assert s1.ingest(0, recs, NOW) == []
        s1.ingest(0, [Rec(single("b", "m", 1000.0, old_ts), offset=3)], NOW + 1)
    assert value(m, "tailguard_late_samples_total") == 32
    assert value(m, "tailguard_samples_in_total") == 33      # kept, not dead-lettered
    (msg,) = [r.getMessage() for r in caplog.records]        # the second poll is not re-reported
    assert "31 of 32 samples" in msg and "TAILGUARD_MAX_SAMPLE_AGE_S" in msg
    assert f"ts {old_ts:.3f}" in msg
    sums = {s.node_id: s for s in s1.summaries(NOW)}
    assert sums["a"].samples == 0 and sums["b"].samples == 1    # never judged
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tailguard.streaming.stage1"):
        s1.ingest(0, [Rec(single("b", "m", 1000.0, NOW + 60), offset=4)], NOW + 61)
    (msg,) = [r.getMessage() for r in caplog.records]        # a minute on: the one held back
    assert "1 of 2 samples" in msg


def test_a_broken_binary_batch_is_dead_lettered_and_the_good_ones_used() -> None:
    s1, m = make()
    good = binary.encode("n1", "m", None, np.array([NOW - 2, NOW - 1]), np.array([5.0, 6.0]))
    dead = s1.ingest(0, [Rec(good[:-3], offset=7), Rec(good, offset=8)], NOW)
    assert [(d.offset, d.reason) for d in dead] == [(7, "bad_binary")]
    assert "header announces" in dead[0].error
    assert value(m, "tailguard_bad_events_total", topic="latency-events", reason="bad_binary") == 1
    (s,) = s1.summaries(NOW)
    assert s.samples == 2 and value(m, "tailguard_samples_in_total") == 2
