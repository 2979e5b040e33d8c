"""Fakes shared by the service tests: Kafka records, summaries, a routing sink."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tailguard.core.contract.types import ModelTick, WindowSummary
from tailguard.routing.apply_script import NO_EXTRAS, Extras


@dataclass(frozen=True)
class Rec:
    """A stand-in for aiokafka's ConsumerRecord."""

    value: bytes | None
    offset: int = 0
    partition: int = 0
    topic: str = "latency-events"
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def single(node: str, model: str, latency_us: float, ts: float, **extra: Any) -> bytes:
    return json.dumps({"node_id": node, "model": model, "latency_us": latency_us, "ts": ts,
                       **extra}).encode()


def batch(node: str, model: str, latencies_us: list[float], ts: float) -> bytes:
    return json.dumps({"node_id": node, "model": model, "hardware": "A100",
                       "samples": [[ts, x] for x in latencies_us]}).encode()


def llm_batch(node: str, model: str, ts: float, rng: np.random.Generator, n: int = 100,
              us_per_token: float = 30_000.0) -> bytes:
    """A batch of sized samples without ttft (the model is judged on ``normalized``)."""
    out = rng.integers(2, 400, n)
    inp = rng.integers(10, 3000, n)
    lat = (50_000 + 20.0 * inp + us_per_token * out) * rng.lognormal(0, 0.05, n)
    return json.dumps({"node_id": node, "model": model, "hardware": "A100",
                       "samples": [[ts, float(x), int(i), int(o), None]
                                   for x, i, o in zip(lat, inp, out, strict=True)]}).encode()


def summary(node: str, model: str, tick_ts: float, p50: float, p99: float,
            samples: int = 500, first_seen_ts: float = 0.0) -> WindowSummary:
    return WindowSummary(node_id=node, model=model, tick_ts=tick_ts, signal="latency",
                         samples=samples, p50=p50, p99=p99, latency_p50_us=p50,
                         latency_p99_us=p99, hardware="A100", first_seen_ts=first_seen_ts,
                         last_seen_ts=tick_ts)


@dataclass
class FakeRouting:
    """Records every verdict; ``up=False`` makes writes fail like a Redis outage."""

    up: bool = True
    applied: list[ModelTick] = field(default_factory=list)
    extras: list[Extras] = field(default_factory=list)

    histories: list[tuple[str, Mapping[str, str]]] = field(default_factory=list)

    async def apply(self, tick: ModelTick, extras: Extras = NO_EXTRAS) -> bool:
        if self.up:
            self.applied.append(tick)
            self.extras.append(extras)
        return self.up

    async def write_history(self, model: str, history: Mapping[str, str]) -> bool:
        if self.up:
            self.histories.append((model, history))
        return self.up
