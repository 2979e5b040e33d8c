"""A scenario's requests as the histogram events a scraped server would give, for replay.

:func:`histogram_lines` turns a :class:`~tailguard.sim.tracegen.Trace` into what ``tailguard scrape``
would publish for it had every node been a server exporting latency histograms (vLLM's default
buckets, :data:`VLLM_BUCKETS`, unless told otherwise, per node if need be), scraped every
``interval_s``: per node, model and interval, the NON-cumulative bucket counts of the requests
that completed in it (``e2e`` = latency, ``ttft`` and ``itl`` — per request ``(latency - ttft) / (output_tokens - 1)``,
observed once per decoded token as vLLM does — when the trace has them), with the interval's
requests and failures; a heartbeat for an interval where a reporting node completed nothing (the
scrape answered); nothing while a node is silent. A restart (fault ``restart``) resets the
server's counters, so later events carry a new ``instance`` as the converter would give them.

Guarantees: deterministic (the trace is); lines in event-time order, as JSON text; every line
passes the contract (:func:`tailguard.core.contract.events.decode`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from tailguard.sim.exposition import VLLM_E2E, VLLM_ITL, VLLM_TTFT
from tailguard.sim.tracegen import Stream, Trace

VLLM_BUCKETS: Final[Mapping[str, tuple[float, ...]]] = {"e2e": VLLM_E2E, "ttft": VLLM_TTFT, "itl": VLLM_ITL}


def _counts(bounds: Sequence[float], values_s: np.ndarray, weights: np.ndarray | None = None) -> list[int]:
    idx = np.searchsorted(np.asarray(bounds), values_s, side="left")    # bucket i: v <= bounds[i]
    c = np.bincount(idx, weights=weights, minlength=len(bounds) + 1)
    return [round(float(x)) for x in c]


def _lives(trace: Trace, s: Stream) -> list[float]:
    """The ends of the stream's restart faults (seconds after the start), in order."""
    return sorted(f.end_s for f in trace.scenario.faults if f.kind == "restart" and f.end_s is not None
                  and f.applies(s.node_id, s.model))


def _stream_events(trace: Trace, s: Stream, interval_s: float,
                   buckets: Mapping[str, Sequence[float]]) -> list[tuple[float, str]]:
    sc = trace.scenario
    k_all = np.floor(s.t_s / interval_s).astype(np.int64)
    first = math.floor(s.start_s / interval_s)
    last = math.floor(sc.duration_s / interval_s) - 1
    scrapes = np.arange(first, last + 1, dtype=np.int64)
    scrape_s = (scrapes + 1) * interval_s
    alive = sc.reporting(s.node_id, s.model, scrape_s.astype(np.float64))
    ends = _lives(trace, s)
    head: dict[str, Any] = {"node_id": s.node_id, "model": s.model}
    if sc.emit_hardware:
        head["hardware"] = s.hardware
    lo_idx = np.searchsorted(k_all, scrapes, side="left")
    hi_idx = np.searchsorted(k_all, scrapes, side="right")
    out: list[tuple[float, str]] = []
    for t_end, on, lo, hi in zip(scrape_s.tolist(), alive.tolist(),
                                    lo_idx.tolist(), hi_idx.tolist(), strict=True):
        if not on:
            continue
        ts = sc.epoch_s + t_end
        life = sum(1 for e in ends if e <= t_end)
        base = dict(head)
        base["instance"] = f"{s.node_id}#{sc.epoch_s + ends[life - 1]:.0f}" if life else s.node_id
        if hi <= lo:
            out.append((ts, json.dumps({"type": "heartbeat", **base, "ts": ts})))
            continue
        lat_s = s.latency_us[lo:hi] / 1e6
        n = hi - lo
        failed = int(np.count_nonzero(~s.ok[lo:hi]))
        common = {"type": "histogram", **base, "ts": ts, "interval_s": interval_s,
                  "requests": n, "failed": failed}
        out.append((ts, json.dumps({**common, "metric": "e2e", "bounds_s": list(buckets["e2e"]),
                                    "counts": _counts(buckets["e2e"], lat_s),
                                    "sum_s": round(float(lat_s.sum()), 6)})))
        if s.ttft_us is None or "ttft" not in buckets:
            continue
        ttft_s = s.ttft_us[lo:hi] / 1e6
        out.append((ts, json.dumps({**common, "metric": "ttft", "bounds_s": list(buckets["ttft"]),
                                    "counts": _counts(buckets["ttft"], ttft_s),
                                    "sum_s": round(float(ttft_s.sum()), 6)})))
        if s.output_tokens is None or "itl" not in buckets:
            continue
        gaps = s.output_tokens[lo:hi].astype(np.float64) - 1.0
        many = gaps >= 1
        if not many.any():
            continue
        tpot = (lat_s[many] - ttft_s[many]) / gaps[many]
        out.append((ts, json.dumps({**common, "metric": "itl", "bounds_s": list(buckets["itl"]),
                                    "counts": _counts(buckets["itl"], tpot, gaps[many]),
                                    "sum_s": round(float((tpot * gaps[many]).sum()), 6)})))
    return out


def histogram_lines(trace: Trace, *, interval_s: float = 10.0,
                    buckets: Mapping[str, Sequence[float]] = VLLM_BUCKETS,
                    node_buckets: Mapping[str, Mapping[str, Sequence[float]]] | None = None) -> list[str]:
    """The trace's histogram events (module docstring), in event-time order. ``node_buckets``:
    other buckets for some nodes (node id -> metric -> bounds; a pod of another server version)."""
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    rows: list[tuple[float, str]] = []
    for s in trace.streams:
        rows += _stream_events(trace, s, interval_s, (node_buckets or {}).get(s.node_id, buckets))
    rows.sort(key=lambda r: r[0])
    return [line for _, line in rows]
