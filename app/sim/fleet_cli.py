"""``tailguard simulate fleet``: the command line around :class:`~tailguard.sim.fleet.Fleet`.

Owns the ``fleet`` subcommand's arguments (:func:`add_parser`) and its two ways to run a
scenario's nodes as live HTTP servers on loopback: reporting every request to Kafka through
the emitter SDK (the default), or, with ``--metrics SERVER``, serving ``GET /metrics`` as that
server does (:mod:`tailguard.sim.metrics_fleet`) for ``tailguard scrape`` to read, optionally
with a Prometheus ``file_sd`` target list (``--file-sd``).

Guarantees: bad arguments (``--time-scale`` not above 0, ``--slots`` below 1 or with
``--metrics``) are refused with one line (:class:`~tailguard.sim.scenario.SimError`) before
anything listens; a ``listening`` JSON line is printed per node once it listens (after
``--backends-file`` is rewritten whole), and a ``stopped`` line with each node's request count
when SIGINT, SIGTERM or the duration ends the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from tailguard.sim.fleet import Fleet, Listening
from tailguard.sim.metrics_fleet import MetricsReporter, SelfTraffic, file_sd
from tailguard.sim.scenario import Scenario, SimError


def add_parser(sub: Any) -> None:
    f = sub.add_parser("fleet", help="run the scenario's nodes as HTTP servers reporting to Kafka")
    f.add_argument("scenario", help="scenario file (TOML)")
    f.add_argument("--base-port", type=int, default=18000, help="port of the first node (default 18000)")
    f.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    f.add_argument("--time-scale", type=float, default=1.0,
                   help="run the scenario's timeline this many times faster (default 1)")
    f.add_argument("--duration-s", type=float, default=None,
                   help="stop after this many wall-clock seconds; 0: run until interrupted "
                        "(default: the scenario's duration / time scale)")
    f.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    f.add_argument("--slots", type=int, default=None,
                   help="requests each node serves at a time; the rest queue (default: no limit)")
    f.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: TAILGUARD_KAFKA_BOOTSTRAP)")
    f.add_argument("--topic", default=None, help="latency topic (default: TAILGUARD_TOPIC_LATENCY_EVENTS)")
    f.add_argument("--heartbeat-interval-s", type=float, default=5.0, help="heartbeat period (default 5)")
    f.add_argument("--backends-file", default=None,
                   help="write node_id=http://host:port lines here (for `tailguard proxy --backends`)")
    f.add_argument("--metrics", nargs="?", const="vllm", default=None, metavar="SERVER",
                   choices=("vllm", "sglang", "tgi", "triton", "dynamo"),
                   help="serve GET /metrics on every node as this server does (vllm, the default, sglang, tgi, "
                        "triton, dynamo) instead of reporting to Kafka: no emitter, `tailguard scrape` reads them")
    f.add_argument("--traffic", choices=("self", "http"), default="self",
                   help="with --metrics: 'self' = every node serves its own requests at the scenario's rates "
                        "(default), 'http' = only the requests sent to it (a load generator)")
    f.add_argument("--file-sd", default=None, metavar="PATH",
                   help="with --metrics: write the nodes as a Prometheus file_sd target list here")
    f.set_defaults(run=_run_fleet_cli)


def _run_fleet_cli(args: argparse.Namespace) -> int:
    from tailguard import settings as app_settings
    from tailguard.sim import scenario as sc

    s = sc.load(args.scenario)
    if not args.time_scale > 0:
        raise SimError(f"--time-scale must be > 0, got {args.time_scale}")
    duration = args.duration_s if args.duration_s is not None else s.duration_s / args.time_scale
    if args.slots is not None and args.slots < 1:
        raise SimError(f"--slots must be >= 1, got {args.slots}")
    if args.metrics:
        if args.slots is not None:
            raise SimError("--slots applies to the nodes that report through the emitter, not with --metrics")
        asyncio.run(serve_metrics(s, args, duration))
        return 0
    cfg = app_settings.load()
    bootstrap = args.bootstrap or cfg.kafka_bootstrap
    topic = args.topic or cfg.topics.latency_events
    from tailguard.security import kafka_client_options

    asyncio.run(_serve(s, args, bootstrap, topic, duration, kafka_client_options(cfg)))
    return 0


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call inside the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def listen_printer(args: argparse.Namespace) -> Callable[[Listening], None]:
    """Prints a ``listening`` line per node and keeps ``--backends-file`` up to date."""
    backends: dict[str, str] = {}

    def on_listen(info: Listening) -> None:
        backends[info.node_id] = info.url
        if args.backends_file:          # whole file at once (rename), before the node is announced
            tmp = f"{args.backends_file}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(f"{k}={v}\n" for k, v in sorted(backends.items()))
            os.replace(tmp, args.backends_file)
        print(json.dumps({"event": "listening", "node_id": info.node_id, "url": info.url,
                          "models": list(info.models), "hardware": info.hardware}), flush=True)

    return on_listen


async def _serve(s: Scenario, args: argparse.Namespace, bootstrap: str, topic: str, duration_s: float,
                 kafka_options: dict[str, Any] | None = None) -> None:
    from tailguard.emitter.emitter import LatencyEmitter

    on_listen = listen_printer(args)
    stop = stop_on_signals()
    async with LatencyEmitter(bootstrap, topic=topic, heartbeat_interval_s=args.heartbeat_interval_s,
                              producer_options=kafka_options) as em:
        async with Fleet(s, em, base_port=args.base_port, host=args.host, time_scale=args.time_scale,
                         seed=args.seed, on_listen=on_listen, slots=args.slots) as fleet:
            print(f"tailguard simulate fleet: {s.name}: {len(s.nodes)} nodes from {args.host}:{args.base_port}, "
                  f"time scale {args.time_scale:g}, reporting to {bootstrap} topic {topic}", file=sys.stderr)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=duration_s if duration_s > 0 else None)
            served = {n.node_id: n.requests for n in fleet.nodes}
        st = em.stats
    print(json.dumps({"event": "stopped", "requests": served, "emitter": {
        "recorded": st.recorded, "sent": st.sent, "dropped": st.dropped}}), flush=True)


async def serve_metrics(s: Scenario, args: Any, duration_s: float) -> None:
    """``tailguard simulate fleet --metrics SERVER``: the fleet's nodes as servers to scrape."""
    # A server measures what it serves: tokens and TTFT whatever the scenario's emitter settings.
    s = dataclasses.replace(s, emit_tokens=True, emit_ttft=True)
    reporter = MetricsReporter(s, args.metrics)
    printer = listen_printer(args)
    targets: dict[str, tuple[str, str]] = {}

    def on_listen(info: Listening) -> None:
        targets[info.node_id] = (f"{args.host}:{info.port}", info.hardware)
        if args.file_sd:
            file_sd(targets, args.metrics, args.file_sd)
        printer(info)

    stop = stop_on_signals()
    async with Fleet(s, reporter, base_port=args.base_port, host=args.host, time_scale=args.time_scale,
                     seed=args.seed, on_listen=on_listen, metrics=reporter) as fleet:
        print(f"tailguard simulate fleet: {s.name}: {len(s.nodes)} {args.metrics} servers from "
              f"{args.host}:{args.base_port} (GET /metrics), time scale {args.time_scale:g}, "
              f"traffic: {args.traffic}", file=sys.stderr)
        traffic = SelfTraffic(reporter, lambda n: n in fleet.listening, seed=fleet.seed,
                              scenario_time=fleet.scenario_time)
        async with contextlib.AsyncExitStack() as stack:
            if args.traffic == "self":
                await stack.enter_async_context(traffic)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=duration_s if duration_s > 0 else None)
        served = {n.node_id: n.requests for n in fleet.nodes}
    print(json.dumps({"event": "stopped", "requests": served, "self_requests": traffic.requests}), flush=True)
