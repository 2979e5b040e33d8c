"""The ``tailguard`` command.

Each subcommand lives in the module that owns it and exposes
``main(argv: list[str]) -> int`` (or the function named after ``:``); this file only dispatches, so that
``tailguard replay`` never imports faust and ``tailguard status`` never
imports numpy. A :class:`~tailguard.core.contract.config.SettingError` anywhere becomes a
one-line message naming the setting, and exit code 2. A reader that closes the
pipe (``tailguard settings | head -2``) ends the command quietly, exit code 1.
``tailguard worker`` started as a program may first re-execute itself on another allocator
(:mod:`tailguard.streaming.allocator`).
"""

from __future__ import annotations

import importlib
import io
import os
import sys

from tailguard.core.contract.config import SettingError

COMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("tailguard.streaming.worker", "run the service (faust worker) against Kafka and Redis"),
    "replay": ("tailguard.replay_cli", "run the detector offline over a JSON-lines trace"),
    "status": ("tailguard.routing.status", "per-model table of nodes, read from Redis"),
    "simulate": ("tailguard.sim.cli", "run a simulated fleet of inference nodes"),
    "scrape": ("tailguard.scrape.run",
               "poll servers' /metrics (vLLM, SGLang, TGI, Triton, Dynamo) into latency events"),
    "proxy": ("tailguard.lb.proxy", "reference HTTP load balancer reading the routing set"),
    "haproxy-sync": ("tailguard.lb.haproxy", "map routing sets onto HAProxy's Runtime API"),
    "probe": ("tailguard.lb.prober", "synthetic probes for quarantined nodes an LB sends nothing"),
    "settings": ("tailguard.settings_cli", "print every TAILGUARD_* setting and its value"),
    "diagnose": ("tailguard.agent.cli", "diagnostics agent for an inference node (GPU checks → verdict)"),
    "drain": ("tailguard.routing.operators_cli:drain_main", "take a node out of routing (operator)"),
    "pin": ("tailguard.routing.operators_cli:pin_main", "keep a node in routing whatever the rules say"),
    "release": ("tailguard.routing.operators_cli:release_main", "end a node's drain or pin"),
    "mode": ("tailguard.routing.operators_cli:mode_main", "show or set observe/enforce mode"),
    "explain": ("tailguard.routing.explain", "why a node is where it is: its last ticks' rules"),
    "keys": ("tailguard.routing.migrate", "copy the routing keys to the hash-tagged (Redis Cluster) names"),
    "k8s-sync": ("tailguard.k8s.cli", "keep a pod readiness gate in step with the routing sets (Kubernetes)"),
}


def usage() -> str:
    lines = ["usage: tailguard COMMAND [ARGS…]", "", "commands:"]
    lines += [f"  {name:<13} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "Run `tailguard COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"tailguard: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, _, function = COMMANDS[name][0].partition(":")
    try:
        if argv is None and name == "worker":   # the program's own start, not a call from Python
            importlib.import_module("tailguard.streaming.allocator").reexec_if_asked()
        entry = getattr(importlib.import_module(module_name), function or "main")
        code: int = entry(rest)
        sys.stdout.flush()   # a closed pipe shows here, not in the interpreter's exit
    except SettingError as e:
        print(f"tailguard {name}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tailguard settings | head -2`: the reader left; say nothing, and write no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            sys.stdout = os.fdopen(devnull, "w")
        return 1
    except ModuleNotFoundError as e:
        if not e.name or e.name.split(".")[0] == "tailguard":
            raise
        # The base install is the emitter's (aiokafka, orjson); the commands need the service's.
        print(f"tailguard {name}: the Python package {e.name!r} is missing; the tailguard commands need "
              "the service's dependencies: pip install 'tailguard[worker]'", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
