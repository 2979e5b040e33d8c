"""Shared fixtures: where the real Kafka and Redis are, unique names, and parallel runs.

``kafka_bootstrap`` and ``redis_url`` never skip: when the broker or Redis does not answer, the
test FAILS naming the ``TAILGUARD_*`` variable and ``scripts/up``. ``unique_name(kind)`` returns a
name no other test run will use (topics, consumer groups, app ids, Redis key prefixes), so that
tests run in parallel against the one shared stack.

Parallel runs (pytest-xdist; ``scripts/test``: ``TAILGUARD_TEST_WORKERS`` workers, ``--dist
loadgroup``, the tests handed out longest first). A test runs beside others (its own names, free
ports, temporary directories) unless marked:

* ``@pytest.mark.serial``: it runs alone (a lock shared by the run's workers): it measures the
  worker's RSS, times ticks under a flood, or stops or freezes part of the shared stack.
* ``@pytest.mark.xdist_group("name")``: the group's tests run on one worker, one after the other
  (a module fixture that must exist once, e.g. a Redis Cluster on free ports).

A module- or session-scoped fixture runs once per worker; ``built_once`` builds something
expensive once per run.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO
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


_serial_locks: tuple[IO[bytes], IO[bytes]] | None = None


def _run_dir(config: pytest.Config) -> Path:
    """A directory of this test run that all its pytest-xdist workers share: the run's base
    temporary directory (each worker's ``--basetemp`` is ``<run's basetemp>/popen-gwN``)."""
    if config.option.basetemp:
        return Path(config.option.basetemp).parent
    run_dir = Path(tempfile.gettempdir()) / f"tailguard-pytest-{config.workerinput['testrunuid']}"  # type: ignore[attr-defined]
    run_dir.mkdir(exist_ok=True)                       # no tmpdir plugin: one directory per run id
    return run_dir


def _locks(config: pytest.Config) -> tuple[IO[bytes], IO[bytes]]:
    """This run's gate and test lock (files in ``_run_dir``)."""
    global _serial_locks
    if _serial_locks is None:
        run_dir = _run_dir(config)
        _serial_locks = (open(run_dir / "serial.gate", "a+b"), open(run_dir / "serial.lock", "a+b"))  # noqa: SIM115
    return _serial_locks


@pytest.fixture(scope="session")
def built_once(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[Path], None]], Path]:
    """``built_once("name", build)`` -> a directory that ``build(directory)`` filled, once per test
    run, also under pytest-xdist: the first worker to ask builds it (under a lock), the others wait
    for it and reuse it. A build that raises leaves nothing behind: the next one to ask tries again."""
    config = request.config
    base = _run_dir(config) if hasattr(config, "workerinput") else tmp_path_factory.getbasetemp()

    def once(name: str, build: Callable[[Path], None]) -> Path:
        where = base / f"once-{name}"
        with open(base / f"once-{name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)             # released when closed
            if not (where / ".built").is_file():
                shutil.rmtree(where, ignore_errors=True)
                where.mkdir()
                build(where)
                (where / ".built").touch()
        return where

    return once


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under pytest-xdist, a ``serial`` test holds the run's lock exclusively (set-up, call and
    tear-down), every other test holds it shared. The gate, taken before either, gives a waiting
    serial test precedence over tests not yet started. Outside the timeouts (tryfirst: this
    wrapper encloses pytest-timeout's), so waiting for the lock never counts as a test's time."""
    if not hasattr(item.config, "workerinput"):      # not a pytest-xdist worker: nothing beside us
        return (yield)
    gate, lock = _locks(item.config)
    serial = item.get_closest_marker("serial") is not None
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
    except BaseException:
        fcntl.flock(gate, fcntl.LOCK_UN)
        raise
    if not serial:
        fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        if serial:
            fcntl.flock(gate, fcntl.LOCK_UN)


def _expected_length(item: pytest.Item) -> tuple[int, int, float]:
    """Sort key, longest first: serial, integration or slow (by the timeout mark), the rest."""
    timeout = item.get_closest_marker("timeout")
    timeout_s = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
    return (item.get_closest_marker("serial") is None,
            item.get_closest_marker("integration") is None and item.get_closest_marker("slow") is None,
            -timeout_s)


@pytest.hookimpl(trylast=True)          # after pytest-xdist's, which names each grouped test "…@group"
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (every worker sorts alike, so their collections agree): longest first.
    A group that pytest-xdist did not apply (a pytest it does not work with) stops the run."""
    if not hasattr(config, "workerinput"):
        return
    if getattr(config.option, "loadgroup", False):             # pytest-xdist sets it on its workers
        lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist did not group {lost[:3]} (xdist_group): this pytest-xdist "
                                    "does not work with this pytest; install what pyproject.toml's dev extra pins")
    items.sort(key=_expected_length)
