"""SafeSource: reads never raise, one read in flight per unloaded model, back-off after a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from tailguard.lb.source import SafeSource
from tailguard.lb.testing import StaticSource


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class GatedSource:
    """Reads block until ``gate`` is set; then answer (or raise, if ``fail``)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.reads = 0
        self.fail = False

    async def get(self, model: str) -> frozenset[str]:
        self.reads += 1
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("redis down")
        return frozenset({"a"})

    async def quarantined(self, model: str) -> Mapping[str, float]:
        self.reads += 1
        return {"q": 1.0}


async def test_concurrent_first_reads_share_one_inner_read() -> None:
    inner = GatedSource()
    safe = SafeSource(inner)
    tasks = [asyncio.create_task(safe.get("m")) for _ in range(50)]
    await asyncio.sleep(0)
    inner.gate.set()
    assert set(await asyncio.gather(*tasks)) == {frozenset({"a"})}
    # 1 shared loading read + 50 cache reads afterwards; never 50 concurrent loads.
    assert inner.reads == 51
    assert await safe.quarantined("m") == {"q": 1.0}


async def test_failure_means_unknown_and_backs_off_without_touching_the_source() -> None:
    inner = GatedSource()
    inner.fail = True
    inner.gate.set()
    clock = FakeClock()
    safe = SafeSource(inner, retry_s=1.0, clock=clock)
    assert await safe.get("m") == frozenset()
    assert await safe.quarantined("m") == {}
    assert await safe.get("m") == frozenset()
    assert inner.reads == 1 and safe.errors == 1
    clock.now_s = 1.5
    inner.fail = False
    assert await safe.get("m") == frozenset({"a"})
    assert inner.reads == 3        # the retry load, then the cached read


async def test_errors_after_first_load_are_unknown_too(caplog: pytest.LogCaptureFixture) -> None:
    inner = StaticSource({"m": frozenset({"x"})})
    clock = FakeClock()
    safe = SafeSource(inner, clock=clock, log_every_s=30.0)
    assert await safe.get("m") == frozenset({"x"})
    inner.fail = True
    for _ in range(3):
        assert await safe.get("m") == frozenset()
        assert await safe.quarantined("m") == {}
    assert safe.errors == 6
    assert sum("treating it as unknown" in r.message for r in caplog.records) == 1
