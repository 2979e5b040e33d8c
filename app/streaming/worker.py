"""``tailguard worker``: run the streaming service (a faust worker) in this process.

Reads the settings once (``TAILGUARD_*``), creates the missing topics, builds
the app with :func:`tailguard.streaming.service.create_app` and runs faust's
:class:`faust.Worker` until SIGINT/SIGTERM. Before that it connects once to
Redis and to Kafka (:func:`tailguard.routing.client.check_redis`, :func:`~tailguard.security.check_kafka`)
and reads the node-id allowlist when one is configured (:func:`tailguard.streaming.allowlist.check`).
Exit code 0 on a clean stop, 2 on a bad setting (a ``TAILGUARD_DATA_DIR`` it cannot
create or write too) or a login or certificate that
Redis or Kafka refuses (one line naming the setting), 1 when the broker cannot be reached,
the metrics or web port is taken (:func:`listen_problem`),
an allowlist source cannot be read, or a Kafka compression codec cannot be decoded here
(``cramjam`` missing). It logs once which Kafka, Redis (password masked) and key prefix it uses,
and which memory allocator it runs on (:mod:`tailguard.streaming.allocator`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import socket
import sys

from tailguard import settings as settings_mod
from tailguard import text
from tailguard.core.contract.config import SettingError
from tailguard.routing.client import check_redis
from tailguard.security import check_kafka
from tailguard.streaming import allocator, allowlist
from tailguard.streaming.errors import StreamingError
from tailguard.streaming.topics import ensure_topics

log = logging.getLogger("tailguard.worker")

# The collector's own full passes: one per this many passes over its middle generation
# (Python's default 10). The worker makes the pass when it is due after each stage-2 tick
# (service.py, collect_if_due), so that it never falls inside a stage-1 tick; this is the
# backstop. Measured: docs/performance.md (100,000 series on one worker).
FULL_COLLECTION_EVERY = 100


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard worker",
        description="Run the tailguard streaming service (faust worker) against the configured "
                    "Kafka (TAILGUARD_KAFKA_BOOTSTRAP) and Redis (TAILGUARD_REDIS_URL). "
                    "Every setting comes from TAILGUARD_* variables; see `tailguard settings`.")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a detector setting, e.g. --set tick_interval_s=2")
    return p


def check_data_dir(path: str) -> None:
    """Create faust's data directory (faust makes only its last level); SettingError if it cannot."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        raise SettingError("TAILGUARD_DATA_DIR", path, f"a directory the worker can create and write "
                           f"({e.strerror or e}); unset, it is a fresh temp dir per process") from None


def listen_problem(host_var: str, port_var: str, host: str, port: int) -> str | None:
    """Why the worker could not listen on ``host:port`` (None: it can, or port 0 = off)."""
    if port == 0:
        return None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            sock.bind(addr)
    except OSError as e:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return (f"cannot listen on {where} ({host_var}, {port_var}): {e.strerror or e}; stop what "
                f"listens there or set {port_var} to a free port (0 turns it off)")
    return None


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    settings = settings_mod.load()
    if args.set:
        settings = settings_mod.load(detector=settings_mod.parse_set(args.set, settings.detector))
    text.basic_config(level=settings.log_level.upper(),
                      format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    from tailguard.streaming.ingest import missing_codecs

    if missing := missing_codecs():
        print(f"tailguard worker: cannot decompress {'/'.join(missing)} record batches, which "
              "kcat/librdkafka and the Java producer send when compression is on; install "
              "cramjam (pip install 'cramjam>=2.8,<3', a tailguard dependency)", file=sys.stderr)
        return 1
    from tailguard.streaming.service import data_dir_for

    check_data_dir(data_dir_for(settings))
    for problem in (listen_problem("TAILGUARD_METRICS_HOST", "TAILGUARD_METRICS_PORT",
                                   settings.metrics_host, settings.metrics_port),
                    listen_problem("TAILGUARD_WEB_HOST", "TAILGUARD_WEB_PORT",
                                   settings.web_host, settings.web_port)):
        if problem:
            print(f"tailguard worker: {problem}", file=sys.stderr)
            return 1
    loop = asyncio.new_event_loop()
    try:
        # A refused login or certificate stops the start with one line naming the setting
        # (AccessRefused, a SettingError: exit 2); an unreachable server is handled below.
        loop.run_until_complete(check_redis(settings))
        loop.run_until_complete(check_kafka(settings))
        loop.run_until_complete(allowlist.check(settings))   # a source it cannot read: exit 1
        setup = loop.run_until_complete(ensure_topics(settings))
    except StreamingError as e:
        print(f"tailguard worker: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    # After the checks: a refused start stays one line (stderr), as documented.
    log.log(*allocator.describe(settings.allocator))
    log.info("Kafka at %s (TAILGUARD_KAFKA_BOOTSTRAP), Redis at %s (TAILGUARD_REDIS_URL), "
             "key prefix %r, app id %r", settings.kafka_bootstrap,
             settings_mod.redact_url(settings.redis_url), settings.key_prefix, settings.app_id)
    if setup.created:
        log.info("created topics: %s", ", ".join(setup.created))

    import faust

    from tailguard.collector import fewer_full_collections
    from tailguard.streaming.service import create_app

    fewer_full_collections(FULL_COLLECTION_EVERY)

    # faust's own topics get the replication factor of the others.
    app = create_app(dataclasses.replace(settings, replication_factor=setup.replication_factor))
    worker = faust.Worker(app, loglevel=settings.log_level.upper(),
                          override_logging=False, quiet=True)
    if worker.spinner is not None and not worker.spinner.file.isatty():
        # faust's start-up spinner writes cursor escapes (ESC[?25h) even into a file or pipe.
        worker.spinner = None
    worker.execute_from_commandline()  # returns only via SystemExit
    return 0
