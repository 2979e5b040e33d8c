"""Deterministic scenario traces for the detector, as latency-event JSON lines.

A trace is a set of :class:`Node` series (one per (node, model)); each has a
base latency distribution (lognormal with a chosen P50 and P99/P50) and
:class:`Mod` effects switched on over event-time intervals. ``lines()``
merges every series by event time (with a little arrival jitter, so the
trace is slightly out of order, as real streams are) and renders the
contract's JSON, single or batch form. ``run()`` feeds the lines through the
same code path as ``tailguard replay`` and returns its parsed output.

Everything is driven by one ``numpy`` seed: the same scenario always gives
the same bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.detector import Detector
from tailguard.core.replay.replay import ReplayStats, replay

T0 = 1_764_680_000.0          # a tick boundary (multiple of 30 s)
Z99 = 2.3263478740408408      # standard normal 99th percentile


@dataclass(frozen=True)
class Mod:
    """An effect on a series between ``start_s`` and ``end_s`` (seconds after T0).

    kind: ``slow`` multiplies every latency by ``factor``; ``tail`` multiplies
    a random ``fraction`` of requests by ``factor``; ``warm`` multiplies by a
    factor that decays linearly from ``factor`` to 1 over the interval;
    ``probe`` marks the samples as probe traffic and thins them to ``fraction``.
    """

    kind: str
    start_s: float
    end_s: float = math.inf
    factor: float = 1.0
    fraction: float = 1.0


@dataclass(frozen=True)
class Node:
    node_id: str
    model: str = "llm"
    hardware: str | None = "A100"
    p50_us: float = 100_000.0
    ratio: float = 2.0              # healthy P99/P50
    rate_rps: float = 20.0
    start_s: float = 0.0
    end_s: float | None = None
    mods: tuple[Mod, ...] = ()


@dataclass
class Scenario:
    name: str
    nodes: Sequence[Node]
    duration_s: float
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    batch_every_s: float = 0.0      # >0: emit the batch form, one message per node per period
    jitter_s: float = 0.5           # arrival order disorder

    def detector_settings(self) -> DetectorSettings:
        return DetectorSettings().replace(**self.settings)

    def lines(self) -> list[bytes]:
        rng = np.random.default_rng(self.seed)
        rows: list[tuple[float, float, bytes]] = []    # (arrival, ts, line)
        for node in self.nodes:
            rows.extend(self._series(node, rng))
        rows.sort(key=lambda r: (r[0], r[1]))
        return [r[2] for r in rows]

    def _series(self, node: Node, rng: np.random.Generator) -> list[tuple[float, float, bytes]]:
        end = self.duration_s if node.end_s is None else min(node.end_s, self.duration_s)
        n = int(rng.poisson(node.rate_rps * max(0.0, end - node.start_s)))
        rel = np.sort(rng.uniform(node.start_s, end, n))
        sigma = math.log(node.ratio) / Z99
        lat = node.p50_us * np.exp(rng.normal(0.0, sigma, n))
        probe = np.zeros(n, dtype=bool)
        keep = np.ones(n, dtype=bool)
        for m in node.mods:
            on = (rel >= m.start_s) & (rel < m.end_s)
            if m.kind == "slow":
                lat[on] *= m.factor
            elif m.kind == "tail":
                lat[on & (rng.uniform(size=n) < m.fraction)] *= m.factor
            elif m.kind == "warm":
                span = max(1e-9, min(m.end_s, end) - m.start_s)
                lat[on] *= 1.0 + (m.factor - 1.0) * (1.0 - (rel[on] - m.start_s) / span)
            elif m.kind == "probe":
                probe[on] = True
                keep &= ~on | (rng.uniform(size=n) < m.fraction)
            else:
                raise ValueError(f"unknown mod kind {m.kind!r}")
        rel, lat, probe = rel[keep], lat[keep], probe[keep]
        ts = T0 + rel
        arrival = ts + rng.uniform(0.0, self.jitter_s, rel.size)
        out: list[tuple[float, float, bytes]] = []
        if self.batch_every_s > 0:
            bucket = np.floor(rel / self.batch_every_s)
            for b in np.unique(bucket):
                sel = (bucket == b) & ~probe
                if sel.any():
                    msg = {"node_id": node.node_id, "model": node.model, "hardware": node.hardware,
                           "samples": [[round(float(t), 6), round(float(v), 1)]
                                       for t, v in zip(ts[sel], lat[sel], strict=True)]}
                    last = float(arrival[sel].max())
                    out.append((last, last, json.dumps(msg).encode()))
                for i in np.flatnonzero((bucket == b) & probe):
                    out.append(self._single(node, ts[i], lat[i], True, arrival[i]))
            return out
        head = json.dumps({"node_id": node.node_id, "model": node.model})[:-1]
        hw = "" if node.hardware is None else ', "hardware": ' + json.dumps(node.hardware)
        return [(a, t, f'{head}, "latency_us": {v:.1f}, "ts": {t:.6f}{hw}{pr}}}'.encode())
                for a, t, v, pr in zip(arrival.tolist(), ts.tolist(), lat.tolist(),
                                       [', "probe": true' if p else "" for p in probe.tolist()],
                                       strict=True)]

    @staticmethod
    def _single(node: Node, ts: float, lat: float, probe: bool,
                arrival: float) -> tuple[float, float, bytes]:
        d: dict[str, Any] = {"node_id": node.node_id, "model": node.model,
                             "latency_us": round(float(lat), 1), "ts": round(float(ts), 6)}
        if node.hardware is not None:
            d["hardware"] = node.hardware
        if probe:
            d["probe"] = True
        return (float(arrival), float(ts), json.dumps(d).encode())


@dataclass
class Outcome:
    records: list[dict[str, Any]]
    stats: ReplayStats
    detector: Detector

    @property
    def transitions(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "transition"]

    @property
    def fleet(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "fleet"]

    def ejections(self) -> list[dict[str, Any]]:
        """Transitions that took a pair out of routing, or refused a new one (``warming`` →
        ``unhealthy``: confirmed abnormal before it was admitted)."""
        return [t for t in self.transitions if t["routed"] is False and t["from"] in
                ("healthy", "suspect", "unhealthy", "warming") and t["to"] == "unhealthy"]

    def ejected_pairs(self) -> set[tuple[str, str]]:
        return {(t["node_id"], t["model"]) for t in self.ejections()}

    def first_out_ts(self, node_id: str, model: str = "llm") -> float | None:
        for t in self.ejections():
            if (t["node_id"], t["model"]) == (node_id, model):
                return float(t["ts"])
        return None

    def max_out(self, model: str) -> int:
        """Most pairs of ``model`` simultaneously out of routing, over the replay (a new pair
        awaiting admission, ``warming`` and not routed, is not out: it was never in)."""
        routed: dict[str, bool] = {}
        worst = 0
        for t in self.transitions:
            if t["model"] != model:
                continue
            routed[t["node_id"]] = bool(t["routed"]) or t["to"] == "warming"
            worst = max(worst, sum(1 for r in routed.values() if not r))
        return worst


def run(scenario: Scenario) -> Outcome:
    out: list[str] = []
    det, stats = replay(scenario.lines(), scenario.detector_settings(), out.append)
    return Outcome([json.loads(line) for line in out], stats, det)
