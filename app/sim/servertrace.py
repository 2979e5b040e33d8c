"""A scenario's requests as ``tailguard scrape`` would publish them from one kind of real server.

:func:`server_lines` plays a :class:`~tailguard.sim.tracegen.Trace` into each node's
:class:`~tailguard.sim.exposition.NodeExposition` of a server kind (``vllm``, ``sglang``, ``tgi``,
``triton``, ``dynamo``: their own metric names, buckets and counters), renders its ``/metrics``
every ``interval_s`` and converts each page with the scraper's own
:class:`~tailguard.scrape.convert.TargetConverter`, so what is replayed is what a scraped fleet
gives: Triton's counters only (a mean per interval), TGI's 1.5^k buckets and its mean time per
token per request, no ITL where a server has none. Unlike :mod:`tailguard.sim.histtrace` (vLLM's
buckets written directly) nothing is assumed about the event form. For backtests of the
histogram path (``bench/backtest_servers.py``, tests/scenarios/test_server_weights.py).

Guarantees: deterministic (the trace is); a restart fault ends a process (a fresh exposition,
the converter sees the counters go back: a new ``instance``); a node not reporting is not
scraped; lines in event-time order, as JSON text, each passing the contract.
"""

from __future__ import annotations

import json

import numpy as np

from tailguard.scrape.convert import Target, TargetConverter
from tailguard.sim.exposition import SERVERS, NodeExposition
from tailguard.sim.tracegen import Stream, Trace


def _node_lines(trace: Trace, streams: list[Stream], server: str, interval_s: float) -> list[tuple[float, str]]:
    sc = trace.scenario
    first = streams[0]
    conv = TargetConverter(Target(first.node_id, model=first.model, hardware=first.hardware, profile=server))
    expo: NodeExposition | None = None
    life: str | None = None
    out: list[tuple[float, str]] = []
    start_k = int(np.floor(min(s.start_s for s in streams) / interval_s))
    last_k = int(np.floor(sc.duration_s / interval_s)) - 1
    for k in range(start_k, last_k + 1):
        t0, t1 = k * interval_s, (k + 1) * interval_s
        on = any(bool(sc.reporting(s.node_id, s.model, np.array([t1]))[0]) for s in streams)
        now_life = sc.instance_of(first.node_id, first.model, t1)
        if expo is None or now_life != life:
            expo, life = NodeExposition(server), now_life
        for s in streams:
            lo, hi = np.searchsorted(s.t_s, [t0, t1], side="left")
            if hi > lo:
                ttft = None if s.ttft_us is None else s.ttft_us[lo:hi] / 1e6
                toks = None if s.output_tokens is None else s.output_tokens[lo:hi]
                expo.observe(s.model, s.latency_us[lo:hi] / 1e6, s.ok[lo:hi], ttft, toks)
        if not on:
            continue
        ts = sc.epoch_s + t1
        text, _ = expo.render()
        for ev in conv.observe(text.decode(), ts):
            out.append((ts, json.dumps(ev)))
    return out


def server_lines(trace: Trace, server: str, *, interval_s: float = 10.0) -> list[str]:
    """The trace's events as scraped from ``server`` servers (module docstring), in time order."""
    if server not in SERVERS:
        raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {server!r}")
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    by_node: dict[str, list[Stream]] = {}
    for s in trace.streams:
        by_node.setdefault(s.node_id, []).append(s)
    rows: list[tuple[float, str]] = []
    for streams in by_node.values():
        rows += _node_lines(trace, streams, server, interval_s)
    rows.sort(key=lambda r: r[0])
    return [line for _, line in rows]
