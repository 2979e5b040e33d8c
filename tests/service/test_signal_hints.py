"""Stage 2 chooses each model's signal from every stage 1's summaries and hands it to them
through the hints table: two window stores (one worker's share with token counts, one
without) against the real Stage2/FleetEvaluator, no Kafka."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from aiokafka.errors import KafkaConnectionError, NotLeaderForPartitionError
from prometheus_client import CollectorRegistry

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window import signals as sig
from tailguard.core.window.window import WindowStore
from tailguard.settings import load
from tailguard.streaming import hints_feed
from tailguard.streaming.hints import StageHints, decode_hints, encode_hints, hints_changed
from tailguard.streaming.hints_feed import HintsFeed
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage2 import Stage2

T = 10.0
SETTINGS = DetectorSettings(min_samples=50, window_size=300, warmup_s=0.0, confirm_windows=2,
                            tick_interval_s=T, backoff_initial_s=900.0, backoff_max_s=900.0)
A = [f"a{i}" for i in range(4)]           # worker A's share: token counts
B = ["b0", "b1", "slow"]                  # worker B's share: latency only


def feed(store: WindowStore, node: str, now: float, rng: np.random.Generator, tokens: bool,
         factor: float = 1.0) -> None:
    n = 100
    out = rng.integers(20, 400, n).astype(np.float64)
    inp = rng.integers(100, 2000, n).astype(np.float64)
    first = (40_000 + 15.0 * inp) * rng.lognormal(0, 0.05, n)
    lat = (first + 30_000.0 * (out - 1) * rng.lognormal(0, 0.05, n)) * (3.0 if node == "slow" else factor)
    ones = np.ones(n, dtype=bool)
    store.observe(SampleBatch(node, "llm", "A100", np.linspace(now - T + 0.1, now, n), lat, ones,
                              ~ones, inp if tokens else None, out if tokens else None,
                              first if tokens else None))


def stage1(store: WindowStore, now: float, h: StageHints) -> list[WindowSummary]:
    """What ``tailguard.streaming.stage1.Stage1.summaries`` asks of its store."""
    return store.summaries(now, h.judge_since, out_of_fit=h.out_of_fit, tail_refs=h.tail_refs,
                           choices=h.signals, evidence=True)


def test_two_shares_end_on_one_signal_and_the_slow_node_is_caught() -> None:
    rng = np.random.default_rng(4)
    hints: dict[bytes, Any] = {}
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T, hints=hints)
    wa, wb = WindowStore(SETTINGS), WindowStore(SETTINGS)
    signals: list[dict[str, str]] = []
    last: list[Any] = []
    for k in range(12):
        now = 1000.0 + k * T
        for node in A:
            feed(wa, node, now, rng, tokens=True)
        for node in B:
            feed(wb, node, now, rng, tokens=False)
        h = decode_hints(hints.items())
        sums = stage1(wa, now, h) + stage1(wb, now, h)
        signals.append({s.node_id: s.signal for s in sums})
        for s in sums:
            s2.on_summary(s)
        last = s2.tick(now + 0.5, lambda m: True)
    # Alone, A's share is judged per token and B's in raw latency; from stage 2's first choice
    # on, every node of the model is summarised (and judged) on one signal.
    assert set(signals[0].values()) == {"tpot", "latency"}, signals[0]
    assert all(set(s.values()) == {"latency"} for s in signals[1:]), signals
    (out,) = last
    assert {st.signal for st in out.tick.statuses} == {"latency"}
    states = {st.node_id: st.state for st in out.tick.statuses}
    assert states["slow"] is HealthState.QUARANTINED, states
    assert "slow" not in out.tick.routing and set(A) | {"b0", "b1"} <= out.tick.routing
    assert decode_hints(hints.items()).signals["llm"].signal == "latency"


def test_a_bad_signal_hint_is_skipped_and_the_rest_kept(caplog: Any) -> None:
    good = encode_hints({"n0": 5.0}, [], 2.0, sig.ModelChoice("tpot"))
    bad = {**good, "signal": {"signal": "fast"}}
    got = decode_hints([(b"m", good), (b"x", bad)])
    assert got.signals == {"m": sig.ModelChoice("tpot")}
    assert got.tail_refs == {"m": 2.0, "x": 2.0} and ("n0", "x") in got.judge_since
    assert "the signal hint of model 'x' is skipped" in caplog.text


def test_the_hints_feed_gives_the_changelog_s_hints_over_the_worker_s_table(caplog: Any) -> None:
    """What another worker's stage 2 wrote reaches this stage 1 through the changelog, even
    when faust's GlobalTable here never got it; once read to its end the changelog alone
    counts (a tombstone deletes); bad JSON is skipped."""
    feed = HintsFeed(settings=load({}), topic="hints-changelog", partitions=4)
    mine = [(b"old", {"tail_ref": 1.0}), (b"gone", {"tail_ref": 2.0})]
    feed.apply(b"llm", json.dumps(encode_hints({}, [], None, sig.ModelChoice("latency"))).encode())
    feed.apply(b"gone", json.dumps({"tail_ref": 4.0}).encode())
    feed.apply(b"old", b"{not json")
    feed.apply(None, b"{}")
    assert feed.bad == 1 and "a hints value of model 'old'" in caplog.text
    early = decode_hints(feed.items(mine))          # still reading: the table, overlaid
    assert early.signals == {"llm": sig.ModelChoice("latency")}
    assert early.tail_refs == {"old": 1.0, "gone": 4.0}
    feed.apply(b"gone", None)
    feed.apply(b"old", json.dumps({"tail_ref": 3.0}).encode())
    feed.caught_up = True
    got = decode_hints(feed.items(mine))
    assert got.tail_refs == {"old": 3.0} and set(got.signals) == {"llm"}
    # A model this worker's stage 2 writes: its own table's value, before the broker echoes it.
    assert decode_hints(feed.items(mine, own={"old"})).tail_refs == {"old": 1.0}



class CountingTable(dict[bytes, Any]):
    """A hints table that counts its writes."""

    writes = 0

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def test_a_normalized_model_s_hints_are_rewritten_when_its_fit_moves_not_every_tick() -> None:
    """The fleet fit follows every sample of the sliding windows; its drift in steady traffic
    (within 2 % of the expected latency) is not written again each tick; a fleet that slows
    down is, at once."""
    rng = np.random.default_rng(5)
    st = SETTINGS.replace(signal="normalized")
    hints = CountingTable()
    s2 = Stage2(FleetEvaluator(st), {}, stale_after_s=1.5 * T, hints=hints)
    w = WindowStore(st)
    writes: list[int] = []
    for k in range(16):
        now = 1000.0 + k * T
        for i in range(64):
            feed(w, f"a{i:02d}", now, rng, tokens=True, factor=1.0 if k < 12 else 1.5)
        for s in stage1(w, now, decode_hints(hints.items())):
            s2.on_summary(s)
        s2.tick(now + 0.5, lambda m: True)
        writes.append(hints.writes)
    steady = writes[11] - writes[0]
    assert steady <= 5, writes              # before: one write every tick, 11
    assert writes[14] > writes[11], writes  # 1.5x slower: the fit is written again
    fit = decode_hints(hints.items()).signals["llm"].fit
    assert fit is not None and fit.nodes == 64


def test_hints_changed_ignores_only_a_small_drift_of_the_fit() -> None:
    fit = sig.FleetFit(20_000.0, 30_000.0, 10.0, 300_000.0, 8)
    value = encode_hints({"n0": 5.0}, ["n1"], 1.7, sig.ModelChoice("normalized", True, fit))

    def with_fit(**change: float) -> dict[str, Any]:
        return encode_hints({"n0": 5.0}, ["n1"], 1.7,
                            sig.ModelChoice("normalized", True, replace(fit, **change)))  # type: ignore[arg-type]
    assert hints_changed(None, value)
    assert not hints_changed(value, dict(value))
    assert not hints_changed(value, with_fit(b_us_per_token=30_300.0, a_us=21_000.0))     # 1 %
    assert hints_changed(value, with_fit(b_us_per_token=31_500.0))                        # 5 %
    assert hints_changed(value, with_fit(c_us_per_input_token=40.0))       # +30 ms at 1,024 input tokens
    assert hints_changed(value, {**value, "judge_since": {"n0": 6.0}})
    assert hints_changed(value, {**value, "tail_ref": 1.8})
    assert hints_changed(value, encode_hints({"n0": 5.0}, ["n1"], 1.7, sig.ModelChoice("normalized", False, fit)))
    assert hints_changed(value, encode_hints({"n0": 5.0}, ["n1"], 1.7, sig.ModelChoice("latency")))
    assert hints_changed(value, {**value, "signal": {**value["signal"], "fit": {"a_us": None}}})


def test_bad_hints_are_counted_by_reason_and_never_stop_stage_1() -> None:
    """Every unreadable record, or part of one, is counted in tailguard_bad_hints_total{reason};
    what cannot be used at all leaves the model's previous hints in place."""
    metrics = WorkerMetrics(CollectorRegistry())
    feed = HintsFeed(settings=load({}), topic="hints-changelog", partitions=1,
                     on_bad=lambda why: metrics.bad_hints.labels(reason=why).inc())
    good = encode_hints({"n0": 5.0}, [], 2.0, sig.ModelChoice("tpot"))
    for key in (b"a", b"b", b"c", b"d", b"e"):
        feed.apply(key, json.dumps(good).encode())
    feed.apply(b"a", b"{not json")
    feed.apply(b"b", json.dumps({"zlib_b64": "!!"}).encode())
    feed.apply(b"c", json.dumps([1, 2]).encode())
    feed.apply(b"d", json.dumps({**good, "signal": {"signal": "fast"}}).encode())
    feed.apply(b"e", json.dumps({**good, "judge_since": {"n0": "soon", "n1": 7.0}}).encode())
    counted = {why: metrics.registry.get_sample_value("tailguard_bad_hints_total", {"reason": why})
               for why in ("not_json", "packed", "not_object", "signal", "judge_since")}
    assert counted == dict.fromkeys(counted, 1.0), counted
    assert feed.bad == 5
    got = decode_hints(feed.items([]))
    assert {m: got.signals.get(m) for m in "abcde"} == {
        "a": sig.ModelChoice("tpot"), "b": sig.ModelChoice("tpot"), "c": sig.ModelChoice("tpot"),
        "d": None, "e": sig.ModelChoice("tpot")}
    assert got.judge_since[("n1", "e")] == 7.0 and ("n0", "e") not in got.judge_since
    assert got.judge_since[("n0", "d")] == 5.0


class _FlakyConsumer:
    """A consumer of the hints changelog whose broker fails now and then: ``topics()`` fails
    once, then ``end_offsets`` once, then it serves one record."""

    def __init__(self, topic: str, record: Any) -> None:
        self.topic, self.record, self.calls = topic, record, {"topics": 0, "end_offsets": 0}
        self.served = False

    async def topics(self) -> set[str]:
        self.calls["topics"] += 1
        if self.calls["topics"] == 1:
            raise KafkaConnectionError("the broker is unreachable")
        return {self.topic}

    def assign(self, tps: Any) -> None:
        self.tps = list(tps)

    async def seek_to_beginning(self, *tps: Any) -> None:
        return None

    async def end_offsets(self, tps: Any) -> dict[Any, int]:
        self.calls["end_offsets"] += 1
        if self.calls["end_offsets"] == 1:
            raise NotLeaderForPartitionError()
        return dict.fromkeys(tps, 1)

    async def getmany(self, timeout_ms: int = 0) -> dict[Any, list[Any]]:
        await asyncio.sleep(0.001)
        if self.served:
            return {}
        self.served = True
        return {self.tps[0]: [self.record]}

    async def position(self, tp: Any) -> int:
        return 1


async def test_the_hints_feed_reads_on_after_kafka_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kafka error while the feed starts (seen: metadata refused during a broker's restart)
    ended the feed's task, and with it the worker; now it is logged and reading starts over."""
    monkeypatch.setattr(hints_feed, "RETRY_FIRST_S", 0.01)
    feed = HintsFeed(settings=load({}), topic="hints-changelog", partitions=1)
    value = encode_hints({"n0": 5.0}, [], 2.0, sig.ModelChoice("tpot"))
    rec = SimpleNamespace(key=b"m", value=json.dumps(value).encode())
    fake = _FlakyConsumer("hints-changelog", rec)
    feed._consumer = fake  # type: ignore[assignment]
    task = asyncio.ensure_future(feed.follow())
    try:
        for _ in range(500):
            if feed.caught_up:
                break
            await asyncio.sleep(0.01)
        assert feed.caught_up and feed.values == {b"m": value}
        assert fake.calls == {"topics": 3, "end_offsets": 2}
    finally:
        task.cancel()
