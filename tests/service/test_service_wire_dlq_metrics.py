"""Stage-2 wire format, dead-letter headers, partitioning and metrics."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request

import numpy as np
import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, summary

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.types import HealthState
from tailguard.core.window.quantiles import digest_dict_of_sorted
from tailguard.streaming.deadletter import DeadLetter
from tailguard.streaming.ingest import next_boundary
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.service import stage2_offset_s
from tailguard.streaming.ticker import partition_for
from tailguard.streaming.wire import (
    ClusterDigest,
    DiagnosticsResult,
    decode_stage2,
    encode_cluster,
    encode_diagnostics,
    encode_summary,
    parse_diagnostics_result,
)


def test_summary_round_trip() -> None:
    s = summary("n", "m", 1000.0, 1.5, 9.25, samples=77)
    assert decode_stage2(encode_summary(s)) == s
    counted = s._replace(requests_total=900, failed_total=45)   # the error-rate counters
    assert decode_stage2(encode_summary(counted)) == counted


def test_diagnostics_round_trip() -> None:
    d = DiagnosticsResult("n", "m", recoverable=False, ts=5.0)
    assert decode_stage2(encode_diagnostics(d)) == d


def test_cluster_digest_round_trip() -> None:
    digest = digest_dict_of_sorted(np.sort(np.random.default_rng(1).lognormal(7, 0.3, 500)))
    c = ClusterDigest("m", 1000.5, "host-1-abc", 7, digest)
    assert decode_stage2(encode_cluster(c)) == c


@pytest.mark.parametrize(("patch", "reason"), [
    ({"tick_ts": "soon"}, "bad_type"),
    ({"tick_ts": True}, "bad_type"),
    ({"nodes": -1}, "bad_type"),
    ({"source": ""}, "bad_type"),
    ({"model": None}, "missing_field"),
    ({"digest": [1, 2]}, "bad_digest"),
    ({"digest": {"centroids": "x"}}, "bad_digest"),
])
def test_bad_cluster_digests(patch: dict[str, object], reason: str) -> None:
    good = {"type": "cluster", "model": "m", "tick_ts": 1.0, "source": "s", "nodes": 1,
            "digest": digest_dict_of_sorted(np.arange(1.0, 50.0))}
    with pytest.raises(BadEvent) as e:
        decode_stage2(json.dumps({**good, **patch}).encode())
    assert e.value.reason == reason


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"node_id": "n", "model": "m"}', "bad_diagnostics"),
    (b'{"node_id": "n", "model": "m", "recoverable": "yes"}', "bad_diagnostics"),
    (b'{"node_id": "", "model": "m", "recoverable": true}', "bad_diagnostics"),
    (b'{"model": "m", "recoverable": true}', "missing_field"),
    (b"[1]", "not_object"),
    (b"\xff", "bad_json"),
    (None, "empty_message"),
])
def test_bad_diagnostics_results(raw: bytes | None, reason: str) -> None:
    with pytest.raises(BadEvent) as e:
        parse_diagnostics_result(raw)
    assert e.value.reason == reason


@given(st.binary(max_size=200))
def test_stage2_decoder_raises_only_bad_event(raw: bytes) -> None:
    with contextlib.suppress(BadEvent):
        decode_stage2(raw)


def test_dead_letter_headers_keep_original_and_add_coordinates() -> None:
    rec = Rec(b"junk", offset=42, partition=3, topic="le", key=b"k",
              headers=(("trace", b"1"), ("tailguard.reason", b"old")))
    d = DeadLetter.of(rec, "bad_json", "not valid JSON")
    h = dict(d.out_headers())
    assert h["trace"] == b"1"
    assert h["tailguard.reason"] == b"bad_json"
    assert (h["tailguard.topic"], h["tailguard.partition"], h["tailguard.offset"]) == \
        (b"le", b"3", b"42")
    assert [k for k, _ in d.out_headers()].count("tailguard.reason") == 1


def test_dead_letters_are_logged_at_powers_of_two_of_their_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    d = DeadLetter.of(Rec(b"junk", offset=7), "bad_json", "not valid JSON")
    with caplog.at_level("WARNING", logger="tailguard.streaming.deadletter"):
        for nth in range(1, 301):
            d.log(nth)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 9                                  # 1, 2, 4, …, 256
    assert logged[0].endswith("sent to the dead-letter topic")
    assert logged[-1].endswith("(256 with this reason so far; logged at powers of 2)")


@given(st.binary(min_size=1, max_size=64), st.integers(1, 64))
def test_partition_for_matches_kafka_default_partitioner(key: bytes, n: int) -> None:
    parts = list(range(n))
    assert partition_for(key, n) == DefaultPartitioner()(key, parts, parts)


@given(st.floats(0, 1e10), st.sampled_from([1.0, 2.0, 30.0]), st.floats(0, 0.9))
def test_next_boundary(now: float, interval: float, frac: float) -> None:
    offset = frac * interval
    b = next_boundary(now, interval, offset)
    assert now < b <= now + interval + 1e-6
    assert abs(((b - offset) / interval) - round((b - offset) / interval)) < 1e-6


def test_stage2_runs_after_stage1() -> None:
    assert stage2_offset_s(2.0) == 1.0
    assert stage2_offset_s(30.0) == 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_on_a_fresh_registry_and_endpoint() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.write_failed("llama", ConnectionError("down"))
    m.model_rejected("mistral", ValueError("WRONGTYPE"))
    m.set_node_states("llama", {HealthState.HEALTHY: 3, HealthState.QUARANTINED: 1})
    m.tick_seconds.observe(0.003)
    m.set_cluster_latency("llama", 812.5, 2048.0)
    m.set_cluster_latency("gone", 1.0, 2.0)
    m.forget_model("gone")
    port = _free_port()
    m.serve(port, addr="127.0.0.1")
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        m.close()
    assert 'tailguard_redis_write_failures_total{model="llama"} 1.0' in body
    assert 'tailguard_redis_model_rejections_total{model="mistral"} 1.0' in body
    assert 'tailguard_nodes{model="llama",state="quarantined"} 1.0' in body
    assert 'tailguard_nodes{model="llama",state="retired"} 0.0' in body
    assert "tailguard_evaluation_seconds_count 1.0" in body
    assert 'tailguard_cluster_latency_us{model="llama",quantile="0.99"} 2048.0' in body
    assert 'model="gone"' not in body
    # A second registry is independent (no global state).
    assert WorkerMetrics(CollectorRegistry()).registry.get_sample_value(
        "tailguard_redis_write_failures_total", {"model": "llama"}) is None
