"""The scrape bridge with a fake network, Kafka and converter: what it publishes, counts and logs."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from tailguard.scrape.bridge import Bridge, Fetched
from tailguard.scrape.sd import ScrapeTarget


def target(node: str, model: str | None = None) -> ScrapeTarget:
    return ScrapeTarget(url=f"http://{node}:8000/metrics", node_id=node, model=model, hardware="H100",
                        profile="vllm")


class FakeConverter:
    """Stands in for hist-core's TargetConverter: one event per scrape after the first."""

    made: ClassVar[list[str]] = []

    def __init__(self, t: ScrapeTarget) -> None:
        self.t, self.seen = t, 0
        FakeConverter.made.append(t.node_id)

    def observe(self, text: str, ts: float, *, openmetrics: bool = False) -> list[dict[str, object]]:
        if text == "garbage":
            raise ValueError("line 1: not the exposition format")
        self.seen += 1
        if self.seen == 1:
            return []
        return [{"type": "histogram", "node_id": self.t.node_id, "model": "m", "metric": "e2e", "ts": ts,
                 "interval_s": 10.0, "bounds_s": [1.0], "counts": [1, 0], "openmetrics": openmetrics}]


class FakeFetcher:
    def __init__(self) -> None:
        self.answers: dict[str, Fetched | BaseException | None] = {}
        self.in_flight = self.max_in_flight = 0

    async def fetch(self, url: str, timeout_s: float) -> Fetched:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            a = self.answers.get(url, Fetched(200, b"ok", "text/plain; version=0.0.4"))
            if a is None:
                await asyncio.sleep(3600)      # hangs: the bridge's timeout must end it
            if isinstance(a, BaseException):
                raise a
            assert isinstance(a, Fetched)
            return a
        finally:
            self.in_flight -= 1


class FakePublisher:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[bytes, dict[str, object]]] = []
        self.fail = fail

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[object]:
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if self.fail:
            fut.set_exception(RuntimeError("broker down"))
        else:
            self.sent.append((key, json.loads(value)))
            fut.set_result(None)
        return fut


def make(fetcher: FakeFetcher, pub: FakePublisher, *, concurrency: int = 100,
         timeout_s: float = 0.5) -> tuple[Bridge, CollectorRegistry]:
    FakeConverter.made = []
    reg = CollectorRegistry()
    b = Bridge(fetcher, pub, timeout_s=timeout_s, concurrency=concurrency, registry=reg,
               converter_factory=FakeConverter, clock=lambda: 1_764_680_010.0)
    return b, reg


async def test_events_are_published_keyed_node_and_model_from_the_second_scrape() -> None:
    pub = FakePublisher()
    b, reg = make(FakeFetcher(), pub)
    b.set_targets([target("n1"), target("n2")])
    first = await b.scrape_once()
    assert (first.ok, first.events) == (2, 0)
    second = await b.scrape_once()
    assert (second.targets, second.ok, second.failed, second.events) == (2, 2, 0, 2)
    assert sorted(k for k, _ in pub.sent) == [b"n1|m", b"n2|m"]
    assert all(ev["ts"] == 1_764_680_010.0 and ev["openmetrics"] is False for _, ev in pub.sent)
    assert reg.get_sample_value("tailguard_scrape_events_total") == 2
    assert reg.get_sample_value("tailguard_scrape_up", {"instance": "n1"}) == 1


async def test_openmetrics_answers_are_passed_on_as_such() -> None:
    f, pub = FakeFetcher(), FakePublisher()
    f.answers["http://n1:8000/metrics"] = Fetched(200, b"ok", "application/openmetrics-text; version=1.0.0")
    b, _ = make(f, pub)
    b.set_targets([target("n1")])
    await b.scrape_once()
    await b.scrape_once()
    assert pub.sent[0][1]["openmetrics"] is True


async def test_failing_targets_send_nothing_are_counted_by_reason_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    f, pub = FakeFetcher(), FakePublisher()
    f.answers["http://down:8000/metrics"] = ConnectionRefusedError(111, "Connection refused")
    f.answers["http://hung:8000/metrics"] = None
    f.answers["http://err:8000/metrics"] = Fetched(503, b"")
    f.answers["http://junk:8000/metrics"] = Fetched(200, b"garbage")
    b, reg = make(f, pub, timeout_s=0.05)
    b.set_targets([target(n) for n in ("ok", "down", "hung", "err", "junk")])
    with caplog.at_level(logging.WARNING, logger="tailguard.scrape"):
        for _ in range(3):
            stats = await b.scrape_once()
    assert (stats.ok, stats.failed) == (1, 4)
    assert [k for k, _ in pub.sent] == [b"ok|m", b"ok|m"]
    for node, reason in (("down", "connect"), ("hung", "timeout"), ("err", "http_503"), ("junk", "parse")):
        assert reg.get_sample_value("tailguard_scrape_failures_total", {"instance": node, "reason": reason}) == 3
        assert reg.get_sample_value("tailguard_scrape_up", {"instance": node}) == 0
        assert sum(node in r.getMessage() for r in caplog.records) == 1, node
    assert any("not the exposition format" in r.getMessage() for r in caplog.records)
    # It answers again: one line says so, and its events flow.
    f.answers["http://err:8000/metrics"] = Fetched(200, b"ok")
    with caplog.at_level(logging.INFO, logger="tailguard.scrape"):
        await b.scrape_once()
    assert any("err (http://err:8000/metrics) answers again" in r.getMessage() for r in caplog.records)


async def test_concurrency_is_bounded() -> None:
    f = FakeFetcher()
    b, _ = make(f, FakePublisher(), concurrency=4, timeout_s=60)   # a loaded machine must not time them out
    b.set_targets([target(f"n{i}") for i in range(40)])
    stats = await b.scrape_once()
    assert stats.ok == 40 and f.max_in_flight == 4


async def test_a_kept_target_keeps_its_converter_a_changed_or_new_one_starts_afresh() -> None:
    b, reg = make(FakeFetcher(), FakePublisher())
    assert b.set_targets([target("n1"), target("n2")]) == (2, 0)
    await b.scrape_once()
    changed = ScrapeTarget(url="http://n2:8000/metrics", node_id="n2", model=None, hardware="A100", profile="vllm")
    assert b.set_targets([target("n1"), changed, target("n3")]) == (2, 0)
    assert FakeConverter.made == ["n1", "n2", "n2", "n3"]
    assert b.set_targets([target("n1")]) == (0, 2)
    assert reg.get_sample_value("tailguard_scrape_targets") == 1
    assert reg.get_sample_value("tailguard_scrape_up", {"instance": "n3"}) is None


async def test_kafka_refusals_are_counted_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    b, reg = make(FakeFetcher(), FakePublisher(fail=True))
    b.set_targets([target("n1")])
    await b.scrape_once()
    with caplog.at_level(logging.WARNING, logger="tailguard.scrape"):
        stats = await b.scrape_once()
    assert (stats.ok, stats.events, stats.published_failed) == (1, 0, 1)
    assert reg.get_sample_value("tailguard_scrape_publish_failures_total") == 1
    assert any("broker down" in r.getMessage() for r in caplog.records)


async def test_a_target_whose_converter_cannot_be_made_is_skipped_alone(caplog: pytest.LogCaptureFixture) -> None:
    def factory(t: ScrapeTarget) -> FakeConverter:
        if t.node_id == "odd":
            raise ValueError("target 'odd': unknown profile 'llamacpp'")
        return FakeConverter(t)

    reg = CollectorRegistry()
    b = Bridge(FakeFetcher(), FakePublisher(), timeout_s=5, concurrency=4, registry=reg, converter_factory=factory)
    with caplog.at_level(logging.ERROR, logger="tailguard.scrape"):
        assert b.set_targets([target("n1"), target("odd")]) == (1, 0)
    assert [t.node_id for t in b.targets] == ["n1"]
    assert reg.get_sample_value("tailguard_scrape_failures_total", {"instance": "odd", "reason": "profile"}) == 1
    assert any("odd (http://odd:8000/metrics) is not scraped: target 'odd': unknown profile" in r.getMessage()
               for r in caplog.records)
    assert (await b.scrape_once()).ok == 1
