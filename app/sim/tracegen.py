"""Deterministic latency-event traces from a scenario, for ``tailguard replay``.

:func:`generate` draws every (node, model) stream of a :class:`Scenario`
(Poisson arrivals at the node's rate, thinned by ``traffic`` faults; one
latency sample per request from :meth:`Scenario.latency`) into a
:class:`Trace` of numpy arrays; :func:`write` renders it as the contract's
event JSON lines (ARCHITECTURE.md), either one event per request
(``single``) or one batch event per stream per ``batch_s`` (``batch``), plus
heartbeats. Event time is ``scenario.epoch_s`` + seconds since the start,
``ts`` is the request's completion; lines are in event-time order, a node's placed
``delivery_lag_s`` later (events that reach the detector late, their ``ts`` unchanged).

Guarantees: the same scenario and seed give byte-identical output; each
stream has its own generator (:func:`~tailguard.sim.latency.node_rng`), so
adding a node or a fault never changes the other streams' samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, TextIO

import numpy as np

from tailguard.sim.latency import BoolArray, FloatArray, IntArray, node_rng
from tailguard.sim.scenario import Scenario

Format = Literal["single", "batch"]


@dataclass(frozen=True, slots=True, eq=False)
class Stream:
    """All requests of one (node, model), sorted by completion time."""

    node_id: str
    model: str
    hardware: str
    start_s: float
    t_s: FloatArray                 # completion, seconds since the scenario's start
    latency_us: FloatArray
    ok: BoolArray
    probe: BoolArray
    input_tokens: IntArray | None
    output_tokens: IntArray | None
    ttft_us: FloatArray | None

    def __len__(self) -> int:
        return int(self.t_s.shape[0])

    def take(self, idx: IntArray) -> Stream:
        """The requests at positions ``idx``."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return Stream(self.node_id, self.model, self.hardware, self.start_s, self.t_s[idx],
                      self.latency_us[idx], self.ok[idx], self.probe[idx], pick(self.input_tokens),
                      pick(self.output_tokens), pick(self.ttft_us))


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    scenario: Scenario
    seed: int
    streams: tuple[Stream, ...]

    @property
    def requests(self) -> int:
        return sum(len(s) for s in self.streams)


def arrivals(rng: np.random.Generator, rate_per_s: float, start_s: float, end_s: float) -> FloatArray:
    """Sorted Poisson arrival times on ``[start_s, end_s)``."""
    span = max(0.0, end_s - start_s)
    n = int(rng.poisson(rate_per_s * span))
    return np.sort(start_s + span * rng.random(n))


def generate(scenario: Scenario, seed: int | None = None) -> Trace:
    """Draw every stream of ``scenario`` (``seed`` defaults to the scenario's)."""
    seed = scenario.seed if seed is None else seed
    streams: list[Stream] = []
    for i, j, node, model in scenario.streams():
        rng = node_rng(seed, i, j)
        peak = scenario.max_rate_factor(node.node_id, model.name)
        end_s = scenario.duration_s if node.leave_s is None else min(node.leave_s, scenario.duration_s)
        t = arrivals(rng, scenario.rate_of(node, model) * peak, node.join_s, end_s)
        if peak != 1.0:
            keep = rng.random(t.shape[0]) < scenario.rate_factor(node.node_id, model.name, t) / peak
            t = t[keep]
        probe = np.zeros(t.shape[0], dtype=np.bool_)
        if scenario.probe_rate_per_s > 0:
            tp = arrivals(rng, scenario.probe_rate_per_s, node.join_s, end_s)
            t = np.concatenate([t, tp])
            probe = np.concatenate([probe, np.ones(tp.shape[0], dtype=np.bool_)])
        d = scenario.latency(node.node_id, model.name).sample(rng, t)
        done = t + d.latency_us / 1e6
        order = np.argsort(done, kind="stable")
        order = order[done[order] < scenario.duration_s]
        # A node that left or is silent sends nothing: what completes then is never reported.
        order = order[scenario.reporting(node.node_id, model.name, done[order])]

        def pick(a: np.ndarray | None, order: np.ndarray = order) -> np.ndarray | None:
            return None if a is None else a[order]

        streams.append(Stream(node.node_id, model.name, node.hardware, node.join_s, done[order],
                              d.latency_us[order], d.ok[order], probe[order], pick(d.input_tokens),
                              pick(d.output_tokens), pick(d.ttft_us)))
    return Trace(scenario, seed, tuple(streams))


def _head(s: Stream, scenario: Scenario, t_s: float | None = None) -> str:
    """The series fields of a line; with ``emit_instance``, the instance at ``t_s``."""
    hw = f', "hardware": {json.dumps(s.hardware)}' if scenario.emit_hardware else ""
    inst = ""
    if scenario.emit_instance:
        inst = f', "instance": {json.dumps(scenario.instance_of(s.node_id, s.model, t_s or 0.0))}'
    return f'"node_id": {json.dumps(s.node_id)}, "model": {json.dumps(s.model)}{hw}{inst}'


def _heads(s: Stream, scenario: Scenario, t_s: list[float]) -> list[str]:
    """``_head`` per line: the same string unless instances change along the stream."""
    if not scenario.emit_instance:
        return [_head(s, scenario)] * len(t_s)
    return [_head(s, scenario, t) for t in t_s]


def _heartbeats(trace: Trace, every_s: float) -> tuple[list[float], list[str]]:
    sc = trace.scenario
    ts: list[float] = []
    lines: list[str] = []
    if every_s <= 0:
        return ts, lines
    for s in trace.streams:
        beats = np.arange(s.start_s, sc.duration_s, every_s)
        beats = beats[sc.reporting(s.node_id, s.model, beats)].tolist()
        lag = sc.node(s.node_id).delivery_lag_s
        for t, head in zip(beats, _heads(s, sc, beats), strict=True):
            ts.append(t + lag)
            lines.append(f'{{"type": "heartbeat", {head}, "ts": {sc.epoch_s + t:.6f}}}')
    return ts, lines


def _single_lines(s: Stream, scenario: Scenario) -> list[str]:
    if not scenario.emit_instance or not len(s):
        return _single_lines_one(s, scenario)
    # One run of lines per process life (instances change at the end of each restart fault).
    ends = sorted(f.end_s for f in scenario.faults if f.kind == "restart" and f.end_s is not None
                  and f.applies(s.node_id, s.model))
    life = np.searchsorted(np.asarray(ends, dtype=np.float64), s.t_s, side="right")
    out: list[str] = []
    for k in np.unique(life).tolist():
        out += _single_lines_one(s.take(np.flatnonzero(life == k)), scenario)
    return out


def _single_lines_one(s: Stream, scenario: Scenario) -> list[str]:
    head = _head(s, scenario, float(s.t_s[0]) if len(s) else None)
    ts = (s.t_s + scenario.epoch_s).tolist()
    lat = np.rint(s.latency_us).astype(np.int64).tolist()
    ok = np.where(s.probe, np.where(s.ok, "true, \"probe\": true", "false, \"probe\": true"),
                  np.where(s.ok, "true", "false")).tolist()
    if scenario.emit_tokens and s.input_tokens is not None and s.output_tokens is not None:
        inp, out = s.input_tokens.tolist(), s.output_tokens.tolist()
        if scenario.emit_ttft and s.ttft_us is not None:
            tt = np.rint(s.ttft_us).astype(np.int64).tolist()
            return [f'{{{head}, "latency_us": {a}, "ts": {b:.6f}, "ok": {c}, "input_tokens": {d}, '
                    f'"output_tokens": {e}, "ttft_us": {f}}}'
                    for a, b, c, d, e, f in zip(lat, ts, ok, inp, out, tt, strict=True)]
        return [f'{{{head}, "latency_us": {a}, "ts": {b:.6f}, "ok": {c}, "input_tokens": {d}, '
                f'"output_tokens": {e}}}' for a, b, c, d, e in zip(lat, ts, ok, inp, out, strict=True)]
    return [f'{{{head}, "latency_us": {a}, "ts": {b:.6f}, "ok": {c}}}'
            for a, b, c in zip(lat, ts, ok, strict=True)]


def _batch_lines(s: Stream, scenario: Scenario, batch_s: float) -> tuple[list[float], list[str]]:
    """One batch event per ``batch_s`` of completion time for the ordinary requests; failed
    and probe requests as single events."""
    ts_out: list[float] = []
    lines: list[str] = []
    plain = s.ok & ~s.probe
    good = np.flatnonzero(plain)
    rest = s.take(np.flatnonzero(~plain))
    ts_all = (s.t_s + scenario.epoch_s).tolist()
    lat = np.rint(s.latency_us).astype(np.int64).tolist()
    with_tokens = scenario.emit_tokens and s.input_tokens is not None and s.output_tokens is not None
    if with_tokens:
        assert s.input_tokens is not None and s.output_tokens is not None
        inp, out = s.input_tokens.tolist(), s.output_tokens.tolist()
        tt: list[int] | None = None
        if scenario.emit_ttft and s.ttft_us is not None:
            tt = np.rint(s.ttft_us).astype(np.int64).tolist()
    bucket = np.floor(s.t_s[good] / batch_s).astype(np.int64)
    cuts = np.flatnonzero(np.diff(bucket)) + 1
    for chunk in np.split(good, cuts):
        if chunk.shape[0] == 0:
            continue
        parts: list[str] = []
        for k in chunk.tolist():
            if with_tokens:
                last = f"{tt[k]}" if tt is not None else "null"
                parts.append(f"[{ts_all[k]:.6f}, {lat[k]}, {inp[k]}, {out[k]}, {last}]")
            else:
                parts.append(f"[{ts_all[k]:.6f}, {lat[k]}]")
        ts_out.append(float(s.t_s[chunk[-1]]))
        head = _head(s, scenario, float(s.t_s[chunk[0]]))
        lines.append(f'{{{head}, "samples": [{", ".join(parts)}]}}')
    ts_out += rest.t_s.tolist()
    lines += _single_lines(rest, scenario)
    return ts_out, lines


def lines(trace: Trace, *, fmt: Format = "single", batch_s: float = 1.0,
          heartbeat_s: float = 10.0) -> Iterator[str]:
    """The trace as JSON lines (without newlines), in event-time order."""
    if fmt not in ("single", "batch"):
        raise ValueError(f"fmt must be 'single' or 'batch', got {fmt!r}")
    if not batch_s > 0:
        raise ValueError(f"batch_s must be > 0, got {batch_s!r}")
    sc = trace.scenario
    all_ts: list[float] = []
    all_lines: list[str] = []
    hb_ts, hb_lines = _heartbeats(trace, heartbeat_s)
    all_ts += hb_ts
    all_lines += hb_lines
    for s in trace.streams:
        lag = sc.node(s.node_id).delivery_lag_s    # its lines placed that much later, ts unchanged
        if fmt == "single":
            all_ts += (s.t_s + lag).tolist() if lag else s.t_s.tolist()
            all_lines += _single_lines(s, sc)
        else:
            t, ls = _batch_lines(s, sc, batch_s)
            all_ts += [x + lag for x in t] if lag else t
            all_lines += ls
    for k in np.argsort(np.asarray(all_ts), kind="stable").tolist():
        yield all_lines[k]


def write(trace: Trace, out: TextIO, *, fmt: Format = "single", batch_s: float = 1.0,
          heartbeat_s: float = 10.0) -> int:
    """Write the trace to ``out``; returns the number of lines."""
    n = 0
    buf: list[str] = []
    for line in lines(trace, fmt=fmt, batch_s=batch_s, heartbeat_s=heartbeat_s):
        buf.append(line)
        n += 1
        if len(buf) >= 8192:
            out.write("\n".join(buf) + "\n")
            buf.clear()
    if buf:
        out.write("\n".join(buf) + "\n")
    return n
