"""Routing weights on scraped fleets of each server kind: the lowest weight of a slower pod.

Run: ``python -m bench.backtest_servers [--servers tgi,triton] [--factors 1,1.3,1.5]
[--seeds 1,2,3] [--pods 10] [--rate 5] [--llm conv|none] [--p50-ms 22]``. Each run is a fleet of
``--pods`` pods (one model, LLM conversation sizes at 22 ms a token with TTFT and tokens, or a
lognormal ``--p50-ms`` σ ``--sigma`` without), pod gpu-node-01 ``factor`` times slower from
600 s of 1500 s, written as ``server``'s ``/metrics`` every 10 s and converted by the scraper's
own converter (:func:`tailguard.sim.servertrace.server_lines`), then replayed on the default
settings. Printed per run: the slow pod's lowest weight and when (s after onset), every other
pod that got a weight, every removal and return to routing (s after onset), and the metrics
the buckets cannot resolve. A factor of 1 is a healthy fleet: any weight is false.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.replay import replay
from tailguard.sim import outcome, servertrace, tracegen
from tailguard.sim import scenario as sc

ONSET_S = 600.0
SLOW = "gpu-node-01"


def fleet(pods: int, factor: float, *, rate: float, llm: str | None, p50_ms: float, sigma: float,
          duration_s: float = 1500.0) -> sc.Scenario:
    return sc.one_model_fleet(pods, p50_ms=p50_ms, sigma=sigma, rate_per_s=rate, llm=llm,
                              faults=sc.slowdown_fault([SLOW], factor, ONSET_S), duration_s=duration_s)


def run(server: str, s: sc.Scenario, seed: int) -> tuple[outcome.Outcome, float | None, str]:
    """The run's outcome, when the slow pod first got a weight below 1 (s after onset), and the
    metrics the buckets cannot resolve (``metric@first bound``, hist_resolution)."""
    out: list[str] = []
    det, _ = replay(servertrace.server_lines(tracegen.generate(s, seed), server), DetectorSettings(), out.append)
    records = [json.loads(line) for line in out]
    first = next((float(r["ts"]) - s.epoch_s - ONSET_S for r in records
                  if r.get("type") == "weight" and r["node_id"] == SLOW), None)
    unresolved = ",".join(f"{metric}@{b:g}s" for (_m, metric), b in sorted(det.unresolved.items()))
    return outcome.check(s, records), first, unresolved


def _times(at_s: Mapping[tuple[str, str], float]) -> str:
    """``node +s after onset`` of each (node, model), sorted; "-" for none."""
    return ", ".join(f"{n} +{t - ONSET_S:.0f} s" for (n, _m), t in sorted(at_s.items())) or "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="vllm,sglang,tgi,triton,dynamo")
    p.add_argument("--factors", default="1,1.3,1.5")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--pods", default="10", help="fleet sizes, comma-separated")
    p.add_argument("--rate", default="5", help="requests a second per pod, comma-separated")
    p.add_argument("--llm", default="conv", help="conv, code, or none (a lognormal)")
    p.add_argument("--p50-ms", type=float, default=22.0)
    p.add_argument("--sigma", type=float, default=0.4)
    a = p.parse_args(argv)
    llm = None if a.llm == "none" else a.llm
    grid = [(server, pods, rate, factor, seed) for server in a.servers.split(",")
            for pods in (int(x) for x in a.pods.split(",")) for rate in (float(x) for x in a.rate.split(","))
            for factor in (float(f) for f in a.factors.split(",")) for seed in (int(x) for x in a.seeds.split(","))]
    for i, (server, pods, rate, factor, seed) in enumerate(grid, 1):
        s = fleet(pods, factor, rate=rate, llm=llm, p50_ms=a.p50_ms, sigma=a.sigma)
        res, first, unresolved = run(server, s, seed)
        low = res.lowest_weight.get((SLOW, "m"))
        others = {n: w for (n, _m), w in res.lowest_weight.items() if n != SLOW or factor == 1.0}
        slow = ("-" if low is None or factor == 1.0 else
                f"{low[0]:.2f} at +{low[1] - ONSET_S:.0f} s (first weight +{first:.0f} s)")
        print(f"[{i}/{len(grid)}] {server:7s} {pods} pods {rate:g} req/s x{factor:<4g} seed {seed}: slow pod {slow};"
              f" other weights {others or '-'}; removed {_times(res.ejected_at_s)}; routed again"
              f" {_times(res.readmitted_at_s)}; unresolved {unresolved or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
