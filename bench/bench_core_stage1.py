"""Benchmark of the detector's stage 1: decoding, windows, summaries, quantiles.

Run: ``python -m bench.bench_core_stage1 [--quick]``. Prints this process's
CPU time (``time.process_time``: everything measured is single-threaded, and
CPU time is less disturbed than wall-clock time by other work on a shared
machine), the best of several repeats, and, where there is an alternative,
the ratio against it in the same run.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from typing import Any

import numpy as np

from bench.timing import best, row
from tailguard.core.contract import events
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import SampleBatch, decode
from tailguard.core.window import quantiles
from tailguard.core.window.accumulate import Accumulator
from tailguard.core.window.window import WindowStore

# ---------------------------------------------------------------- quantiles

def bench_quantiles(quick: bool) -> None:
    import tdigest
    from fastdigest import TDigest

    print("quantile structures over a 1000-sample window (lognormal latency)")
    rng = np.random.default_rng(0)
    window = rng.lognormal(12, 0.5, 1000)
    values = window.tolist()
    n_td = 1000 if quick else 3000

    def td_update() -> None:
        d = tdigest.TDigest()
        for v in values[: n_td // 3]:
            d.update(v)

    def fd_update() -> None:
        d = TDigest(max_centroids=200)
        for v in values:
            d.update(v)

    def fd_batch() -> None:
        TDigest.from_values(values, max_centroids=200)

    ring = np.zeros(1000, dtype=np.float32)

    def ring_write() -> None:
        for i, v in enumerate(values):
            ring[i] = v

    per = {
        "tdigest.update (pure Python)": best(td_update, 3) / (n_td // 3),
        "fastdigest.update": best(fd_update) / 1000,
        "fastdigest.from_values (batch)": best(fd_batch) / 1000,
        "ring buffer write (numpy item)": best(ring_write) / 1000,
    }
    base = per["fastdigest.update"]
    for k, v in per.items():
        row(f"per-sample update: {k}", f"{v * 1e9:,.0f} ns", f"{v / base:6.1f}x fastdigest")

    td = tdigest.TDigest()
    td.batch_update(values)
    fd = TDigest.from_values(values, max_centroids=200)
    q = {
        "np.partition p50+p99 (exact)": best(lambda: np.partition(window, [499, 500, 989, 990]),
                                               50),
        "np.quantile p50+p99 (exact)": best(lambda: np.quantile(window, [0.5, 0.99]), 50),
        "fastdigest.quantile p50+p99": best(lambda: (fd.quantile(0.5), fd.quantile(0.99)), 50),
        "tdigest.percentile p50+p99": best(lambda: (td.percentile(50), td.percentile(99)), 50),
    }
    base = q["np.partition p50+p99 (exact)"]
    for k, v in q.items():
        row(f"per-query: {k}", f"{v * 1e6:,.1f} µs", f"{v / base:6.1f}x np.partition")
    # Per tick the exact window costs one selection; a digest costs 1000 updates + a query.
    exact_tick = base
    digest_tick = per["fastdigest.update"] * 1000 + q["fastdigest.quantile p50+p99"]
    td_tick = per["tdigest.update (pure Python)"] * 1000 + q["tdigest.percentile p50+p99"]
    row("per tick+1000 samples: exact window (np.partition)", f"{exact_tick * 1e6:,.1f} µs", "1.0x")
    row("per tick+1000 samples: fastdigest", f"{digest_tick * 1e6:,.1f} µs",
        f"{digest_tick / exact_tick:6.1f}x exact")
    row("per tick+1000 samples: tdigest", f"{td_tick * 1e6:,.1f} µs",
        f"{td_tick / exact_tick:6.1f}x exact")


# ---------------------------------------------------------------- windows

def fill_store(n_series: int, n: int, *, sized: bool, seed: int = 0) -> WindowStore:
    rng = np.random.default_rng(seed)
    store = WindowStore(DetectorSettings())
    ones, zeros = np.ones(n, bool), np.zeros(n, bool)
    for i in range(n_series):
        ts = np.sort(rng.uniform(0, 100, n))
        if sized:
            out = rng.integers(2, 500, n).astype(np.float64)
            inp = rng.integers(10, 3000, n).astype(np.float64)
            ttft = 40_000 + 15 * inp
            lat = ttft + 30_000 * out * rng.lognormal(0, 0.05, n)
            store.observe(SampleBatch(f"n{i}", f"m{i % 8}", "A100", ts, lat, ones, zeros,
                                      inp, out, ttft if i % 16 else None))
        else:
            store.observe(SampleBatch(f"n{i}", f"m{i % 8}", "A100", ts,
                                      rng.lognormal(12, 0.3, n), ones, zeros))
    return store


def bench_summaries(quick: bool) -> None:
    n_series = 2_000 if quick else 10_000
    print(f"summaries(): {n_series} series x 1000 samples, 8 models")
    store = fill_store(n_series, 1000, sized=False)
    t = best(lambda: store.summaries(100.0), 5)
    row("latency-only, all windows in the age bound", f"{t * 1e3:,.1f} ms",
        f"{t / n_series * 1e6:.1f} µs/series")
    split = quantiles.SPLIT_WIDTH
    quantiles.SPLIT_WIDTH = 1 << 30  # type: ignore[misc]  # the alternative: one sort per row
    try:
        t1 = best(lambda: store.summaries(100.0), 5)
    finally:
        quantiles.SPLIT_WIDTH = split  # type: ignore[misc]
    row("  same, rows sorted whole (no half-split)", f"{t1 * 1e3:,.1f} ms",
        f"{t1 / t:5.2f}x the half-split tick")
    judge = {(f"n{i}", f"m{i % 8}"): 50.0 for i in range(0, n_series, 50)}
    t2 = best(lambda: store.summaries(80.0, judge), 3)
    row("latency-only, part of windows aged, 2% quarantined", f"{t2 * 1e3:,.1f} ms",
        f"{t2 / t:5.2f}x the clean tick")
    t3 = best(lambda: store.summaries(100.0, digests=True), 2)
    row("latency-only, with t-digest per series", f"{t3 * 1e3:,.1f} ms",
        f"{t3 / t:5.2f}x without")
    n_sized = n_series // 5
    sized = fill_store(n_sized, 1000, sized=True)
    for signal in ("tpot", "normalized"):
        sized.settings = sized.settings.replace(signal=signal)
        ts_ = best(lambda: sized.summaries(100.0), 3)
        row(f"LLM-sized series ({n_sized}), signal={signal}", f"{ts_ * 1e3:,.1f} ms",
            f"{ts_ / n_sized * 1e6:.1f} µs/series")


def bench_memory() -> None:
    print("memory per series (tracemalloc, numpy buffers included)")
    for label, n_series, n, sized in [("latency-only, 1000 samples", 2000, 1000, False),
                                      ("latency-only, 10 samples", 2000, 10, False),
                                      ("LLM-sized, 1000 samples", 1000, 1000, True)]:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        store = fill_store(n_series, n, sized=sized)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        row(label, f"{used / n_series / 1024:,.2f} KiB", f"({store.series_count()} series)")


# ---------------------------------------------------------------- decoding

def make_lines(n: int, nodes: int, *, sized: bool) -> list[bytes]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        d: dict[str, Any] = {"node_id": f"gpu-node-{i % nodes:03d}", "model": "llama-3-70b",
                             "latency_us": float(round(rng.lognormal(12, 0.4))),
                             "ts": 1764680000.0 + i * 0.001, "hardware": "A100", "ok": True}
        if sized:
            d.update(input_tokens=int(rng.integers(10, 3000)),
                     output_tokens=int(rng.integers(2, 500)), ttft_us=20000.5)
        out.append(json.dumps(d).encode())
    return out


def feed(store: WindowStore, evs: list[events.Event]) -> None:
    for ev in evs:
        if isinstance(ev, SampleBatch):
            store.observe(ev)
        else:
            store.observe_heartbeat(ev)


def bench_single(n: int, sized: bool) -> None:
    lines = make_lines(n, 100, sized=sized)
    tag = "single events" + (" with sizes" if sized else "")

    def grouped() -> None:
        store = WindowStore(DetectorSettings())
        acc = Accumulator()
        add = acc.add
        for i, raw in enumerate(lines):
            add(raw)
            if i % 20_000 == 19_999:
                feed(store, acc.drain())
        feed(store, acc.drain())

    def one_by_one() -> None:
        store = WindowStore(DetectorSettings())
        for raw in lines[: n // 5]:
            feed(store, [decode(raw)])

    t_g = best(grouped, 3)
    t_1 = best(one_by_one, 3) * 5
    row(f"{tag}: Accumulator (replay path)", f"{n / t_g:,.0f} ev/s")
    row(f"{tag}: decode()+observe() each (worker path)", f"{n / t_1:,.0f} ev/s",
        f"{t_1 / t_g:5.1f}x slower than grouped")
    if not sized:
        std = events._std_loads()
        fast = events.json_loads
        t_std = best(lambda: [std(x) for x in lines], 3)
        t_or = best(lambda: [fast(x) for x in lines], 3)
        row("JSON only: orjson vs stdlib json", f"{n / t_or:,.0f} ev/s",
            f"stdlib {n / t_std:,.0f} ev/s = {t_std / t_or:4.1f}x slower")


def bench_decode(quick: bool) -> None:
    n = 50_000 if quick else 300_000
    print(f"decode + window update, {n:,} events, 100 nodes (best of 3)")
    bench_single(n, False)
    bench_single(n, True)
    rng = np.random.default_rng(2)
    batches = [json.dumps({"node_id": f"n{i % 100}", "model": "m", "hardware": "A100",
                           "samples": [[1764680000.0 + j, float(round(x))] for j, x in
                                       enumerate(rng.lognormal(12, 0.4, 500))]}).encode()
               for i in range(n // 500)]

    def batch_path() -> None:
        store = WindowStore(DetectorSettings())
        feed(store, [decode(raw) for raw in batches])

    t_b = best(batch_path, 3)
    row("batch form, 500 samples/message", f"{n / t_b:,.0f} samples/s")


def bench_replay(quick: bool) -> None:
    try:
        from tailguard.core.replay.replay import replay
    except ImportError:
        return
    n = 60_000 if quick else 300_000
    lines = make_lines(n, 100, sized=False)
    print(f"tailguard replay end to end (tailguard.core.replay.replay.replay), {n:,} single events, 100 nodes")
    emitted: list[str] = []
    # As `tailguard replay` runs it: the garbage collector paused around each summary pass.
    from tailguard.collector import collector_paused
    from tailguard.core.replay.detector import Detector

    t = best(lambda: replay(lines, DetectorSettings(), emitted.append,
                            detector=Detector(DetectorSettings(), pause_collector=collector_paused)), 3)
    row("events/s incl. ticks and evaluation", f"{n / t:,.0f} ev/s",
        f"{(n / t) / 150_000:4.2f}x the 150k/s target")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (seconds, not minutes)")
    args = ap.parse_args(argv)
    bench_decode(args.quick)
    bench_replay(args.quick)
    bench_summaries(args.quick)
    bench_memory()
    bench_quantiles(args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
