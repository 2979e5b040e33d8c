"""``tailguard simulate``: scenario traces, a live simulated fleet, a load generator.

Subcommands (each ``--help`` lists its options):

- ``trace SCENARIO.toml [-o FILE] [--seed N] [--format single|batch]`` — write
  the scenario's deterministic latency-event trace (JSON lines) for
  ``tailguard replay``;
- ``fleet SCENARIO.toml --base-port 18000 [--time-scale X]`` — run the
  scenario's nodes as HTTP servers on 127.0.0.1 that report to Kafka;
- ``load --target URL --rate R --duration S --model M`` — drive traffic
  through a load balancer and report client-side P50/P99 per interval;
- ``check SCENARIO.toml REPLAY_OUTPUT`` — judge ``tailguard replay``'s output
  against the scenario's ``[expect]`` (exit 1 when an expectation fails).

A bad scenario file is a one-line error naming the file and key, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from tailguard.sim.scenario import SimError


def _trace(args: argparse.Namespace) -> int:
    from tailguard.sim import scenario as sc
    from tailguard.sim import tracegen

    s = sc.load(args.scenario)
    trace = tracegen.generate(s, args.seed)
    fmt = cast(tracegen.Format, args.format)
    if args.output in (None, "-"):
        n = tracegen.write(trace, sys.stdout, fmt=fmt, batch_s=args.batch_s, heartbeat_s=args.heartbeat_s)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            n = tracegen.write(trace, f, fmt=fmt, batch_s=args.batch_s, heartbeat_s=args.heartbeat_s)
    print(f"tailguard simulate trace: {s.name}: {n} lines, {trace.requests} requests, "
          f"{len(trace.streams)} (node, model) streams, seed {trace.seed}", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    from tailguard.sim import outcome
    from tailguard.sim import scenario as sc

    s = sc.load(args.scenario)
    text = sys.stdin.read() if args.replay_output == "-" else Path(args.replay_output).read_text("utf-8")
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            records.append(json.loads(line))
    res = outcome.check(s, records)
    for (node, model), t in sorted(res.ejected_at_s.items()):
        print(f"ejected {node}/{model} at {t:.1f} s")
    for p in res.problems:
        print(f"FAIL {p}")
    print(f"{s.name}: {'ok' if res.ok else 'FAILED'}")
    return 0 if res.ok else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailguard simulate",
                                description="Scenario traces, a live simulated fleet, a load generator.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("trace", help="write a scenario's latency-event trace (JSON lines)")
    t.add_argument("scenario", help="scenario file (TOML), e.g. scenarios/tail_fault.toml")
    t.add_argument("-o", "--output", help="output file (default: stdout)")
    t.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    t.add_argument("--format", choices=("single", "batch"), default="single",
                   help="one event per request, or batch events (default: single)")
    t.add_argument("--batch-s", type=float, default=1.0, help="batch span in seconds (--format batch)")
    t.add_argument("--heartbeat-s", type=float, default=10.0,
                   help="heartbeat every this many seconds per (node, model); 0: none")
    t.set_defaults(run=_trace)

    c = sub.add_parser("check", help="judge `tailguard replay` output against a scenario's [expect]")
    c.add_argument("scenario")
    c.add_argument("replay_output", help="file with replay's JSON lines, or - for stdin")
    c.set_defaults(run=_check)

    from tailguard.sim import fleet_cli, load

    fleet_cli.add_parser(sub)
    load.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return int(args.run(args))
    except SimError as e:
        print(f"tailguard simulate {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tailguard simulate {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
