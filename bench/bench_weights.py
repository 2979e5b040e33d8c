"""Closed-loop benchmark of routing weights: cluster P99 with weights, with round-robin, all healthy.

Run: ``python -m bench.bench_weights [--quick] [--redis URL] [--seeds N] [--report-wait]
[--set KEY=VALUE …]`` (the real Redis of ``scripts/up``; no Kafka; ``--set`` changes a
detector setting as ``tailguard worker --set`` does). Each phase, in the same run, is the
whole loop in virtual time:

* the simulator's latency model (``Scenario.latency``): 8 nodes × 4 slots (a node serves 4
  requests at a time, the rest wait in arrival order), lognormal service times (median 100 ms,
  σ 0.5); one node ``factor``× slower (a ``slowdown`` fault) in the slow phases;
* the reference proxy's own dispatch, ``tailguard.lb.balance.Balancer`` (smooth weighted
  round-robin, probe share 0.02 as ``tailguard proxy``'s default), fed what its
  ``RoutingTable`` reads from Redis: routing set, held-out set, quarantine, weights;
* tailguard: every completed request is reported with its service time (the slowdown as the
  issue poses it); with ``--report-wait`` its latency includes the wait for a slot, as a
  server's end-to-end latency does. Reports go to a ``Detector`` (stage 1 + stage 2) with the
  default ``DetectorSettings`` (and ``--set``), ticked every ``tick_interval_s`` (30 s) of
  event time; each tick is written by ``RoutingWriter`` (the worker's Lua script).
  ``weights`` is ``enforce`` in the weighted phases, ``off`` in the "without weights" ones;
  the round-robin baseline runs no tailguard at all (the proxy's plain rotation over every
  backend: what a balancer reading a routing set that names all 8 nodes does);
* a closed loop of ``CLIENTS`` clients, each waiting an exponential think time between a
  response and its next request, sized so that the healthy fleet is ``LOAD`` busy.

Virtual time, because on a shared machine wall-clock sleeps measure the machine
(docs/performance.md). The latencies of ``requests`` requests after ``WARM_S`` (admission,
then the weights' confirmation) are the phase's; the output is each phase's P99 as a ratio of
the all-healthy fleet's (same seed), and what tailguard did (the slow node's weight, its
ticks out of routing).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench import timing
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import parse_event
from tailguard.core.replay.detector import Detector
from tailguard.lb.balance import Balancer
from tailguard.lb.testing import scratch_redis
from tailguard.routing.reader import RoutingTable
from tailguard.routing.writer import RoutingWriter
from tailguard.settings import parse_set
from tailguard.sim import scenario as sc
from tailguard.sim.latency import node_rng

MODEL = "resnet-50"
NODES, SLOTS = 8, 4
P50_MS, SIGMA = 100.0, 0.5
LOAD, CLIENTS = 0.7, 64
SLOW = "gpu-node-01"
WARM_S = 360.0          # warm-up 120 s + 3 confirming ticks of 30 s + margin
PROBE_SHARE = 0.02      # tailguard proxy's default --probe-share
_DRAW_BLOCK = 4096


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    factor: float          # the slow node's slowdown; 1.0: all healthy
    mode: str              # "rr": no tailguard; else TAILGUARD_WEIGHTS ("off": the routing set only, "enforce")


@dataclass(slots=True)
class Result:
    phase: Phase
    latency_s: list[float] = field(default_factory=list)
    by_node: Counter[str] = field(default_factory=Counter)
    weights_seen: list[float] = field(default_factory=list)   # the slow node's, per tick while measuring
    ticks: int = 0
    out_ticks: int = 0      # ticks (while measuring) with the slow node out of routing

    def p(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.latency_s), q))


def scenario(factor: float) -> sc.Scenario:
    fault = (f'[[faults]]\nnode = "{SLOW}"\nkind = "slowdown"\nonset_s = 0\nfactor = {factor}\n'
             if factor != 1.0 else "")
    return sc.loads(f'duration_s = 86400\n[[models]]\nname = "{MODEL}"\np50_ms = {P50_MS}\nsigma = {SIGMA}\n'
                    f'[nodes]\ncount = {NODES}\nhardware = "A100"\n{fault}', source="bench_weights")


class Service:
    """Service times of one node, drawn from the scenario in blocks (its fault is constant from 0 s)."""

    def __init__(self, s: sc.Scenario, index: int, seed: int) -> None:
        self._lat = s.latency(s.nodes[index].node_id, MODEL)
        self._rng = node_rng(seed, 1_000_000 + index)
        self._block: list[float] = []

    def next_s(self, t_s: float) -> float:
        if not self._block:
            draws = self._lat.sample(self._rng, np.full(_DRAW_BLOCK, t_s))
            self._block = (draws.latency_us[::-1] / 1e6).tolist()
        return self._block.pop()


class Tailguard:
    """The detector and the writer on one side of Redis, the proxy's reader on the other."""

    def __init__(self, redis: Any, prefix: str, settings: DetectorSettings, epoch_s: float) -> None:
        self.detector = Detector(settings)
        self.writer = RoutingWriter(redis, prefix)
        self.table = RoutingTable(redis, prefix)
        self.epoch_s = epoch_s
        self.rows: dict[str, list[list[float]]] = {}

    def report(self, node: str, t_s: float, latency_s: float) -> None:
        self.rows.setdefault(node, []).append([self.epoch_s + t_s, latency_s * 1e6])

    async def tick(self, t_s: float, nodes: list[str]) -> Any:
        now = self.epoch_s + t_s
        events = [parse_event({"type": "heartbeat", "node_id": n, "model": MODEL, "ts": now}) for n in nodes]
        rows, self.rows = self.rows, {}
        events += [parse_event({"node_id": n, "model": MODEL, "hardware": "A100", "samples": r})
                   for n, r in sorted(rows.items())]
        self.detector.observe(events)
        (tick,) = self.detector.evaluate(now).models
        await self.writer.apply(tick)
        await self.table.refresh()
        return tick


async def run_phase(phase: Phase, redis_url: str, requests: int, seed: int, *, report_wait: bool = False,
                    settings: DetectorSettings | None = None) -> Result:
    s = scenario(phase.factor)
    names = [n.node_id for n in s.nodes]
    service = [Service(s, i, seed) for i in range(NODES)]
    balancer = Balancer({n: f"http://{n}" for n in names}, probe_share=PROBE_SHARE)
    rng = random.Random(seed)
    mean_s = P50_MS / 1e3 * float(np.exp(SIGMA ** 2 / 2))
    think_s = CLIENTS / (LOAD * NODES * SLOTS / mean_s) - mean_s
    result = Result(phase)
    busy = dict.fromkeys(names, 0)
    queue: dict[str, deque[tuple[int, float]]] = {n: deque() for n in names}
    heap: list[tuple[float, int, int, Any]] = []     # (t, seq, kind, payload)
    seq = 0
    ARRIVE, DONE, TICK = 0, 1, 2

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, payload))

    def start(node: str, client: int, sent: float, t: float) -> None:
        push(t + service[names.index(node)].next_s(t), DONE, (node, client, sent, t))

    prefix = f"tgbench-{uuid.uuid4().hex[:12]}"
    async with scratch_redis(redis_url, prefix) as redis:
        mode = "off" if phase.mode == "rr" else phase.mode
        tg = Tailguard(redis, prefix, (settings or DetectorSettings()).replace(weights=mode), s.epoch_s)
        await tg.table.get(MODEL)
        tick_s = tg.detector.settings.tick_interval_s
        for c in range(CLIENTS):
            push(rng.expovariate(1.0 / think_s), ARRIVE, c)
        if phase.mode != "rr":
            push(tick_s, TICK, None)
        while len(result.latency_s) < requests:
            t, _, kind, payload = heapq.heappop(heap)
            if kind == ARRIVE:
                t_unix = s.epoch_s + t
                quarantine = tg.table.cached_quarantine(MODEL)
                pick = None
                if balancer.probe_due(MODEL) and quarantine:
                    pick = balancer.pick_probe(MODEL, tg.table.nodes(MODEL), quarantine, t_unix)
                if pick is None:
                    pick = balancer.pick(MODEL, tg.table.nodes(MODEL), held_out=tg.table.cached_held_out(MODEL),
                                         weights=tg.table.cached_weights(MODEL))
                assert pick is not None
                node = pick.node_id
                if busy[node] < SLOTS:
                    busy[node] += 1
                    start(node, payload, t, t)
                else:
                    queue[node].append((payload, t))
            elif kind == DONE:
                node, client, sent, started = payload
                tg.report(node, t, t - (sent if report_wait else started))
                if t >= WARM_S:
                    result.latency_s.append(t - sent)
                    result.by_node[node] += 1
                push(t + rng.expovariate(1.0 / think_s), ARRIVE, client)
                if queue[node]:
                    nxt, nxt_sent = queue[node].popleft()
                    start(node, nxt, nxt_sent, t)
                else:
                    busy[node] -= 1
            else:
                tick = await tg.tick(t, names)
                if t >= WARM_S:
                    result.ticks += 1
                    result.weights_seen.append(tg.table.weight(MODEL, SLOW))
                    result.out_ticks += SLOW not in tick.routing
                push(t + tick_s, TICK, None)
    return result


def report(results: list[Result], seeds: list[int], report_wait: bool, changed: list[str]) -> None:
    print(f"closed loop in virtual time: {NODES} nodes x {SLOTS} slots, lognormal service (median {P50_MS:g} ms, "
          f"sigma {SIGMA}), {CLIENTS} clients at {LOAD:.0%} load of the healthy fleet; "
          f"{len(results[0].latency_s):,} requests per phase after {WARM_S:g} s, seeds {seeds}; nodes report "
          + ("their end-to-end latency (wait for a slot included)" if report_wait else "their service time"))
    print(f"weights: tailguard's Detector ({', '.join(changed) or 'default DetectorSettings'}, "
          "TAILGUARD_WEIGHTS=enforce) on the nodes' "
          "reported latencies, written by RoutingWriter's Lua script, read back by RoutingTable, picked by the "
          "proxy's Balancer (smooth weighted round-robin); without weights: TAILGUARD_WEIGHTS=off; round-robin "
          "(the baseline): no tailguard")
    for seed in seeds:
        mine = [r for r in results if r.phase.name.endswith(f"#{seed}")]
        healthy = mine[0]
        for r in mine:
            ratio = r.p(99) / healthy.p(99)
            w = r.weights_seen or [1.0]
            share = r.by_node.get(SLOW, 0) / max(1, sum(r.by_node.values()))
            routed = (f"out of routing {r.out_ticks} of {r.ticks} ticks" if r.phase.mode != "rr"
                      else "no tailguard")
            note = (f"{ratio:.2f}x all-healthy P99; {SLOW}: weight {min(w):g}..{max(w):g}, "
                    f"{share:.1%} of requests; {routed}")
            timing.row(r.phase.name, f"P99 {r.p(99) * 1e3:.0f} ms", f"(P50 {r.p(50) * 1e3:.0f} ms) {note}",
                       width=50)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--seeds", type=int, default=None, help="runs with seeds 1..N (default 3, --quick 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a detector setting for every phase (as tailguard worker --set), e.g. shift_factor=0")
    p.add_argument("--report-wait", action="store_true",
                   help="nodes report latency including the wait for a slot (default: their service time)")
    args = p.parse_args()
    settings = parse_set(args.set)
    requests = 30_000 if args.quick else 100_000
    seeds = list(range(1, (args.seeds or (1 if args.quick else 3)) + 1))
    results = []
    for seed in seeds:
        phases = [Phase(f"all healthy, tailguard #{seed}", 1.0, "off")]
        for factor in (1.6, 1.3):
            phases += [Phase(f"{factor}x node, round-robin #{seed}", factor, "rr"),
                       Phase(f"{factor}x node, tailguard without weights #{seed}", factor, "off"),
                       Phase(f"{factor}x node, tailguard weights #{seed}", factor, "enforce")]
        for ph in phases:
            t0 = time.process_time()
            results.append(asyncio.run(run_phase(ph, args.redis, requests, seed, report_wait=args.report_wait,
                                                 settings=settings)))
            print(f"[bench_weights] {ph.name}: {time.process_time() - t0:.0f} s CPU", flush=True)
    report(results, seeds, args.report_wait, args.set)


if __name__ == "__main__":
    main()
