"""Changing fleets on the event path: fleet-wide swings, uneven traffic, mixed hardware, lag.

Run: ``python -m bench.backtest_swings [--family swing,lag,...] [--seeds 1,2,3,4,5] [--slow 1,3]``.
Each run is a simulated fleet (:mod:`tailguard.sim`, one model of 10 H100 nodes, 180 ms σ 0.3,
5 req/s a node, 1300 s) replayed on the default settings; ``--slow`` is the factor of gpu-node-04
from 557 s (1: a healthy fleet, every removal false). Families:

* ``swing``: every node ``F`` x slower with twice the requests from 400 s to 900 s, F in
  1.5, 2, 2.5, 3: a step, or a ramp up and down in 60-s steps;
* ``uneven``: the swing at 2.5x with gpu-node-01 serving 10x the requests;
* ``mixed``: the swing at 2.5x on 7 H100 and 3 A10G nodes (2.2x the H100s);
* ``llm``: the swing at 2, 2.5 and 3x on raw LLM latency (conversation and code sizes, no
  token counts: P99/P50 4-9);
* ``busy``: the swing at 2, 2.5 and 3x at 20 req/s a node;
* ``quiet``: gpu-node-01..05 at 1, 2 or 3 req/s among peers at 5 (lognormal σ 0.3 and 1.0, raw
  LLM code sizes), alone and inside the 2.5x swing;
* ``lag``: a node's events delivered ``--lag`` s after the others' (gpu-node-04, the slow one,
  or gpu-node-02, a healthy one), 8 nodes at 4 req/s (lognormal, raw LLM conversation sizes),
  alone and inside the 2.5x swing.

Printed per run: the slow node's removal (s after onset), every other node taken out of
routing, and a routing set left empty. Exit status 1 when a healthy node was removed or a set
went empty.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.replay.replay import replay
from tailguard.sim import outcome, tracegen
from tailguard.sim import scenario as sc

ONSET_S = 557.0
SLOW = "gpu-node-04"
LAGGED_HEALTHY = "gpu-node-02"


def _swing(factor: float, ramp: bool) -> str:
    """``[[faults]]`` of a fleet-wide swing from 400 s to 900 s (a step, or a ramp)."""
    if not ramp:
        return (f'[[faults]]\nnode = "*"\nkind = "traffic"\nonset_s = 400\nend_s = 900\n'
                f"rate_factor = 2\nfactor = {factor}\n")
    steps = [1 + (factor - 1) * k / 4 for k in (1, 2, 3, 4, 4, 4, 3, 2, 1)]
    return "".join(f'[[faults]]\nnode = "*"\nkind = "traffic"\nonset_s = {400 + 60 * i}\n'
                   f"end_s = {460 + 60 * i}\nrate_factor = {1 + (f - 1) / (factor - 1):.3f}\n"
                   f"factor = {f:.3f}\n" for i, f in enumerate(steps))


LLM_MODEL = ('kind = "llm"\ntrace = "{trace}"\nttft_ms = 50\nttft_per_input_token_ms = 0.25\n'
             "tpot_ms = 30\njitter_sigma = 0.05")


def scenario(slow: float, swing: str = "", *, nodes: int = 10, rate: float = 5,
             overrides: str = "", model: str = "p50_ms = 180\nsigma = 0.3") -> sc.Scenario:
    fault = sc.slowdown_fault([SLOW], slow, ONSET_S)
    expect = f'[[expect.eject]]\nnode = "{SLOW}"\nwithin_s = 300\n' if fault else ""
    return sc.loads(f"""duration_s = 1300
rate_per_s = {rate}
[[models]]
name = "m"
{model}
[hardware]
A10G = 2.2
[nodes]
count = {nodes}
hardware = "H100"
{overrides}
{swing}
{fault}
[expect]
others_stay = true
{expect}""", source="backtest_swings")


def cases(families: list[str], slow: float,
          lags: list[float]) -> Iterator[tuple[str, sc.Scenario]]:
    if "swing" in families:
        for f in (1.5, 2.0, 2.5, 3.0):
            for ramp in (False, True):
                yield f"swing {f:g}x {'ramp' if ramp else 'step'}", scenario(slow, _swing(f, ramp))
    if "uneven" in families:
        yield "uneven 2.5x", scenario(slow, _swing(2.5, False), overrides=(
            "[nodes.override.gpu-node-01]\nrate_per_s = 50\n"))
    if "mixed" in families:
        yield "mixed 2.5x", scenario(slow, _swing(2.5, False), overrides="".join(
            f'[nodes.override.gpu-node-{n:02d}]\nhardware = "A10G"\n' for n in (7, 8, 9)))
    if "llm" in families:     # raw LLM latency without token counts: heavy tails
        for trace in ("conv", "code"):
            for f in (2.0, 2.5, 3.0):
                yield (f"llm {trace} {f:g}x", scenario(slow, _swing(f, False), rate=5,
                                                      model=LLM_MODEL.format(trace=trace)))
    if "busy" in families:
        for f in (2.0, 2.5, 3.0):
            yield f"busy 20/s {f:g}x", scenario(slow, _swing(f, False), rate=20)
    if "quiet" in families:   # half the nodes (gpu-node-01..05) at 1-3 req/s among 5 req/s peers
        models = {"lognormal": "p50_ms = 180\nsigma = 0.3", "heavy": "p50_ms = 180\nsigma = 1.0",
                  "llm code": LLM_MODEL.format(trace="code")}
        for name, model in models.items():
            for rate in (1.0, 2.0, 3.0):
                quiet = "".join(f"[nodes.override.gpu-node-{n:02d}]\nrate_per_s = {rate:g}\n"
                                for n in range(1, 6))
                for swing in ("", _swing(2.5, False)):
                    yield (f"quiet {rate:g}/s {name}{' in 2.5x' if swing else ''}",
                           scenario(slow, swing, overrides=quiet, model=model))
    for lag in lags if "lag" in families else []:
        for swing in ("", _swing(2.5, False)):
            for who in (SLOW, LAGGED_HEALTHY):
                for model in ("p50_ms = 180\nsigma = 0.3", LLM_MODEL.format(trace="conv")):
                    kind = " llm" if "llm" in model else ""
                    late = f"[nodes.override.{who}]\ndelivery_lag_s = {lag:g}\n"
                    yield (f"lag {lag:g}s {who}{kind}{' in 2.5x' if swing else ''}",
                           scenario(slow, swing, nodes=8, rate=4, model=model, overrides=late))


def run(s: sc.Scenario, seed: int) -> tuple[outcome.Outcome, bool]:
    """The run's outcome, and whether a routing set once written went empty."""
    out: list[str] = []
    replay(tracegen.lines(tracegen.generate(s, seed)), DetectorSettings(), out.append)
    records = [json.loads(line) for line in out]
    routed: set[str] = set()
    empty = False
    for r in records:
        if r.get("type") == "transition":
            (routed.add if r["routed"] else routed.discard)(r["node_id"])
            empty = empty or (not routed and r["to"] != "warming")
    return outcome.check(s, records), empty


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="swing,uneven,mixed,llm,busy,quiet,lag")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--slow", default="1,3", help="gpu-node-04's factors (1: healthy)")
    p.add_argument("--lag", default="20", help="delivery lags of the lag family, comma-separated")
    a = p.parse_args(argv)
    bad = 0
    for slow in (float(x) for x in a.slow.split(",")):
        for name, s in cases(a.family.split(","), slow, [float(x) for x in a.lag.split(",")]):
            for seed in (int(x) for x in a.seeds.split(",")):
                res, empty = run(s, seed)
                key = (SLOW, "m")
                took = (f"out {res.ejected_at_s[key] - ONSET_S:.0f} s after onset"
                        if slow != 1 and key in res.ejected_at_s else "")
                false = [f"{n} out at {t:.0f} s" for (n, _), t in sorted(res.ejected_at_s.items())
                         if slow == 1 or n != SLOW]
                bad += bool(false) or empty
                print(f"{name:28} x{slow:g} seed {seed}: {took or ('-' if slow == 1 else 'NOT OUT')}"
                      f"{'; FALSE: ' + ', '.join(false) if false else ''}"
                      f"{'; EMPTY ROUTING SET' if empty else ''}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
