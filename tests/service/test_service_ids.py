"""Hostile ids and the allowlist at stage 1's ingest edge: dead-lettered, counted, the good kept."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry
from stream_fakes import Rec, batch, single
from test_service_ingest import FakeConsumer, FakeSink

from tailguard.core.contract import binary
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.ids import Allowlist
from tailguard.core.window.window import WindowStore
from tailguard.settings import Settings
from tailguard.streaming.ingest import IngestService
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage1 import Stage1

NOW = 2_000_000.0
DET = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0)
TOPIC = "latency-events"


def bad_count(m: WorkerMetrics, reason: str) -> float:
    return m.registry.get_sample_value("tailguard_bad_events_total",
                                       {"topic": TOPIC, "reason": reason}) or 0.0


def test_hostile_ids_are_dead_lettered_and_counted_and_the_good_records_kept() -> None:
    m = WorkerMetrics(CollectorRegistry())
    s1 = Stage1(WindowStore(DET), DET, m)
    hb = b'{"type": "heartbeat", "node_id": "gpu-3", "model": "m\\u0007", "ts": %f}' % (NOW - 1)
    recs = [Rec(single("gpu-1", "m", 5.0, NOW - 1), offset=0),
            Rec(single("ctl\x1b[31m", "m", 5.0, NOW - 1), offset=1),
            Rec(batch("a|b", "m", [5.0] * 20, NOW - 1), offset=2),
            Rec(binary.encode("n" * 10_240, "m", None, np.array([NOW - 1]), np.array([5.0])),
                offset=3),
            Rec(single("nœud-☃", "m", 5.0, NOW - 1), offset=4),
            Rec(hb, offset=5),
            Rec(batch("gpu-2", "meta-llama/Llama-3.1-8B-Instruct", [6.0] * 20, NOW - 1), offset=6)]
    dead = s1.ingest(0, recs, NOW)
    assert [(d.offset, d.reason) for d in dead] == [
        (1, "bad_node_id"), (2, "bad_node_id"), (3, "bad_node_id"), (4, "bad_node_id"),
        (5, "bad_model")]
    assert all(d.error.isprintable() and "id rule" in d.error for d in dead)
    assert dead[2].value == recs[3].value          # the original bytes, unchanged
    assert bad_count(m, "bad_node_id") == 4 and bad_count(m, "bad_model") == 1
    assert {(s.node_id, s.samples) for s in s1.summaries(NOW)} == {
        ("gpu-1", 1), ("gpu-2", 20)}


async def test_the_allowlist_is_loaded_before_consuming_refreshed_and_kept_on_failure(
        monkeypatch: Any) -> None:
    async def no_sleep(s: float) -> None:
        return None
    monkeypatch.setattr("tailguard.streaming.ingest.asyncio.sleep", no_sleep)
    lists: list[Allowlist | Exception] = [ConnectionError("redis down"),
                                          Allowlist(frozenset({"gpu-1"})),
                                          ConnectionError("redis down again"),
                                          Allowlist(frozenset({"gpu-1", "gpu-2"}))]

    async def load() -> Allowlist:
        got = lists.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    m = WorkerMetrics(CollectorRegistry())
    stage1 = Stage1(WindowStore(DET), DET, m)
    svc = IngestService(settings=Settings(app_id="t"), stage1=stage1, sink=FakeSink(),
                        metrics=m, clock=lambda: NOW, allowlist=load)
    assert await svc._refresh_allowlist() is False and stage1.allowlist is None
    assert await svc._refresh_allowlist() is True
    tp = TopicPartition(TOPIC, 0)

    def poll(offset: int) -> dict[TopicPartition, list[Rec]]:
        return {tp: [Rec(single("gpu-1", "m", 5.0, NOW - 1), offset=offset),
                     Rec(single("gpu-2", "m", 5.0, NOW - 1), offset=offset + 1)]}

    sink = FakeSink()
    svc.sink = sink
    svc._consumer = FakeConsumer([poll(0), poll(2), poll(4)])  # type: ignore[assignment]
    assert await svc.poll_once() == 2
    assert [(d.offset, d.reason) for d in sink.dead] == [(1, "not_allowlisted")]
    assert await svc._refresh_allowlist() is False          # a failed read keeps the last list
    assert await svc.poll_once() == 2
    assert [(d.offset, d.reason) for d in sink.dead][1:] == [(3, "not_allowlisted")]
    assert await svc._refresh_allowlist() is True           # gpu-2 registered
    assert await svc.poll_once() == 2
    assert len(sink.dead) == 2
    assert bad_count(m, "not_allowlisted") == 2
    assert {(s.node_id, s.samples) for s in stage1.summaries(NOW)} == {("gpu-1", 3), ("gpu-2", 1)}


def test_allowlist_settings_are_validated_naming_the_variable(tmp_path: Any) -> None:
    from tailguard import settings as app_settings
    from tailguard.core.contract.config import SettingError

    with pytest.raises(SettingError) as e:
        app_settings.load({"TAILGUARD_ALLOWLIST_PATTERN": "gpu-("})
    assert e.value.name == "TAILGUARD_ALLOWLIST_PATTERN"
    with pytest.raises(SettingError) as e:
        app_settings.load({"TAILGUARD_ALLOWLIST_REFRESH_S": "0"})
    assert e.value.name == "TAILGUARD_ALLOWLIST_REFRESH_S"
    s = app_settings.load({"TAILGUARD_ALLOWLIST_FILE": str(tmp_path / "nodes.txt")})
    assert s.allowlist_on and not Settings().allowlist_on


async def test_an_unreadable_allowlist_file_is_an_error_naming_the_setting(tmp_path: Any) -> None:
    from tailguard.streaming import allowlist
    from tailguard.streaming.errors import AllowlistError

    path = tmp_path / "nodes.txt"
    s = Settings(allowlist_file=str(path), allowlist_pattern=r"spare-\d+")
    with pytest.raises(AllowlistError, match="TAILGUARD_ALLOWLIST_FILE"):
        await allowlist.check(s)
    path.write_text("gpu-1\ngpu-2  # rack 4\n\n# retired: gpu-3\n")
    got = await allowlist.check(s)
    assert got is not None and got.ids == {"gpu-1", "gpu-2"} and got.allows("spare-7")
    assert await allowlist.check(Settings()) is None
