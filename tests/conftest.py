"""Shared fixtures: where the real Kafka and Redis are, and unique names.

Guarantees: ``kafka_bootstrap`` and ``redis_url`` never skip. When the
broker or Redis does not answer, the test FAILS with a message that names the
``TAILGUARD_*`` variable and the command that starts the local stack
(``scripts/up``). ``unique_name(kind)`` returns a name no other test run, on
this machine or a concurrent one, will use: use it for topics, consumer
groups, app ids and Redis key prefixes, so that tests can run in parallel
against the one shared stack.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Callable
from urllib.parse import urlparse

import pytest

_DEFAULT_KAFKA = "127.0.0.1:9092"
_DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def _tcp_error(host: str, port: int, timeout_s: float = 3.0) -> str | None:
    """None when ``host:port`` accepts a TCP connection, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"{type(e).__name__}: {e}"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The Kafka bootstrap servers (``TAILGUARD_KAFKA_BOOTSTRAP``); fails if none answers."""
    bootstrap = os.environ.get("TAILGUARD_KAFKA_BOOTSTRAP", _DEFAULT_KAFKA)
    errors = []
    for hostport in bootstrap.split(","):
        host, _, port = hostport.strip().rpartition(":")
        err = _tcp_error(host or "127.0.0.1", int(port)) if port.isdigit() else "not host:port"
        if err is None:
            return bootstrap
        errors.append(f"{hostport}: {err}")
    pytest.fail(
        f"Kafka is unreachable at TAILGUARD_KAFKA_BOOTSTRAP={bootstrap} ({'; '.join(errors)}). "
        "Start the local stack with scripts/up (or point TAILGUARD_KAFKA_BOOTSTRAP at a broker).",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis URL (``TAILGUARD_REDIS_URL``); fails unless Redis answers PING."""
    url = os.environ.get("TAILGUARD_REDIS_URL", _DEFAULT_REDIS)
    u = urlparse(url)
    host, port = u.hostname or "127.0.0.1", u.port or 6379
    err = _tcp_error(host, port) if u.scheme in ("redis", "rediss") else None
    if err is None:
        import redis

        try:
            client = redis.Redis.from_url(url, socket_timeout=3.0)
            try:
                if client.ping():
                    return url
                err = "PING did not return PONG"
            finally:
                client.close()
        except redis.RedisError as e:
            err = f"{type(e).__name__}: {e}"
    pytest.fail(
        f"Redis is unreachable at TAILGUARD_REDIS_URL={url} ({err}). "
        "Start the local stack with scripts/up (or point TAILGUARD_REDIS_URL at a Redis).",
        pytrace=False,
    )


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("topic")`` -> ``"tgtest-topic-<test name>-<random hex>"``.

    Safe as a Kafka topic, consumer group, faust app id and Redis key prefix
    (letters, digits, ``-`` and ``.`` only, at most 120 characters).
    """
    test = re.sub(r"[^A-Za-z0-9.-]+", "-", request.node.name).strip("-")[:60]

    def make(kind: str = "x") -> str:
        kind_safe = re.sub(r"[^A-Za-z0-9.-]+", "-", kind)[:30]
        return f"tgtest-{kind_safe}-{test}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Under CI=true an integration test may not skip: a skip there hides a missing stack."""
    report = yield
    if (
        os.environ.get("CI") == "true"
        and report.skipped
        and item.get_closest_marker("integration") is not None
        and not hasattr(report, "wasxfail")
    ):
        report.outcome = "failed"
        report.longrepr = f"integration test skipped under CI=true (never allowed): {report.longrepr}"
    return report
