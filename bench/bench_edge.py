"""Benchmark of the operator edge (``tailguard.streaming.edge``) on one large model.

Run: ``python -m bench.bench_edge [--quick]``. One model of 10,000 nodes (2,000
with ``--quick``), every history full (``TAILGUARD_HISTORY_TICKS`` 10), one
drain and one pin in force: CPU time of one ``OperatorEdge.apply`` (rule
statistics, history entries, annotations; ``bench.timing.best``), the same with
the history turned off, the memory the edge keeps (tracemalloc) and the bytes of
history and annotations the routing writer sends to Redis for that tick.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc

from bench.timing import best, row
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus, WindowSummary
from tailguard.routing.operators import OperatorState, Override
from tailguard.streaming.edge import EdgeInput, OperatorEdge


def _fleet(n: int) -> tuple[ModelTick, tuple[WindowSummary, ...]]:
    statuses, summaries = [], []
    for i in range(n):
        node, p50 = f"gpu-node-{i:05d}", 180_000.0 * (1 + (i % 7) / 50)
        statuses.append(NodeStatus(node_id=node, model="llm", state=HealthState.HEALTHY,
                                   routed=True, since_ts=0.0, reason="normal", p50=p50,
                                   p99=2.2 * p50, ratio=2.2, samples=1000, latency_p50_us=p50,
                                   latency_p99_us=2.2 * p50, signal="latency"))
        summaries.append(WindowSummary(node, "llm", 0.0, "latency", 1000, p50, 2.2 * p50, p50,
                                       2.2 * p50, fresh_samples=200, fresh_p50=p50,
                                       requests_total=1000 * (i + 1), failed_total=i))
    tick = ModelTick(model="llm", ts=0.0, transitions=(),
                     routing=frozenset(s.node_id for s in statuses), quarantine={},
                     statuses=tuple(statuses))
    return tick, tuple(summaries)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    n = 2_000 if ap.parse_args().quick else 10_000
    tick, summaries = _fleet(n)
    ops = OperatorState((Override("gpu-node-00001", None, "drain", reason="maintenance"),
                         Override("gpu-node-00002", "llm", "pin")))
    settings = DetectorSettings()
    for history in (10, 0):
        edge = OperatorEdge(settings, history_len=history)
        now = [0.0]

        def once(edge: OperatorEdge = edge, now: list[float] = now) -> object:
            now[0] += 30.0      # as the worker: the verdict, then its history rows
            out = edge.apply(EdgeInput(tick, (), summaries), ops, now[0])
            edge.deferred_history(out.tick.model)
            return out
        tracemalloc.start()
        for _ in range(history):
            once()      # fill the history first
        kept, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        row(f"  memory kept by the edge, history {history}", f"{kept / 1e6:.0f} MB")
        t = best(once)
        row(f"edge apply, {n} nodes, history {history}", f"{t * 1000:.0f} ms CPU")
        out = edge.apply(EdgeInput(tick, (), summaries), ops, now[0] + 30.0)
        hist = sum(len(v) for v in (edge.deferred_history(out.tick.model) or {}).values())
        notes = sum(len(json.dumps(a)) for a in out.extras.annotations.values())
        row(f"  bytes to Redis, history {history}",
            f"{hist / 1e6:.1f} MB history, {notes / 1e6:.2f} MB annotations")


if __name__ == "__main__":
    main()
