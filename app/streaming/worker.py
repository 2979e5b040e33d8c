"""``tailguard worker``: run the streaming service (a faust worker) in this process.

Reads the settings once (``TAILGUARD_*``), creates the missing topics, builds
the app with :func:`app.streaming.service.create_app` and runs faust's
:class:`faust.Worker` until SIGINT/SIGTERM. Before that it connects once to
Redis and to Kafka (:func:`app.security.check_redis`, :func:`~app.security.check_kafka`)
and reads the node-id allowlist when one is configured (:func:`app.streaming.allowlist.check`).
Exit code 0 on a clean stop, 2 on a bad setting or a login or certificate that
Redis or Kafka refuses (one line naming the setting), 1 when the broker cannot be reached,
an allowlist source cannot be read, or a Kafka compression codec cannot be decoded here
(``cramjam`` missing).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from app import settings as settings_mod
from app import text
from app.security import check_kafka, check_redis
from app.streaming import allowlist
from app.streaming.errors import StreamingError
from app.streaming.topics import ensure_topics

log = logging.getLogger("tailguard.worker")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard worker",
        description="Run the tailguard streaming service (faust worker) against the configured "
                    "Kafka (TAILGUARD_KAFKA_BOOTSTRAP) and Redis (TAILGUARD_REDIS_URL). "
                    "Every setting comes from TAILGUARD_* variables; see `tailguard settings`.")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a detector setting, e.g. --set tick_interval_s=2")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    settings = settings_mod.load()
    if args.set:
        from app.core.config import parse_overrides
        pairs = dict(kv.split("=", 1) if "=" in kv else (kv, "") for kv in args.set)
        detector = parse_overrides(pairs, settings.detector,
                                   labels={k: f"--set {k}" for k in pairs})
        settings = settings_mod.load(detector=detector)
    text.basic_config(level=settings.log_level.upper(),
                      format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    from app.streaming.ingest import missing_codecs

    if missing := missing_codecs():
        print(f"tailguard worker: cannot decompress {'/'.join(missing)} record batches, which "
              "kcat/librdkafka and the Java producer send when compression is on; install "
              "cramjam (pip install 'cramjam>=2.8,<3', a tailguard dependency)", file=sys.stderr)
        return 1
    loop = asyncio.new_event_loop()
    try:
        # A refused login or certificate stops the start with one line naming the setting
        # (AccessRefused, a SettingError: exit 2); an unreachable server is handled below.
        loop.run_until_complete(check_redis(settings))
        loop.run_until_complete(check_kafka(settings))
        loop.run_until_complete(allowlist.check(settings))   # a source it cannot read: exit 1
        created = loop.run_until_complete(ensure_topics(settings))
    except StreamingError as e:
        print(f"tailguard worker: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    if created:
        log.info("created topics: %s", ", ".join(created))

    import faust

    from app.streaming.service import create_app

    app = create_app(settings)
    worker = faust.Worker(app, loglevel=settings.log_level.upper(),
                          override_logging=False, quiet=True)
    worker.execute_from_commandline()  # returns only via SystemExit
    return 0
