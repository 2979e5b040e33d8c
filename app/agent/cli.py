"""``tailguard diagnose``: run the diagnostics agent for this host's node id(s).

``tailguard diagnose --node gpu-node-07 [--config agent.toml]`` consumes
``node-diagnostics-requests`` and answers each request for its nodes on
``node-diagnostics-results`` until SIGINT/SIGTERM. ``--once`` runs the check
suite now, prints one result per node as JSON and exits (no Kafka): exit 0,
or 3 when a node is ``not_recoverable``. Exit 2 on a bad setting or a login,
certificate or protocol Kafka refuses (one line naming the variable to fix), 1 when Kafka
cannot be reached. Kafka security: the worker's ``TAILGUARD_KAFKA_*`` variables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

from tailguard import text
from tailguard.agent.checks import Suite
from tailguard.agent.config import AgentConfigError, load_config
from tailguard.agent.runner import Agent, Request, build_result
from tailguard.kafka_security import KafkaRefused, check, refusal


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard diagnose",
        description="Answer tailguard's diagnostics requests for this node: GPU state, XID "
                    "errors, DCGM, a GEMM timing and your own checks → recoverable, "
                    "not_recoverable or inconclusive. See docs/diagnostics.md.")
    p.add_argument("--node", action="append", default=[], metavar="ID[=GPU,…]",
                   help="a node id this agent answers for, optionally with its GPU indices "
                        "(repeat for several nodes on one host)")
    p.add_argument("--config", metavar="FILE", help="TOML config file (checks, timeouts, …)")
    p.add_argument("--bootstrap", metavar="HOST:PORT",
                   help="Kafka bootstrap servers (default TAILGUARD_KAFKA_BOOTSTRAP or 127.0.0.1:9092)")
    p.add_argument("--group", metavar="GROUP", help="consumer group (default tailguard-agent-<node ids>)")
    p.add_argument("--once", action="store_true",
                   help="run the checks now, print one JSON result per node, exit (no Kafka)")
    p.add_argument("--model", default="", help="with --once: the model named in the result")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


async def _once(agent: Agent, model: str) -> int:
    worst = 0
    for node in agent.cfg.nodes:
        t0 = time.monotonic()
        report = await agent.suite.run(node, model)
        res = build_result(Request(node.node_id, model or "-"), report, time.time(),
                           time.monotonic() - t0, agent.host)
        print(json.dumps(res, indent=2, default=str))
        if res["verdict"] == "not_recoverable":
            worst = 3
    return worst


async def _serve(agent: Agent) -> int:
    from aiokafka.errors import KafkaConnectionError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sec, bootstrap = agent.cfg.security, agent.cfg.kafka_bootstrap
    try:
        await check(sec, bootstrap, AgentConfigError)   # a refused login: one line, at once
        await agent.run(stop)
    except (KafkaRefused, AgentConfigError) as e:
        print(f"tailguard diagnose: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        refused = refusal(sec, e, bootstrap)
        if refused is not None:
            print(f"tailguard diagnose: {refused}", file=sys.stderr)
            return 2
        if not isinstance(e, KafkaConnectionError):
            raise
        print(f"tailguard diagnose: cannot reach Kafka at {agent.cfg.kafka_bootstrap} ({e}); "
              "check --bootstrap / TAILGUARD_KAFKA_BOOTSTRAP", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    text.basic_config(level=args.log_level.upper(),
                      format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.node, kafka_bootstrap=args.bootstrap, group_id=args.group)
    except AgentConfigError as e:
        print(f"tailguard diagnose: {e}", file=sys.stderr)
        return 2
    agent = Agent(cfg, Suite(cfg))
    return asyncio.run(_once(agent, args.model) if args.once else _serve(agent))
