"""A synthetic feed of many series: lognormal latency for every (node, model), as keyed binary batches.

For benchmarks and integration tests that load a worker with thousands of series at once
(``bench/bench_cost_curve.py``, ``tests/integration/test_summary_handoff.py``): no scenario, no
faults, one :class:`~tailguard.core.contract.events.SampleBatch` per series, and the Kafka
messages that carry them in the binary batch form (:mod:`tailguard.core.contract.binary`).

Guarantees:

* :func:`fleet_pairs` names nodes ``n0000 …`` and models ``model-000 …``, every model with the
  same nodes, in model-major order.
* :func:`series_batches` gives each series ``samples`` successful non-probe samples, event times
  in ``(now_s - spread_s, now_s]`` sorted (all ``now_s`` when ``spread_s`` is 0), latency
  lognormal around ``median_us`` rounded to 0.1 µs; the same ``rng`` state gives the same batches.
* :func:`feed_messages` keys each message ``node|model`` (one series, one partition).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tailguard.core.contract import binary
from tailguard.core.contract.events import SampleBatch

__all__ = ["feed_messages", "fleet_pairs", "series_batches"]


def fleet_pairs(models: int, nodes_per_model: int) -> list[tuple[str, str]]:
    """``(node_id, model)`` of ``models`` models of ``nodes_per_model`` nodes each."""
    return [(f"n{i:04d}", f"model-{m:03d}") for m in range(models) for i in range(nodes_per_model)]


def series_batches(pairs: Iterable[tuple[str, str]], samples: int, now_s: float, rng: np.random.Generator, *,
                   median_us: float, sigma: float, spread_s: float = 0.0,
                   hardware: str = "A100") -> list[SampleBatch]:
    """One batch of ``samples`` samples per series (module docstring)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    mu = math.log(median_us)
    ok, probe = np.ones(samples, bool), np.zeros(samples, bool)
    out = []
    for node, model in pairs:
        ts = np.sort(now_s - rng.uniform(0, spread_s, samples)) if spread_s > 0 else np.full(samples, now_s)
        out.append(SampleBatch(node, model, hardware, ts, rng.lognormal(mu, sigma, samples).round(1), ok, probe))
    return out


def feed_messages(batches: Sequence[SampleBatch]) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` Kafka messages, one binary batch per series."""
    return [(f"{b.node_id}|{b.model}".encode(),
             binary.encode(b.node_id, b.model, b.hardware, b.ts, b.latency_us)) for b in batches]
