"""The minimal demo: 8 simulated nodes, one slows down 3x, tailguard takes it out.

What it really does (nothing is staged):

1. generates per-request latencies for 8 nodes serving one model (lognormal, P50 180 ms) as
   batch-form latency events — the JSON the emitter SDK puts on Kafka — and decodes them
   with :mod:`tailguard.core.contract.events`;
2. feeds them to the pure detector (:class:`tailguard.core.replay.detector.Detector`),
   evaluating a tick every ``tick_interval_s`` (5 s) of simulated time and printing each
   node's state, P50, P99 and ratio; from ``--degrade-at-s`` one node is 3x slower;
3. writes each tick's routing set to the real Redis with
   :class:`tailguard.routing.writer.RoutingWriter` (the worker's atomic write) and at the end
   reads it back with a plain Redis client, as a load balancer would.

Simulated time runs faster than the wall clock, so the story takes seconds. No Kafka here
(the full demo is ``python -m tailguard.demo``). Exit status 0 when the slow node left the
routing set, in the detector and in Redis; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from tailguard import settings as settings_mod
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import decode
from tailguard.core.contract.types import ModelTick, TickResult
from tailguard.core.replay.detector import Detector

MODEL = "llama-3-70b"
NODES = tuple(f"gpu-node-{i:02d}" for i in range(1, 9))
P50_MS = 180.0
SIGMA = 0.25
RATE_PER_S = 20.0
SLOWDOWN = 3.0

DEMO_DETECTOR = DetectorSettings(
    tick_interval_s=5.0, window_size=200, min_samples=50, warmup_s=10.0, confirm_windows=3,
)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tailguard.demo.minimal", description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-node", default="gpu-node-05", choices=NODES)
    p.add_argument("--degrade-at-s", type=float, default=20.0, help="simulated seconds (default 20)")
    p.add_argument("--duration-s", type=float, default=70.0, help="simulated seconds (default 70)")
    p.add_argument("--pause-s", type=float, default=0.4, help="wall-clock pause per tick (default 0.4)")
    p.add_argument("--key-prefix", default=None,
                   help="Redis key prefix (default: TAILGUARD_KEY_PREFIX + '-demo')")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis part")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(list(argv))


def fleet_events(rng: np.random.Generator, t0_s: float, t1_s: float, slow: str | None) -> list[bytes]:
    """One batch-form message per node with its requests in [t0_s, t1_s)."""
    out = []
    for node in NODES:
        n = int(rng.poisson(RATE_PER_S * (t1_s - t0_s)))
        ts = np.sort(rng.uniform(t0_s, t1_s, n))
        latency_us = rng.lognormal(np.log(P50_MS * 1000.0), SIGMA, n)
        if node == slow:
            latency_us *= SLOWDOWN
        msg = {"node_id": node, "model": MODEL, "hardware": "A100",
               "samples": [[round(float(t), 3), round(float(x))] for t, x in zip(ts, latency_us, strict=True)]}
        out.append(json.dumps(msg).encode())
    return out


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:7.0f}"


def render(tick: ModelTick, t_s: float, slow: str | None) -> str:
    lines = [f"t={t_s:5.0f}s  model {tick.model}  routing set: {len(tick.routing)}/{len(NODES)} nodes"
             + (f"   ({slow} is {SLOWDOWN:.0f}x slower)" if slow else ""),
             f"  {'node':<12} {'state':<12} {'P50 ms':>7} {'P99 ms':>7} {'ratio':>6} {'samples':>7}  routed"]
    for s in sorted(tick.statuses, key=lambda s: s.node_id):
        ratio = "-" if s.ratio is None else f"{s.ratio:6.2f}"
        lines.append(f"  {s.node_id:<12} {s.state!s:<12} {_ms(s.latency_p50_us):>7} {_ms(s.latency_p99_us):>7} "
                     f"{ratio:>6} {s.samples:>7}  {'yes' if s.routed else 'NO'}")
    for tr in tick.transitions:
        if tr.from_state != tr.to_state and tr.to_state not in ("warming", "healthy"):
            lines.append(f"  >> {tr.node_id}: {tr.from_state} -> {tr.to_state} ({tr.reason})"
                         f"{'' if tr.routed else ', removed from routing'}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    service = settings_mod.load()
    prefix = args.key_prefix or f"{service.key_prefix}-demo"
    rng = np.random.default_rng(args.seed)
    detector = Detector(DEMO_DETECTOR)
    tick_s = DEMO_DETECTOR.tick_interval_s
    # Event time starts now, so that what lands in Redis carries plausible times.
    t0 = float(int(time.time()))
    print(f"tailguard minimal demo: {len(NODES)} nodes serving {MODEL}, P50 {P50_MS:.0f} ms; "
          f"{args.slow_node} becomes {SLOWDOWN:.0f}x slower at t={args.degrade_at_s:.0f}s.")
    print(f"detector: tick {tick_s:.0f}s (simulated; default 30s), window {DEMO_DETECTOR.window_size}, "
          f"min_samples {DEMO_DETECTOR.min_samples}, confirm {DEMO_DETECTOR.confirm_windows} windows, "
          f"P50 > {DEMO_DETECTOR.relative_p50_factor}x peers' median or P99/P50 > "
          f"{DEMO_DETECTOR.ratio_threshold} is abnormal.\n")

    writer = None
    redis = None
    if not args.no_redis:
        from tailguard.routing.client import connect_for
        from tailguard.routing.writer import RoutingWriter

        redis = connect_for(service)
        writer = RoutingWriter(redis, prefix)

    removed_at: float | None = None
    admitted = False      # a new node is out of routing until admitted: removal is leaving it after
    last: TickResult | None = None
    try:
        t = 0.0
        while t < args.duration_s:
            slow = args.slow_node if t >= args.degrade_at_s else None
            detector.observe(decode(raw) for raw in fleet_events(rng, t0 + t, t0 + t + tick_s, slow))
            t += tick_s
            last = detector.evaluate(t0 + t)
            for tick in last.models:
                print(render(tick, t, slow) + "\n")
                if writer is not None and not await writer.apply(tick):
                    print(f"  (Redis write for {tick.model} did not go through: see the log above)")
            routed_now = args.slow_node in last.routing().get(MODEL, frozenset())
            admitted = admitted or routed_now
            if removed_at is None and admitted and not routed_now:
                removed_at = t
            if args.pause_s > 0:
                await asyncio.sleep(args.pause_s)

        routing = last.routing().get(MODEL, frozenset()) if last else frozenset()
        ok = removed_at is not None and args.slow_node not in routing
        if removed_at is not None:
            print(f"detector: {args.slow_node} left the routing set at t={removed_at:.0f}s "
                  f"({removed_at - args.degrade_at_s:.0f}s after it slowed down); "
                  f"routing set now: {', '.join(sorted(routing))}")
        else:
            print(f"detector: {args.slow_node} is STILL in the routing set after {args.duration_s:.0f}s")

        if redis is not None and writer is not None:
            key = writer.keys.routing(MODEL)
            raw_members: set[bytes | str] = await redis.smembers(key)
            members = sorted(m.decode() if isinstance(m, bytes) else m for m in raw_members)
            version = await redis.get(writer.keys.version(MODEL))
            in_redis = args.slow_node not in members and len(members) == len(NODES) - 1
            print(f"\nredis ({service.redis_url}): SMEMBERS {key}\n  -> {', '.join(members) or '(empty)'}"
                  f"\n  version {int(version) if version is not None else '-'}; "
                  f"{args.slow_node} {'is gone' if args.slow_node not in members else 'is STILL there'}")
            print(f"  check it yourself: redis-cli -u {service.redis_url} SMEMBERS {key}")
            ok = ok and in_redis
    finally:
        if redis is not None:
            await redis.aclose()
    print("\nresult: " + ("OK — the slow node was taken out of routing" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
