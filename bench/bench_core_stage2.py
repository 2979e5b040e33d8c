"""Benchmark of the detector's stage 2, the façade and ``tailguard replay``.

Run: ``python -m bench.bench_core_stage2 [--quick]``. Prints CPU time
(``bench.timing.best``: best of several repeats) and, where there is an
alternative, the ratio against it in the same run:

* replay throughput on a generated 300,000-line trace read from a file
  (100 nodes, 2 models, 1 % of lines bad, slightly out of order), against the
  seed's algorithm transcribed to plain Python on the same lines
  (:func:`seed_transcription`, the baseline of issue 14: replay >= 2x it) and
  a naive loop that decodes and observes one event at a time; and of a 200,000-line
  trace of batches and heartbeats (every line on the replay's per-line path) against
  that naive loop;
* one tick at 10,000 (node, model) series: stage 2 alone
  (``FleetEvaluator.evaluate`` on ready summaries, with and without statuses, and with
  routing weights against ``weights=off``)
  and the whole façade (``Detector.evaluate``: summaries + evaluation) on
  full 1000-sample windows of healthy pairs past warm-up (steady state), against
  the seed's sketch (sort every window, pick P50/P99 by index, compare in a Python
  loop) and one uint32 sort of every window (the floor of an exact tick computed from
  scratch); the tick runs under the worker's collector policy (:func:`worker_collector`)
  and, beside it, under Python's default one; the façade's share spent on the cluster-wide P50/P99 per model
  (``WindowStore.model_pools``); the mergeable cluster digests
  (``WindowStore.model_digests``) against one digest per series
  (``summaries(digests=True)``);
* the façade's memory per series in steady state: the ring slabs per sample slot and
  everything else per series (tracemalloc), beside the binary wire's 16 B per sample, just
  after a new slab began and at 10,000 series;
* memory of stage 2 per (node, model) pair (tracemalloc), and one model's state as the
  worker stores it (``table_values.pack_value``) against its plain JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import json
import math
import os
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Iterator

import numpy as np

from bench.timing import best, best_alternating, row
from tailguard.collector import collect_if_due, collector_paused, fewer_full_collections
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import Heartbeat, SampleBatch, decode
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.replay.detector import FLEET_QUANTILES, Detector
from tailguard.core.replay.replay import replay
from tailguard.streaming.table_values import MAX_VALUE_BYTES, pack_value

T0 = 1_764_680_000.0


def trace_lines(n: int, nodes: int = 100, seed: int = 0) -> list[bytes]:
    """``n`` JSON lines: ``nodes`` nodes × 2 models, one slow node, 1 % bad lines."""
    rng = np.random.default_rng(seed)
    rate = 1000.0                                   # events/s over the whole fleet
    ts = T0 + np.arange(n) / rate + rng.uniform(0, 0.5, n)      # slightly out of order
    node = rng.integers(0, nodes, n)
    model = rng.integers(0, 2, n)
    lat = np.where(model == 0, 1.5e6, 5e3) * np.exp(rng.normal(0, 0.3, n))
    lat[(node == 7) & (ts > T0 + n / rate / 2)] *= 3.0
    bad = rng.uniform(size=n) < 0.01
    models = ("llama-3-70b", "embed")
    out = []
    for t, nd, m, v, b in zip(ts.tolist(), node.tolist(), model.tolist(), lat.tolist(),
                              bad.tolist(), strict=True):
        if b:
            out.append(b'{"node_id": "gpu-x", "latency_us": -1}')
            continue
        out.append(f'{{"node_id": "gpu-{nd:03d}", "model": "{models[m]}", "latency_us": {v:.1f}, '
                   f'"ts": {t:.6f}, "hardware": "A100"}}'.encode())
    return out


def batch_trace_lines(n: int, nodes: int = 100, per_batch: int = 5, seed: int = 0) -> list[bytes]:
    """``n`` JSON lines, each (node, model) of ``nodes`` nodes × 2 models sending a batch of
    ``per_batch`` samples a second and a heartbeat every 10 s (one line in 11), one slow node,
    in time order: every line takes ``Replay.take_line``, the per-line path."""
    rng = np.random.default_rng(seed)
    models = ("llama-3-70b", "embed")
    out: list[bytes] = []
    second = 0
    while len(out) < n:
        t = T0 + second
        for nd in range(nodes):
            for m, name in enumerate(models):
                node = f"gpu-{nd:03d}"
                if second % 10 == 0:
                    out.append(f'{{"type": "heartbeat", "node_id": "{node}", "model": "{name}", '
                               f'"hardware": "A100", "ts": {t:.6f}}}'.encode())
                lat = (1.5e6 if m == 0 else 5e3) * np.exp(rng.normal(0, 0.3, per_batch))
                if nd == 7 and second > n // (2 * nodes * 2):
                    lat *= 3.0
                tss = t + np.sort(rng.uniform(0, 1, per_batch))
                samples = ", ".join(f"[{a:.6f}, {b:.1f}]" for a, b in zip(tss.tolist(), lat.tolist(), strict=True))
                out.append(f'{{"node_id": "{node}", "model": "{name}", "hardware": "A100", '
                           f'"samples": [{samples}]}}'.encode())
        second += 1
    return out[:n]


def bench_replay_batches(quick: bool) -> None:
    """Replay of a batch-and-heartbeat trace (the per-line path), against decoding and
    observing one line at a time (:func:`naive_replay`) on the same lines."""
    n = 40_000 if quick else 200_000
    lines = batch_trace_lines(n)
    settings = DetectorSettings()
    samples = sum(line.count(b"], [") + 1 for line in lines if b'"samples"' in line)

    def run() -> None:
        replay(lines, settings, lambda _line: None,
               detector=Detector(settings, pause_collector=collector_paused))

    both = best_alternating({"replay": run, "naive": lambda: naive_replay(lines, settings)}, 3)
    t, t_naive = both["replay"], both["naive"]
    print(f"tailguard replay of {n:,} batch and heartbeat lines ({samples:,} samples, 200 series)")
    row("replay (per-line path)", f"{n / t:,.0f} lines/s",
        f"{samples / t:,.0f} samples/s; {t_naive / t:4.2f}x naive decode + observe per line")


def naive_replay(lines: list[bytes], settings: DetectorSettings) -> int:
    """Decode and observe one event at a time; evaluate each crossed boundary."""
    det = Detector(settings)
    k: int | None = None
    out = 0
    for raw in lines:
        try:
            ev = decode(raw)
        except BadEvent:
            continue
        ts = ev.ts if not isinstance(ev, SampleBatch) else float(ev.ts.max())
        if k is None:
            k = math.floor(ts / settings.tick_interval_s) + 1
        while ts >= k * settings.tick_interval_s:
            out += len(det.evaluate(k * settings.tick_interval_s).transitions)
            k += 1
        det.observe([ev])
    return out


def seed_transcription(lines: list[bytes], *, tick_s: float = 30.0, window: int = 1000,
                       min_samples: int = 100, ratio_threshold: float = 3.0, confirm: int = 3,
                       relative_p50_factor: float = 2.0, min_peers: int = 3) -> int:
    """The original algorithm (the seed) transcribed to plain Python; returns its state changes.

    Per (node, model) a deque of the last ``window`` latencies; at every ``tick_s`` of
    event time each window of at least ``min_samples`` is sorted, P50/P99 read by index;
    P99/P50 > ``ratio_threshold`` or (with ``min_peers`` nodes of the model) P50 >
    ``relative_p50_factor`` x the model's median P50 is abnormal; ``confirm`` abnormal
    windows in a row make a node unhealthy, fewer suspect. JSON by the standard library;
    a line it cannot read is skipped. The replay's baseline (issue 14).
    """
    windows: dict[tuple[str, str], collections.deque[float]] = {}
    run: dict[tuple[str, str], int] = {}
    state: dict[tuple[str, str], str] = {}
    changes = 0
    next_tick: float | None = None

    def evaluate() -> None:
        nonlocal changes
        by_model: dict[str, list[tuple[tuple[str, str], float, float]]] = collections.defaultdict(list)
        for key, w in windows.items():
            if len(w) < min_samples:
                continue
            s = sorted(w)
            n = len(s)
            by_model[key[1]].append((key, s[n // 2], s[min(n - 1, int(n * 0.99))]))
        for stats in by_model.values():
            med = statistics.median(p50 for _, p50, _ in stats)
            for key, p50, p99 in stats:
                bad = p99 / p50 > ratio_threshold or (
                    len(stats) >= min_peers and p50 > relative_p50_factor * med)
                r = run[key] = run.get(key, 0) + 1 if bad else 0
                new = "unhealthy" if r >= confirm else "suspect" if r else "healthy"
                if state.get(key, "healthy") != new:
                    changes += 1
                state[key] = new

    for raw in lines:
        try:
            ev = json.loads(raw)
            key = (ev["node_id"], ev["model"])
            lat, ts = float(ev["latency_us"]), float(ev["ts"])
        except (ValueError, KeyError, TypeError):
            continue
        if not lat > 0:
            continue
        if next_tick is None:
            next_tick = (ts // tick_s + 1) * tick_s
        while ts >= next_tick:
            evaluate()
            next_tick += tick_s
        w = windows.get(key)
        if w is None:
            w = windows[key] = collections.deque(maxlen=window)
        w.append(lat)
    evaluate()
    return changes


def bench_replay(quick: bool) -> None:
    n = 60_000 if quick else 300_000
    lines = trace_lines(n)
    settings = DetectorSettings()
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"\n".join(lines) + b"\n")
        path = f.name
    try:
        def from_file() -> None:
            with open(path, "rb") as fh:
                # As `tailguard replay` runs it: the garbage collector paused around each summary pass.
                replay(fh, settings, lambda _line: None,
                       detector=Detector(settings, pause_collector=collector_paused))

        both = best_alternating({"replay": from_file,
                                 "seed": lambda: seed_transcription(lines)}, 3)
        t, t_seed = both["replay"], both["seed"]
        t_naive = best(lambda: naive_replay(lines[: n // 5], settings), 1) * 5
    finally:
        os.unlink(path)
    print(f"tailguard replay over a {n:,}-line file (200 series, 1 % bad lines, out of order)")
    row("replay (Accumulator batches, event-time ticks)", f"{n / t:,.0f} ev/s",
        f"{(n / t) / 150_000:4.2f}x the 150k/s target")
    row("baseline: the seed's algorithm in plain Python", f"{n / t_seed:,.0f} ev/s",
        f"replay is {t_seed / t:4.2f}x it (target >= 2)")
    row("naive: decode + observe per event (est. from 1/5)", f"{n / t_naive:,.0f} ev/s",
        f"replay is {t_naive / t:4.1f}x faster")


def summaries_for(models: int, nodes: int, rng: np.random.Generator) -> dict[str, list[WindowSummary]]:
    out: dict[str, list[WindowSummary]] = {}
    for m in range(models):
        name = f"model-{m}"
        p50 = 1e5 * np.exp(rng.normal(0, 0.05, nodes))
        ratio = 2.0 * np.exp(rng.normal(0, 0.05, nodes))
        out[name] = [WindowSummary(node_id=f"gpu-{i:04d}", model=name, tick_ts=0.0, signal="latency",
                                   samples=1000, p50=float(a), p99=float(a * r),
                                   latency_p50_us=float(a), latency_p99_us=float(a * r),
                                   hardware="A100", first_seen_ts=0.0)
                     for i, (a, r) in enumerate(zip(p50, ratio, strict=True))]
    return out


def _stage2_tick(ev: FleetEvaluator, summ: dict[str, list[WindowSummary]], now: list[float],
                 with_statuses: bool) -> None:
    now[0] += 30.0
    for m, s in summ.items():
        ev.evaluate(m, s, now[0], with_statuses=with_statuses)


def bench_stage2(quick: bool) -> None:
    series = 2_000 if quick else 10_000
    rng = np.random.default_rng(1)
    print(f"one tick at {series:,} (node, model) series")
    for models, nodes in ((series // 100, 100), (10, series // 10)):
        summ = summaries_for(models, nodes, rng)
        ev = FleetEvaluator(DetectorSettings())
        for m, s in summ.items():           # first sight + warm-up, then steady state
            ev.evaluate(m, s, T0)
            ev.evaluate(m, s, T0 + 30)
        now = [T0 + 60]
        t_plain = best(functools.partial(_stage2_tick, ev, summ, now, False))
        t_stat = best(functools.partial(_stage2_tick, ev, summ, now, True))
        row(f"stage 2 evaluate, {models} models x {nodes} nodes", f"{t_plain * 1e3:8.1f} ms",
            f"{t_plain / series * 1e6:.2f} µs/series; with statuses {t_stat * 1e3:.1f} ms")
        # Routing weights (the default) against TAILGUARD_WEIGHTS=off, alternated in one run.
        runs = {}
        for mode in ("off", "enforce"):
            e = FleetEvaluator(DetectorSettings(weights=mode))
            for m, s in summ.items():
                e.evaluate(m, s, T0)
                e.evaluate(m, s, T0 + 30)
            runs[mode] = functools.partial(_stage2_tick, e, summ, [T0 + 60], False)
        t = best_alternating(runs)
        row("  routing weights on / off", f"{t['enforce'] / t['off']:8.2f} x",
            f"off {t['off'] * 1e3:.1f} ms, on {t['enforce'] * 1e3:.1f} ms")


def steady_detector(series: int, window: int = 1000, nodes: int = 100,
                    ) -> tuple[Detector, float, list[np.ndarray]]:
    """A façade in steady state: ``series`` healthy pairs (models of ``nodes``, the last model
    fewer when ``series`` is not a multiple) past warm-up, each with a full window of fresh
    samples; the detector, its last tick and the latencies."""
    models = -(-series // nodes)
    rng = np.random.default_rng(2)
    settings = DetectorSettings(window_size=window)
    det = Detector(settings)
    # Steady state: every pair first seen (a heartbeat) long enough ago that warm-up and its
    # cut-off are over, then a full window of fresh samples: healthy pairs, clean rings.
    for m in range(models):
        for i in range(min(nodes, series - m * nodes)):
            det.observe([Heartbeat(f"gpu-{i:03d}", f"model-{m}", "A100", T0)])
    det.evaluate(T0)
    t_full = T0 + settings.warmup_s + settings.max_sample_age_s + 60.0
    ts = t_full - 50.0 + np.arange(window) * 0.05
    ok = np.ones(window, bool)
    probe = np.zeros(window, bool)
    raw: list[np.ndarray] = []
    for m in range(models):
        for i in range(min(nodes, series - m * nodes)):
            lat = 1e5 * np.exp(rng.normal(0, 0.3, window))
            raw.append(lat)
            det.observe([SampleBatch(f"gpu-{i:03d}", f"model-{m}", "A100", ts, lat, ok, probe)])
    det.evaluate(t_full)
    healthy = sum(s.state == "healthy" for s in det.statuses())
    assert healthy == series, f"bench set-up: {healthy} of {series} pairs healthy"
    return det, t_full, raw


@contextlib.contextmanager
def worker_collector(det: Detector) -> Iterator[None]:
    """The worker's collector policy around ``det``'s ticks: ``collector_paused`` as the
    façade's ``pause_collector`` (the façade enters it around its whole tick, stage 1's
    summary pass nested; the worker, :mod:`tailguard.streaming.ingest` and ``ticker``, around
    stage 1's summary pass and around each model's stage-2 evaluation: between them its
    collector may walk the summaries once), its own full passes only after
    ``FULL_COLLECTION_EVERY`` middle ones (``fewer_full_collections``, as
    ``tailguard.streaming.worker`` sets); the worker's full pass after each stage-2 tick
    (``collect_if_due(FULL_PASS_AFTER)``) is the caller's to time."""
    from tailguard.streaming.worker import FULL_COLLECTION_EVERY

    thresholds = gc.get_threshold()
    det.pause_collector = det.store.pause_collector = collector_paused
    fewer_full_collections(FULL_COLLECTION_EVERY)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        det.pause_collector = det.store.pause_collector = contextlib.nullcontext


def bench_facade(quick: bool) -> None:
    from tailguard.streaming.service import FULL_PASS_AFTER

    series = 2_000 if quick else 10_000
    window = 1000
    nodes = 100
    models = series // nodes
    det, t_full, raw = steady_detector(series, window, nodes)
    now = [t_full]
    full_pass = [float("inf")]

    def tick_default() -> None:         # Python's default collector, as the façade has it
        now[0] += 0.001            # stays inside the age bound: every window is judged
        det.evaluate(now[0], with_statuses=False)

    def tick() -> None:                 # the worker's collector policy
        with worker_collector(det):
            tick_default()

    def after_tick() -> None:           # the worker's pass after its stage-2 tick, timed apart
        t0 = time.process_time()
        if collect_if_due(FULL_PASS_AFTER):
            full_pass[0] = min(full_pass[0], time.process_time() - t0)

    def seed_sketch() -> None:
        """The seed's design: sort each window, index P50/P99, compare in Python."""
        flagged = 0
        for k in range(models):
            p50s = []
            ratios = []
            for lat in raw[k * nodes:(k + 1) * nodes]:
                s = np.sort(lat)
                p50 = s[round(0.5 * (window - 1))]
                p99 = s[round(0.99 * (window - 1))]
                p50s.append(p50)
                ratios.append(p99 / p50)
            med = float(np.median(p50s))
            flagged += sum(1 for p, r in zip(p50s, ratios, strict=True) if r > 3.0 or p > 2 * med)

    keys = np.stack(raw).astype(np.float32).view(np.uint32)

    def sort_floor() -> None:               # what no from-scratch exact tick can skip
        np.sort(keys, axis=1)

    def summaries_only() -> None:
        now[0] += 0.001
        with worker_collector(det):
            det.store.summaries(now[0], det.evaluator.judge_since_all(now[0]))

    def fleet_quantiles() -> None:          # what the tick does: pools, exact P50/P99
        for pool in det.store.model_pools(now[0], per_series=det.fleet_digest_per_series,
                                          qs=FLEET_QUANTILES).values():
            pool.quantiles(FLEET_QUANTILES)

    def digests_only() -> None:             # on demand: the pools as mergeable digests
        det.store.model_digests(now[0], per_series=det.fleet_digest_per_series)

    def digests_per_series() -> None:       # the alternative: one digest per series, merged
        det.store.summaries(now[0], digests=True)

    det.fleet_digest_per_series = 0
    t_off = best(tick, 3)
    det.fleet_digest_per_series = Detector.fleet_digest_per_series
    # The tick and its baseline in turn, best of 7 each (the ratio is the target).
    both = best_alternating({"tick": tick, "after": after_tick, "default": tick_default,
                             "seed": seed_sketch, "floor": sort_floor}, 7)
    t, t_default, t_seed, t_floor = both["tick"], both["default"], both["seed"], both["floor"]
    t_s1 = best(summaries_only, 3)
    t_fleet = best(fleet_quantiles, 3)
    t_dig = best(digests_only, 3)
    t_dig_series = best(digests_per_series, 1)
    print(f"whole tick through the façade at {series:,} series x {window} samples, "
          "under the worker's collector policy (paused in the tick, full pass after it)")
    row("Detector.evaluate (summaries + stage 2)", f"{t * 1e3:8.1f} ms",
        f"{t / t_floor:.2f}x the floor below (target <= 2.5x at 10k); {t / series * 1e6:.2f} µs/series")
    row("  the worker's full collector pass after it", f"{full_pass[0] * 1e3:8.1f} ms",
        "collect_if_due(FULL_PASS_AFTER) after each stage-2 tick, not in the tick")
    row("  the same tick under Python's default collector", f"{t_default * 1e3:8.1f} ms",
        f"{t_default / t_floor:.2f}x the floor")
    row("  of which stage 1 (WindowStore.summaries)", f"{t_s1 * 1e3:8.1f} ms",
        f"stage 2 share {max(0.0, t - t_s1 - t_fleet) * 1e3:.1f} ms")
    row("  of which cluster P50/P99 per model (pools)", f"{t_fleet * 1e3:8.1f} ms",
        f"{t_fleet / series * 1e6:.2f} µs/series")
    row("  the same tick without them (fleet_digest_per_series=0)", f"{t_off * 1e3:8.1f} ms",
        f"cluster figures add {max(0.0, t - t_off) / t_off:.0%}")
    row("cluster digests on demand (WindowStore.model_digests)", f"{t_dig * 1e3:8.1f} ms",
        f"one digest per series, merged (summaries(digests=True)) {t_dig_series * 1e3:.0f} ms: "
        f"{t_dig_series / t_dig:.0f}x more")
    row("seed sketch: np.sort per window + Python rules", f"{t_seed * 1e3:8.1f} ms",
        f"façade is {t_seed / t:4.2f}x it (target >= 1.5x and <= 50 ms)")
    row("floor: one uint32 sort of every window (np.sort)", f"{t_floor * 1e3:8.1f} ms",   # alternated
        f"{t_floor / t:.0%} of the tick; 1.5x the sketch = a tick in "
        f"{t_seed / 1.5 / t_floor:.2f}x this sort")


def series_memory(series: int) -> tuple[int, int, int]:
    """A façade's memory in steady state at ``series`` series (tracemalloc, numpy included; call
    :func:`steady_detector` once before: imports and caches are not per series): bytes in all,
    in its ring slabs (``WindowStore.nbytes``) and the slabs' sample slots."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    det, now, raw = steady_detector(series)
    raw.clear()                              # the benchmark's copy of the latencies
    for k in range(1, 3):
        det.evaluate(now + 30.0 * k)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    slots = sum(ch.rows * ch.cap for tier in det.store.tiers.slabs_by_tier.values() for ch in tier)
    return used, det.store.nbytes(), slots


def bench_series_memory(quick: bool, sizes: tuple[int, ...] = ()) -> None:
    """Stage 1 + 2's memory per series in steady state (:func:`series_memory`) at each of
    ``sizes`` (default: 2,000 quick; else 2,045 — a 2,048-ring slab just begun, the worst case
    of the slabs' empty rows — and 10,000):
    the ring slabs per sample slot, and everything else per series, beside the 16 B a sample
    takes on the binary wire (docs/contracts-binary.md) and the layout before 2026-12-05 (12 B);
    with several sizes, the worst."""
    sizes = sizes or ((2_000,) if quick else (2_045, 10_000))
    steady_detector(200)                     # imports and caches first: not per series
    worst = (0.0, 0)
    for series in sizes:
        used, ring, slots = series_memory(series)
        worst = max(worst, ((used - ring) / series, series))
        print(f"memory per series, façade in steady state at {series:,} series x 1000 samples")
        row("ring slabs per sample slot (WindowStore.nbytes)", f"{ring / slots:8.2f} B",
            f"binary wire 16 B/sample ({16 * slots / ring:.1f}x); float64+float32 layout 12 B "
            f"({12 * slots / ring:.2f}x); target <= 8 B")
        row("everything else per series (tracemalloc - slabs)", f"{(used - ring) / series:8,.0f} B",
            f"target <= 2,048 B; slabs {ring / series:,.0f} B/series "
            f"({slots / series:,.0f} slots, {slots / series / 1000 - 1:.1%} free)")
    if len(sizes) > 1:
        row("everything else per series, the worst of those", f"{worst[0]:8,.0f} B",
            f"at {worst[1]:,} series; target <= 2,048 B")


def bench_memory(quick: bool) -> None:
    pairs = 2_000 if quick else 10_000
    summ = summaries_for(pairs // 100, 100, np.random.default_rng(3))
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    ev = FleetEvaluator(DetectorSettings())
    for m, s in summ.items():
        ev.evaluate(m, s, T0, with_statuses=False)
        ev.evaluate(m, s, T0 + 200, with_statuses=False)
    used = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(base, "filename"))
    tracemalloc.stop()
    snap = len(json.dumps(ev.snapshot()))
    print(f"stage 2 memory at {pairs:,} pairs")
    row("FleetEvaluator state (tracemalloc)", f"{used / pairs:,.0f} B/pair",
        f"snapshot as JSON {snap / pairs:,.0f} B/pair")
    # One model's state as the worker stores it in its changelog table (one Kafka message).
    big = summaries_for(1, pairs, np.random.default_rng(4))
    one = FleetEvaluator(DetectorSettings())
    for m, s in big.items():
        for k in range(3):
            one.evaluate(m, s, T0 + 30.0 * k, with_statuses=False)
    model_snap = one.snapshot_model("model-0")
    plain = len(json.dumps(model_snap, separators=(",", ":")))
    t_pack = best(lambda: pack_value(model_snap), 3)
    packed = pack_value(model_snap)[1]
    row(f"one {pairs:,}-node model's stored state (pack_value)", f"{packed / pairs:,.0f} B/pair",
        f"plain JSON {plain / pairs:,.0f} B/pair ({plain / packed:.1f}x); packing "
        f"{t_pack * 1e3:.0f} ms; {MAX_VALUE_BYTES * pairs // packed:,} pairs fit in one value")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (seconds, not minutes)")
    args = ap.parse_args(argv)
    bench_replay(args.quick)
    bench_replay_batches(args.quick)
    bench_stage2(args.quick)
    bench_facade(args.quick)
    bench_series_memory(args.quick)
    bench_memory(args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
