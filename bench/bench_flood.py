"""Benchmark of a cardinality flood: memory given back, and the tick's cost during it.

Run: ``python -m bench.bench_flood [--quick] [--ids N] [--limit N] [--pymalloc]``. In one
fresh process, on the worker's allocator (jemalloc when installed: the bench re-executes itself
as ``tailguard worker`` does, :mod:`tailguard.streaming.allocator`; ``--pymalloc``: CPython's),
stage 1 (:class:`~tailguard.streaming.stage1.Stage1` on the real ``WindowStore``) and
stage 2 (:class:`~tailguard.streaming.stage2.Stage2` on the real ``FleetEvaluator``) run on
simulated time (tick 2 s): 6 real nodes report 50 samples per tick each; then
``--ids`` distinct node ids (200,000; 20,000 with ``--quick``) send one single-event
JSON record each, for one model, read in polls of 5,000 beside the real traffic;
then the real nodes go on until the flood's ids are past ``forget_after_s`` and every
stage has forgotten them. Printed: the worker's RSS (``/proc/self/statm``) before,
at the peak and after, the ratio after / before (target: <= 1.5), the series and
pairs held at each point, and the stage-1 tick's CPU time at the peak.
``--limit`` is ``max_new_pairs_per_tick`` (default: the setting's default, 1000; ``0`` =
no limit, the worst case for memory: every id gets a window and a stage-2 pair — 200,000
of them take ~10 minutes here).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass

from bench.timing import row
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.window import WindowStore
from tailguard.streaming import allocator
from tailguard.streaming.stage1 import Stage1
from tailguard.streaming.stage2 import Stage2

T0 = 1_764_680_000.0
TICK_S = 2.0
POLL = 5000


@dataclass(frozen=True)
class Rec:
    """The fields of an aiokafka ConsumerRecord that stage 1 reads."""

    value: bytes
    offset: int = 0
    partition: int = 0
    topic: str = "latency-events"
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Fleet:
    """The two stages on simulated time."""

    def __init__(self, limit: int) -> None:
        self.det = DetectorSettings(tick_interval_s=TICK_S, window_size=1000, min_samples=20,
                                    warmup_s=10.0, forget_after_s=60.0, silent_after_s=20.0,
                                    max_new_pairs_per_tick=limit)
        self.s1 = Stage1(WindowStore(self.det), self.det)
        self.ev = FleetEvaluator(self.det)
        self.s2 = Stage2(self.ev, {}, stale_after_s=1.5 * TICK_S)
        self.now = T0
        self.tick_cpu_s = 0.0

    def real(self) -> list[Rec]:
        return [Rec(json.dumps({"node_id": f"real-{i}", "model": "llama", "samples": [
            [self.now - 1 + j / 50, 100_000.0 + 1000 * ((j * 7) % 11)] for j in range(50)]}).encode())
                for i in range(6)]

    def tick(self, flood: list[bytes] = ()) -> None:   # type: ignore[assignment]
        for k in range(0, len(flood), POLL):
            self.s1.ingest(0, [Rec(v) for v in flood[k:k + POLL]], self.now)
        self.s1.ingest(0, self.real(), self.now)
        self.now += TICK_S
        t0 = time.process_time()
        self.s1.forget_silent(self.now)
        for s in self.s1.summaries(self.now):
            self.s2.on_summary(s)
        self.tick_cpu_s = time.process_time() - t0
        self.s2.tick(self.now + TICK_S / 2, lambda m: True)

    def pairs(self) -> int:
        return len(self.ev.snapshot_model("llama").get("pairs", {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ids", type=int, default=None)
    ap.add_argument("--limit", type=int, default=DetectorSettings().max_new_pairs_per_tick)
    ap.add_argument("--pymalloc", action="store_true", help="CPython's allocator, not the worker's")
    a = ap.parse_args()
    if not a.pymalloc:
        allocator.reexec_if_asked()
    logging.getLogger("tailguard.streaming.stage1").setLevel(logging.ERROR)   # one line per tick
    n_ids = a.ids or (20_000 if a.quick else 200_000)
    f = Fleet(a.limit)
    for _ in range(30):
        f.tick()
    before = rss_mb()
    held_before = f.s1.store.series_count()
    flood = [json.dumps({"node_id": f"flood-{i:07d}", "model": "llama", "latency_us": 5000.0,
                         "ts": f.now - 0.5}).encode() for i in range(n_ids)]
    per_tick = 40_000                        # ~ what one 2-core worker reads in 2 s
    peak, peak_series, peak_tick_s = before, 0, 0.0
    for k in range(0, n_ids, per_tick):
        f.tick(flood[k:k + per_tick])
        if rss_mb() > peak:
            peak, peak_series, peak_tick_s = rss_mb(), f.s1.store.series_count(), f.tick_cpu_s
    del flood
    peak_pairs = f.pairs()
    for _ in range(int(f.det.forget_after_s / TICK_S) + 10):
        f.tick()
    after = rss_mb()
    print(f"flood of {n_ids:,} one-event ids beside 6 real nodes, tick {TICK_S:g} s,"
          f" max_new_pairs_per_tick {a.limit or 'off'}, allocator "
          f"{'jemalloc' if allocator.jemalloc_active() else 'pymalloc'} (measured {time.strftime('%Y-%m-%d')})")
    row("RSS before the flood", f"{before:.1f} MB", f"{held_before} series")
    row("RSS at the peak", f"{peak:.1f} MB",
        f"{peak_series:,} series in stage 1, {peak_pairs:,} pairs in stage 2")
    row("stage-1 tick at the peak (forget + summaries)", f"{peak_tick_s * 1e3:.0f} ms CPU")
    row("RSS after the flood's ids are forgotten", f"{after:.1f} MB",
        f"{f.s1.store.series_count()} series, {f.pairs()} pairs")
    row("RSS after / before (target <= 1.5)", f"{after / before:.2f}")


if __name__ == "__main__":
    main()
