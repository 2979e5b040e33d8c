"""The faust agents of the worker, driven with ``agent.test_context()`` (no broker)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from stream_fakes import FakeRouting, summary

from tailguard.settings import Settings
from tailguard.streaming.deadletter import DeadLetter
from tailguard.streaming.service import _FaustSink, create_app, runtime_of
from tailguard.streaming.stage2_intake import Record, send_dead_letters
from tailguard.streaming.summary_batch import SummaryBatch, encode_batches
from tailguard.streaming.wire import DiagnosticsResult, decode_stage2, encode_diagnostics, encode_summary


@pytest.fixture(autouse=True)
def dead_letters(monkeypatch: pytest.MonkeyPatch) -> list[DeadLetter]:
    """What the stage-2 agent sends to the dead-letter topic (no broker here)."""
    sent: list[DeadLetter] = []

    async def dead_letter(self: _FaustSink, letters: Sequence[DeadLetter]) -> None:
        sent.extend(letters)

    monkeypatch.setattr(_FaustSink, "dead_letter", dead_letter)
    return sent


def make_app() -> Any:
    return create_app(Settings(app_id="tgtest-agents", metrics_port=0, web_port=0),
                      writer=FakeRouting(), registry=CollectorRegistry())


async def test_stage2_agent_buffers_summaries_and_diagnostics() -> None:
    app = make_app()
    rt = runtime_of(app)
    agent = app.agents["tailguard-stage2"]
    async with agent.test_context() as ctx:
        await ctx.put(encode_summary(summary("a", "m", 100.0, 1.0, 2.0)), key=b"m")
        await ctx.put(encode_summary(summary("b", "m", 100.0, 1.0, 2.0)), key=b"m")
        await ctx.put(b"garbage", key=b"m")
        await ctx.put(encode_diagnostics(DiagnosticsResult("a", "m", True)), key=b"m")
    assert rt.stage2.pending_summaries() == 2
    assert [d.node_id for d in rt.stage2._diagnostics["m"]] == ["a"]
    assert rt.metrics.registry.get_sample_value(
        "tailguard_bad_events_total",
        {"topic": rt.settings.topics.window_stats, "reason": "bad_json"}) == 1.0


def test_apps_are_independent() -> None:
    a, b = make_app(), make_app()
    assert runtime_of(a).stage2 is not runtime_of(b).stage2
    assert runtime_of(a).metrics.registry is not runtime_of(b).metrics.registry
    assert set(a.agents) == {"tailguard-stage2"}   # diagnostics results: stage 1 reads them


async def test_stage2_agent_unpacks_summary_batches_and_counts_a_corrupt_one() -> None:
    app = make_app()
    rt = runtime_of(app)
    agent = app.agents["tailguard-stage2"]
    rows = [summary(f"n{i}", "m", 100.0, 1.0, 2.0) for i in range(2500)]
    first, second = encode_batches("m", rows)
    async with agent.test_context() as ctx:
        await ctx.put(first, key=b"m")
        await ctx.put(second[:-8], key=b"m")      # cut short: dropped, counted, logged
        await ctx.put(second, key=b"m")           # the stream goes on
        await ctx.put(encode_summary(summary("single", "m", 100.0, 1.0, 2.0)), key=b"m")
    assert rt.stage2.pending_summaries() == 2501
    assert set(rt.stage2._pending["m"]) == {s.node_id for s in rows} | {"single"}
    value = rt.metrics.registry.get_sample_value
    assert value("tailguard_bad_events_total",
                 {"topic": rt.settings.topics.window_stats, "reason": "bad_batch"}) == 1.0
    assert value("tailguard_summaries_in_total") == 2501


async def test_stage2_agent_dead_letters_corrupt_batches_with_their_bytes_and_goes_on(
        dead_letters: list[DeadLetter], caplog: pytest.LogCaptureFixture) -> None:
    app = make_app()
    rt = runtime_of(app)
    agent = app.agents["tailguard-stage2"]
    rows = [summary(f"n{i}", "m", 100.0, 1.0, 2.0) for i in range(10)]
    (good,) = encode_batches("m", rows)
    corrupt = [good[:-8], good[:3] + b"\x09" + good[4:], good[:20] + b"\xff" * 40 + good[60:]]
    with caplog.at_level(logging.WARNING, logger="tailguard.streaming.deadletter"):
        async with agent.test_context() as ctx:
            for raw in corrupt:
                await ctx.put(raw, key=b"m", headers={"trace": b"t1"})
            await ctx.put(good, key=b"m")
            await ctx.put(b"\xf5TS", key=b"m")          # magic only
    assert [d.value for d in dead_letters] == [*corrupt, b"\xf5TS"]
    assert {d.reason for d in dead_letters} == {"bad_batch"}
    assert dead_letters[0].key == b"m" and ("trace", b"t1") in dead_letters[0].headers
    assert [d.offset for d in dead_letters] == sorted({d.offset for d in dead_letters})
    assert rt.stage2.pending_summaries() == 10           # the good batch between them
    value = rt.metrics.registry.get_sample_value
    assert value("tailguard_bad_events_total", {"topic": dead_letters[0].topic,
                                                "reason": "bad_batch"}) == 4.0
    logged = [r for r in caplog.records if "bad_batch" in r.getMessage()]
    assert len(logged) == 1                                # once per reason


async def test_a_message_stage2_cannot_take_is_dead_lettered_not_a_crash(
        dead_letters: list[DeadLetter], monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app()
    rt = runtime_of(app)
    real = rt.stage2.on_message

    def on_message(msg: Any) -> int:
        if getattr(msg, "node_id", None) == "boom":
            raise ValueError("boom")
        return real(msg)

    monkeypatch.setattr(rt.stage2, "on_message", on_message)
    async with app.agents["tailguard-stage2"].test_context() as ctx:
        await ctx.put(encode_summary(summary("boom", "m", 100.0, 1.0, 2.0)), key=b"m")
        await ctx.put(encode_summary(summary("fine", "m", 100.0, 1.0, 2.0)), key=b"m")
    assert [(d.reason, d.error) for d in dead_letters] == [("internal_error", "ValueError: boom")]
    assert set(rt.stage2._pending["m"]) == {"fine"}


class _Msg:
    topic, partition, offset, key, value = "t", 3, 7, b"k", b"v"

    def __init__(self, headers: Any) -> None:
        self.headers = headers


@pytest.mark.parametrize("headers", [[("a", b"1")], {"a": b"1"}])
def test_record_of_a_faust_message_keeps_its_headers_either_form(headers: Any) -> None:
    assert Record.of_message(_Msg(headers)) == Record("t", 3, 7, b"k", b"v", (("a", b"1"),))
    assert Record.of_message(_Msg(None)).headers == ()


async def test_dead_letters_are_retried_until_the_broker_takes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    calls: list[int] = []

    async def send(dead: Sequence[DeadLetter]) -> None:
        calls.append(len(dead))
        if len(calls) < 3:
            raise OSError("broker down")

    letter = DeadLetter("t", 0, 1, None, b"x", (), "bad_batch", "cut")
    await send_dead_letters(send, [letter], lambda: False)
    assert calls == [1, 1, 1]
    calls.clear()
    with pytest.raises(OSError):       # stopping: the error goes up, the records stay unacked
        await send_dead_letters(send, [letter], lambda: True)


async def _no_sleep(_s: float) -> None:
    return None


class _Topic:
    """faust's topic ``send``: records each message, returns a done future."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    async def send(self, *, key: bytes, value: bytes) -> asyncio.Future[None]:
        self.sent.append((key, value))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


async def test_stage1_sends_one_batch_per_model_not_one_message_per_summary() -> None:
    stats = _Topic()

    async def track() -> None:
        return None

    sink = _FaustSink(stats, None, track)
    rows = [summary(f"n{i}", f"m{i % 3}", 100.0, 1.0, 2.0) for i in range(3000)]
    await sink.send_summaries(rows)
    assert [k for k, _ in stats.sent] == [b"m0", b"m1", b"m2"]
    for key, value in stats.sent:
        batch = decode_stage2(value)
        assert isinstance(batch, SummaryBatch) and batch.model == key.decode()
        assert list(batch.summaries) == [s for s in rows if s.model == batch.model]


def test_changelog_records_read_after_the_start_are_applied_as_they_come() -> None:
    # faust buffers 1000 changelog records (decoded) before applying them: a worker then held
    # its last 1000 hints values, a flood's included (each naming ~1,000 new pairs), for as many
    # ticks, which kept ~10 MB of a 200,000-id flood after its ids were forgotten (issue 28).
    app = make_app()
    tables = {t.name: t for t in app.tables.values()}
    hints, health = tables["judge_since"], tables["health"]
    assert hints.recovery_buffer_size == 1      # its own partitions: faust reads them as "active"
    assert hints.standby_buffer_size == 1       # the other workers' partitions
    assert health.standby_buffer_size == 1      # replicas of another worker's models
