"""tailguard over Kafka SASL_SSL and Redis TLS with ACL users, end to end, on the real servers.

The local stack (``scripts/up``) opens, besides the plain listeners, a Kafka
SASL_SSL listener (SCRAM-SHA-512, user ``tailguard``) on
``TAILGUARD_KAFKA_SASL_SSL_PORT`` (9094) and a Redis TLS port on
``TAILGUARD_REDIS_TLS_PORT`` (6380), with a throwaway CA and passwords made at
start in ``$TAILGUARD_RUN/secure``. These tests FAIL (never skip) when that is
missing.

Each test makes its own Redis ACL users with exactly the documented rules
(:func:`tailguard.routing.acl.acl_rules`) for its own key prefix, so a command that
tailguard needs but the ACL lacks fails here. Shown:

* the worker (consumer, faust app, producers, topic admin), the emitter and
  ``tailguard proxy`` (routing reader, ``--report-failures`` producer) work
  over SASL_SSL + TLS/ACL: a slow node leaves routing and the proxy stops
  sending it traffic;
* no secret appears in ``tailguard settings``, the worker's debug log or
  ``/metrics``;
* a wrong password or an untrusted CA stops the worker and the proxy at start,
  within seconds, with one line naming the setting;
* the diagnostics agent (``tailguard diagnose``) answers a request over SASL_SSL with the
  worker's settings, and stops with one line on a wrong password.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from acl_users import acl_users
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from worker_harness import HEALTHY, NODES, ROOT, Worker, WorkerEnv, free_port, produce, read_topic, routing, wait_for

from tailguard.emitter import LatencyEmitter
from tailguard.lb.testing import echo_backend, spawn
from tailguard.security import kafka_client_options
from tailguard.settings import load

pytestmark = [pytest.mark.integration]

MODEL = "llm"


@dataclass(frozen=True)
class SecureStack:
    """Where the secure listeners are and the throwaway material of ``scripts/lib/secure.sh``."""

    kafka: str          # host:port of the SASL_SSL listener
    redis_url: str      # rediss://host:port/0
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    def kafka_password(self) -> str:
        return (self.dir / "kafka.password").read_text().splitlines()[0]

    def kafka_env(self, **over: str) -> dict[str, str]:
        env = {
            "TAILGUARD_KAFKA_BOOTSTRAP": self.kafka,
            "TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TAILGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "TAILGUARD_KAFKA_SASL_USERNAME": "tailguard",
            "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(self.dir / "kafka.password"),
            "TAILGUARD_KAFKA_SSL_CAFILE": str(self.ca),
        }
        env.update(over)
        return env


@pytest.fixture(scope="session")
def secure_stack() -> SecureStack:
    run = Path(os.environ.get("TAILGUARD_RUN") or Path(os.environ.get("TMPDIR", "/tmp")) / "tailguard-stack")
    kafka_port = int(os.environ.get("TAILGUARD_KAFKA_SASL_SSL_PORT", "9094"))
    redis_port = int(os.environ.get("TAILGUARD_REDIS_TLS_PORT", "6380"))
    stack = SecureStack(f"127.0.0.1:{kafka_port}", f"rediss://127.0.0.1:{redis_port}/0", run / "secure")
    problems = [f"{f} is missing" for f in ("ca.pem", "kafka.password", "redis.password")
                if not (stack.dir / f).is_file()]
    for what, port in (("Kafka SASL_SSL", kafka_port), ("Redis TLS", redis_port)):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
        except OSError as e:
            problems.append(f"{what} on 127.0.0.1:{port}: {e}")
    if problems:
        pytest.fail(
            f"the local stack's secure listeners are not there ({'; '.join(problems)}; TAILGUARD_RUN={run}). "
            "Start them with scripts/up (a stack started by older scripts: scripts/down; scripts/up).",
            pytrace=False)
    return stack


@pytest.fixture(scope="session")
def untrusted_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that signed nothing the stack uses."""
    d = tmp_path_factory.mktemp("other-ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=some other CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem")],
                   check=True, capture_output=True)
    return d / "ca.pem"


AclUser = Callable[..., Awaitable[dict[str, str]]]


@pytest.fixture
async def acl_user(secure_stack: SecureStack, tmp_path: Path,
                   unique_name: Callable[[str], str]) -> AsyncIterator[AclUser]:
    """``await acl_user(prefix, role, without=())`` → the TAILGUARD_REDIS_* env of a new ACL user
    with exactly ``acl_rules(prefix, role)`` (less the commands ``without``), over TLS. Users and
    their keys are deleted afterwards."""
    admin = aioredis.Redis.from_url(secure_stack.redis_url, ssl_ca_certs=str(secure_stack.ca))
    try:
        async with acl_users(admin, unique_name) as make_user:
            async def make(prefix: str, role: str, without: tuple[str, ...] = ()) -> dict[str, str]:
                user, password = await make_user(prefix, role, without)
                pw_file = tmp_path / f"{user}.password"
                pw_file.write_text(password + "\n")
                return {"TAILGUARD_REDIS_URL": secure_stack.redis_url, "TAILGUARD_REDIS_USERNAME": user,
                        "TAILGUARD_REDIS_PASSWORD_FILE": str(pw_file),
                        "TAILGUARD_REDIS_SSL_CAFILE": str(secure_stack.ca)}

            yield make
    finally:
        await admin.aclose()


def _secrets_of(env: dict[str, str]) -> list[str]:
    out = []
    for k, v in env.items():
        if k.endswith("_PASSWORD_FILE"):
            out.append(Path(v).read_text().strip())
    assert out and all(len(s) >= 16 for s in out)
    return out


async def _feed(em: LatencyEmitter, stop: asyncio.Event) -> None:
    """Every 0.1 s, 10 samples per node; ``slow`` is 3× slower."""
    import random
    rng = random.Random(11)
    while not stop.is_set():
        for node in NODES:
            base = 3000.0 if node == "slow" else 1000.0
            for _ in range(10):
                em.record(node, MODEL, base * rng.lognormvariate(0, 0.15))
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_worker_emitter_and_proxy_end_to_end_over_sasl_ssl_and_redis_tls_acl(
        secure_stack: SecureStack, acl_user: AclUser, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    name = unique_name("sec")
    worker_redis = await acl_user(name, "worker")
    reader_redis = await acl_user(name, "reader")
    metrics_port = free_port()
    env = WorkerEnv(name, secure_stack.kafka, secure_stack.redis_url,
                    extra={**secure_stack.kafka_env(), **worker_redis, "TAILGUARD_LOG_LEVEL": "debug",
                           "TAILGUARD_METRICS_PORT": str(metrics_port)})
    await env.create_topics()          # the topic admin over SASL_SSL
    kafka_settings = load(secure_stack.kafka_env())
    secrets_ = _secrets_of({**worker_redis, **reader_redis, **secure_stack.kafka_env()})
    r = aioredis.Redis.from_url(secure_stack.redis_url, ssl_ca_certs=str(secure_stack.ca))
    worker = Worker(env.environ(), tmp_path / "worker.log")
    stop_feed = asyncio.Event()
    try:
        async with AsyncExitStack() as stack:
            em = await stack.enter_async_context(LatencyEmitter(
                secure_stack.kafka, topic=env.topic("latency_events"), linger_s=0.05,
                producer_options=kafka_client_options(kafka_settings)))
            feeding = asyncio.create_task(_feed(em, stop_feed))
            backends = {n: await stack.enter_async_context(echo_backend(n)) for n in NODES}
            proxy_env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
            proxy_env.update({**secure_stack.kafka_env(), **reader_redis,
                              "TAILGUARD_TOPIC_LATENCY_EVENTS": env.topic("latency_events")})
            proc = await spawn(
                stack, sys.executable, "-m", "tailguard.cli", "proxy", "--listen", "127.0.0.1:0", "--backends",
                ",".join(f"{n}={b.url}" for n, b in backends.items()), "--model-header", "X-Model",
                "--probe-share", "0", "--key-prefix", name, "--poll-interval-s", "0.2", "--report-failures",
                stderr=asyncio.subprocess.PIPE, env=proxy_env, cwd=ROOT)
            assert proc.stderr is not None
            lines: list[str] = []
            while not (m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", lines[-1] if lines else "")):
                lines.append((await asyncio.wait_for(proc.stderr.readline(), 30)).decode())
                assert lines[-1] and len(lines) < 20, lines
            assert "failures reported to" in lines[-1], lines
            assert not any(s in line for s in secrets_ for line in lines)
            http = await stack.enter_async_context(aiohttp.ClientSession())

            async def slow_out() -> bool:
                return await routing(r, name, MODEL) == HEALTHY
            await wait_for(slow_out, 90, "the slow node to leave the routing set", worker.tail)

            async def proxy_spread() -> Counter[str]:
                got: Counter[str] = Counter()
                for _ in range(12):
                    async with http.get(f"http://127.0.0.1:{m.group(1)}/v1/models",
                                        headers={"X-Model": MODEL}) as resp:
                        assert resp.status == 200
                        got[resp.headers["X-Tailguard-Node"]] += 1
                return got

            async def proxy_follows() -> bool:
                return set(await proxy_spread()) == HEALTHY
            await wait_for(proxy_follows, 20, "the proxy to route to the healthy nodes only")
            assert "slow" not in await proxy_spread()
            stop_feed.set()
            await feeding
            assert em.stats.sent > 0 and em.stats.dropped == 0, em.stats
            body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert worker.proc.poll() is None, worker.tail()
    finally:
        stop_feed.set()
        worker.stop()
        await r.aclose()

    # No secret in /metrics, in the worker's debug log, or in `tailguard settings`.
    assert "tailguard_samples_in_total" in body
    log = worker.log()
    assert "[DEBUG]" in log, log[-2000:]
    # The ACL allowed every command: no write was refused (a script that fails half way, e.g. at
    # PUBLISH, keeps what it wrote before, so the routing set alone would not show it).
    assert "tailguard_redis_model_rejections_total{" not in body
    assert "Redis refused" not in log and "NOPERM" not in log, log[-3000:]
    settings_env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
    settings_env.update({**secure_stack.kafka_env(), **worker_redis})
    shown = subprocess.run([sys.executable, "-m", "tailguard.cli", "settings"], env=settings_env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "TAILGUARD_KAFKA_SASL_PASSWORD=***" in shown.stdout
    assert "TAILGUARD_REDIS_PASSWORD=***" in shown.stdout
    for secret in secrets_:
        assert secret not in body, "a secret in /metrics"
        assert secret not in log, "a secret in the worker's debug log"
        assert secret not in shown.stdout + shown.stderr, "a secret in tailguard settings"


def _start_refused(argv: list[str], env: dict[str, str], timeout_s: float = 60.0) -> tuple[int, list[str]]:
    """Run ``tailguard ARGV``; its exit code and its non-empty output lines (stdout + stderr)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")} | env
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tailguard.cli", *argv], env=full, cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert time.monotonic() - t0 < 45, "refusal took too long"
    return done.returncode, lines


def _worker_env(name: str, **env: str) -> dict[str, str]:
    return {"TAILGUARD_APP_ID": name, "TAILGUARD_KEY_PREFIX": name, "TAILGUARD_METRICS_PORT": "0",
            "TAILGUARD_WEB_PORT": "0", "TAILGUARD_TOPIC_PARTITIONS": "1",
            **{f"TAILGUARD_TOPIC_{t.upper()}": f"{name}-{t}" for t in (
                "latency_events", "window_stats", "health_changes", "fleet_events",
                "diagnostics_requests", "diagnostics_results", "dead_letter")}, **env}


@pytest.mark.parametrize(("case", "setting"), [
    ("kafka-password", "TAILGUARD_KAFKA_SASL_PASSWORD"),
    ("kafka-ca", "TAILGUARD_KAFKA_SSL_CAFILE"),
    ("redis-password", "TAILGUARD_REDIS_PASSWORD"),
    ("redis-ca", "TAILGUARD_REDIS_SSL_CAFILE"),
])
async def test_worker_refuses_to_start_with_one_line_naming_the_setting(
        secure_stack: SecureStack, acl_user: AclUser, untrusted_ca: Path, unique_name: Callable[[str], str],
        tmp_path: Path, case: str, setting: str) -> None:
    name = unique_name("sec-refused")
    redis_env = await acl_user(name, "worker")
    kafka_env = secure_stack.kafka_env()
    wrong = secrets.token_hex(16)
    if case == "kafka-password":
        (tmp_path / "wrong").write_text(wrong)
        kafka_env["TAILGUARD_KAFKA_SASL_PASSWORD_FILE"] = str(tmp_path / "wrong")
    elif case == "kafka-ca":
        kafka_env["TAILGUARD_KAFKA_SSL_CAFILE"] = str(untrusted_ca)
    elif case == "redis-password":
        (tmp_path / "wrong").write_text(wrong)
        redis_env["TAILGUARD_REDIS_PASSWORD_FILE"] = str(tmp_path / "wrong")
    else:
        redis_env["TAILGUARD_REDIS_SSL_CAFILE"] = str(untrusted_ca)
    code, lines = _start_refused(["worker"], _worker_env(name, **kafka_env, **redis_env))
    assert code == 2 and len(lines) == 1, lines
    (line,) = lines
    assert line.startswith(f"tailguard worker: {setting}: "), line
    assert "Traceback" not in line and wrong not in line
    assert secure_stack.kafka_password() not in line
    if case.endswith("password"):
        assert "refused the" in line and "login" in line
    else:
        assert "not trusted by the CA file" in line and str(untrusted_ca) in line


@pytest.mark.parametrize("case", ["redis-password", "kafka-password"])
async def test_proxy_refuses_to_start_with_one_line_naming_the_setting(
        secure_stack: SecureStack, acl_user: AclUser, unique_name: Callable[[str], str],
        tmp_path: Path, case: str) -> None:
    name = unique_name("sec-proxy")
    redis_env = await acl_user(name, "reader")
    kafka_env = secure_stack.kafka_env()
    (tmp_path / "wrong").write_text(secrets.token_hex(16))
    if case == "redis-password":
        redis_env["TAILGUARD_REDIS_PASSWORD_FILE"] = str(tmp_path / "wrong")
    else:
        kafka_env["TAILGUARD_KAFKA_SASL_PASSWORD_FILE"] = str(tmp_path / "wrong")
    code, lines = _start_refused(
        ["proxy", "--listen", "127.0.0.1:0", "--backends", "a=http://127.0.0.1:1", "--key-prefix", name,
         "--report-failures"], {**kafka_env, **redis_env})
    setting = "TAILGUARD_REDIS_PASSWORD" if case == "redis-password" else "TAILGUARD_KAFKA_SASL_PASSWORD"
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"tailguard proxy: {setting}: "), lines


async def test_a_missing_permission_is_refused_before_the_writer_writes_anything(
        secure_stack: SecureStack, acl_user: AclUser, unique_name: Callable[[str], str]) -> None:
    """Redis does not roll back a script that fails half way; the writer's script checks the ACL
    first, so a user without +publish gets NOPERM, counted for that model, and no key changes."""
    from test_routing_redis import tick

    from tailguard.routing.client import connect_for
    from tailguard.routing.keys import Keys
    from tailguard.routing.writer import RoutingWriter

    prefix = unique_name("sec-noperm")
    client = connect_for(load(await acl_user(prefix, "worker", without=("publish",))))
    rejected: list[str] = []

    class Metrics:
        def write_failed(self, model: str, error: BaseException) -> None:
            pass

        def model_rejected(self, model: str, error: BaseException) -> None:
            rejected.append(f"{model}: {type(error).__name__}: {error}")

        def empty_refused(self, model: str) -> None:
            pass

        def written(self, model: str, *, changed: bool, version: int) -> None:
            pass

    try:
        writer = RoutingWriter(client, prefix, metrics=Metrics())
        assert not await writer.apply(tick({"a", "b"}, model=MODEL))
        assert len(rejected) == 1 and "NoPermissionError" in rejected[0] and "PUBLISH" in rejected[0], rejected
        k = Keys(prefix)
        assert await client.exists(k.routing(MODEL), k.version(MODEL), k.nodes(MODEL), k.models) == 0
    finally:
        await client.aclose()


async def test_redis_client_certificate_over_tls(secure_stack: SecureStack, acl_user: AclUser,
                                                 unique_name: Callable[[str], str]) -> None:
    """mTLS: the client certificate the stack's CA signed is accepted (Redis verifies it when sent)."""
    from tailguard.routing.client import connect_for

    env = await acl_user(unique_name("sec-mtls"), "reader")
    env |= {"TAILGUARD_REDIS_SSL_CERTFILE": str(secure_stack.dir / "client.pem"),
            "TAILGUARD_REDIS_SSL_KEYFILE": str(secure_stack.dir / "client.key")}
    client = connect_for(load(env))
    try:
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_the_diagnostics_agent_answers_over_sasl_ssl_and_a_wrong_password_is_one_line(
        secure_stack: SecureStack, kafka_bootstrap: str, unique_name: Callable[[str], str],
        tmp_path: Path) -> None:
    # `tailguard diagnose` with the worker's SASL_SSL settings (SCRAM, CA file, password _FILE).
    sys.path.insert(0, str(ROOT / "tests" / "agent"))
    from gpu_fakes import fake_env

    req, res = unique_name("diag-req"), unique_name("diag-res")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(req, 1, 1), NewTopic(res, 1, 1)])
    finally:
        await admin.close()
    conf = tmp_path / "agent.toml"
    conf.write_text(f'state_dir = "{tmp_path}"\n[timeouts_s]\nnvidia_smi = 2\ncompute_apps = 2\ndcgmi = 2\n')
    env = {k: v for k, v in fake_env("ecc").items() if not k.startswith("TAILGUARD_KAFKA_")}
    env |= secure_stack.kafka_env(TAILGUARD_TOPIC_DIAGNOSTICS_REQUESTS=req,
                                  TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS=res)
    cmd = [sys.executable, "-m", "tailguard.cli", "diagnose", "--node", "ecc", "--config", str(conf)]
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        await produce(kafka_bootstrap, req, [(b"ecc", json.dumps({
            "request_id": "req-ecc", "ts": time.time(), "node_id": "ecc", "model": "llm",
            "reason": "relative_p50", "collect": []}).encode())])

        async def answered() -> list[Any] | None:
            assert agent.poll() is None, log.read_text()
            return await read_topic(kafka_bootstrap, res) or None
        (rec,) = await wait_for(answered, 60, "the agent's result over SASL_SSL", log.read_text)
        got = json.loads(rec.value)
        assert (got["node_id"], got["request_id"], got["verdict"]) == ("ecc", "req-ecc", "not_recoverable")
    finally:
        agent.terminate()
        agent.wait(15)
    # A wrong password: one line naming the setting, exit 2, within seconds; no secret in it.
    wrong = secrets.token_hex(16)
    (tmp_path / "wrong").write_text(wrong)
    done = subprocess.run(cmd, cwd=ROOT, env={**env, "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "wrong")},
                          capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("tailguard diagnose: TAILGUARD_KAFKA_SASL_PASSWORD: Kafka at "), lines[0]
    assert "refused the SCRAM-SHA-512 login of user 'tailguard'" in lines[0]
    assert wrong not in lines[0] and secure_stack.kafka_password() not in lines[0]
