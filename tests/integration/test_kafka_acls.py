"""The Kafka ACLs of docs/production.md ("Who may write diagnostics results"), applied as
written, on the stack's real broker.

``scripts/kafka`` runs the broker with KRaft's ``StandardAuthorizer``; the plain listener's
``User:ANONYMOUS`` is the super user (the stack's admin path) and topics without any ACL stay
open to everyone (``allow.everyone.if.no.acl.found=true``, a local-stack choice; production's
default is false). This test takes every ``kafka-acls.sh`` line of that docs block, renames the
users, topics and group prefix to this test's own, and runs them with Kafka's own ``AclCommand``
(``ConfigCommand`` makes the SCRAM users), all in one JVM (``java/KafkaTools.java``). Then, over
SASL_SSL with tailguard's own client settings:

* the agent writes a result, and the worker reads it;
* the worker writes a request, and the agent reads it in its group;
* neither the worker nor an outsider may write a result, and the agent may not write a request.

A broker started by older scripts (no authorizer) fails the test with what to do.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from foreign_clients import JAVA_DIR, LOG4J, kafka_libs
from test_secure import SecureStack, secure_stack  # noqa: F401 - the fixture
from worker_harness import ROOT

from tailguard.security import kafka_client_options
from tailguard.settings import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DOCS = ROOT / "docs" / "production.md"
SECTION = "### Who may write diagnostics results"


def documented_acl_lines() -> list[list[str]]:
    """The ``kafka-acls.sh $B …`` lines of the docs block, as argument lists (``$B`` dropped)."""
    text = DOCS.read_text()
    assert SECTION in text, f"{DOCS} has no section {SECTION!r}"
    block = re.search(r"```\n(.*?)```", text[text.index(SECTION):], re.S)
    assert block, f"no code block under {SECTION!r} in {DOCS}"
    lines = [shlex.split(line)[2:] for line in block.group(1).splitlines()
             if line.startswith("kafka-acls.sh $B ")]
    assert len(lines) >= 5, f"expected the worker's and the agents' ACL lines, found {lines}"
    return lines


@dataclass(frozen=True)
class Names:
    """This test's stand-ins for the documented users, topics and group prefix."""

    worker: str
    agent: str
    outsider: str
    requests: str
    results: str
    agent_groups: str

    def rename(self, args: list[str]) -> list[str]:
        swap = {"User:tailguard": f"User:{self.worker}", "User:tailguard-agent": f"User:{self.agent}",
                "node-diagnostics-requests": self.requests, "node-diagnostics-results": self.results,
                "tailguard-agent-": self.agent_groups}
        out = [swap.get(a, a) for a in args]
        unknown = [a for a, b in zip(args, out, strict=True)
                   if a == b and ("tailguard" in a or "node-diagnostics" in a)]
        assert not unknown, f"the docs' ACL lines name something this test does not map: {unknown}"
        return out


def run_kafka_tools(lines: list[list[str]]) -> str:
    """Run Kafka's tools (main class + arguments per line) in one JVM; their output."""
    cmd = ["java", f"-Dlog4j2.configurationFile={LOG4J}", "-cp", f"{kafka_libs()}/*",
           str(JAVA_DIR / "KafkaTools.java")]
    r = subprocess.run(cmd, input="".join("\t".join(line) + "\n" for line in lines), text=True,
                       capture_output=True, timeout=120)
    out = r.stdout + r.stderr
    if "No Authorizer is configured" in out:
        pytest.fail("the broker has no authorizer: it was started by older scripts. Restart it: "
                    "scripts/kafka stop; scripts/kafka start", pytrace=False)
    assert r.returncode == 0, f"Kafka's tools failed ({r.returncode}):\n{out[-3000:]}"
    return out


@asynccontextmanager
async def documented_acls(kafka: str, n: Names, passwords: dict[str, str]) -> AsyncIterator[None]:
    acl = "org.apache.kafka.tools.AclCommand"
    config = "kafka.admin.ConfigCommand"
    boot = ["--bootstrap-server", kafka]
    docs = [n.rename(args) for args in documented_acl_lines()]
    users = [[config, *boot, "--alter", "--add-config", f"SCRAM-SHA-512=[password={pw}]",
              "--entity-type", "users", "--entity-name", user] for user, pw in passwords.items()]
    await asyncio.to_thread(run_kafka_tools, users + [[acl, *boot, *args] for args in docs])
    try:
        yield
    finally:
        removes = [[acl, *boot, *["--remove" if a == "--add" else a for a in args], "--force"]
                   for args in docs]
        drops = [[config, *boot, "--alter", "--delete-config", "SCRAM-SHA-512", "--entity-type", "users",
                  "--entity-name", user] for user in passwords]
        await asyncio.to_thread(run_kafka_tools, removes + drops)


class Clients:
    """aiokafka clients over SASL_SSL as one of this test's users, built by tailguard's settings."""

    def __init__(self, stack: SecureStack, passwords: dict[str, str], tmp_path: Path) -> None:
        self.stack, self.passwords, self.tmp_path = stack, passwords, tmp_path

    def options(self, user: str) -> dict[str, object]:
        pw_file = self.tmp_path / f"{user}.password"
        pw_file.write_text(self.passwords[user] + "\n")
        env = self.stack.kafka_env(TAILGUARD_KAFKA_SASL_USERNAME=user,
                                   TAILGUARD_KAFKA_SASL_PASSWORD_FILE=str(pw_file))
        return {"bootstrap_servers": self.stack.kafka, **kafka_client_options(load(env))}

    async def write(self, user: str, topic: str, value: bytes) -> str | None:
        """None when the write is acknowledged, else the error's class name."""
        p = AIOKafkaProducer(request_timeout_ms=10_000, **self.options(user))
        await p.start()
        try:
            await p.send_and_wait(topic, value, key=b"k")
        except KafkaError as e:
            return type(e).__name__
        finally:
            await p.stop()
        return None

    async def write_once_allowed(self, user: str, topic: str, value: bytes,
                                 within_s: float = 30.0) -> str | None:
        """:meth:`write`, again while it is refused, for up to ``within_s``: the broker applies
        new ACLs from the metadata log a moment after ``AclCommand`` returns (asynchronously
        under KRaft), so a write right after them can be refused by the ACLs before them."""
        deadline = asyncio.get_running_loop().time() + within_s
        while (err := await self.write(user, topic, value)) == "TopicAuthorizationFailedError" \
                and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)
        return err

    async def read_one(self, user: str, topic: str, group: str) -> bytes:
        c = AIOKafkaConsumer(topic, group_id=group, auto_offset_reset="earliest", **self.options(user))
        await c.start()
        try:
            msg = await asyncio.wait_for(c.getone(), timeout=30)
            assert msg.value is not None
            return msg.value
        finally:
            await c.stop()


async def test_the_documented_acls_let_only_agents_write_results(
        secure_stack: SecureStack, kafka_bootstrap: str, unique_name: Callable[[str], str],  # noqa: F811
        tmp_path: Path) -> None:
    n = Names(worker=unique_name("worker"), agent=unique_name("agent"), outsider=unique_name("outsider"),
              requests=unique_name("requests"), results=unique_name("results"),
              agent_groups=unique_name("agent-groups") + "-")
    passwords = {u: secrets.token_hex(16) for u in (n.worker, n.agent, n.outsider)}
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in (n.requests, n.results)])
        async with documented_acls(kafka_bootstrap, n, passwords):
            c = Clients(secure_stack, passwords, tmp_path)
            # The broker applies the lines in order: once the last is in force, so are the others.
            last = n.rename(documented_acl_lines()[-1])
            assert {f"User:{n.agent}", "Write", n.results} <= set(last), (
                f"the docs' last ACL line is not the agents' Write on results: {last}")
            assert await c.write_once_allowed(n.agent, n.results, b"result-from-agent") is None
            assert await c.write(n.worker, n.requests, b"request-from-worker") is None
            refused = {who: await c.write(who, n.results, b"forged") for who in (n.worker, n.outsider)}
            refused["agent writing a request"] = await c.write(n.agent, n.requests, b"forged")
            assert all(err == "TopicAuthorizationFailedError" for err in refused.values()), refused
            assert await c.read_one(n.worker, n.results, unique_name("worker-group")) == b"result-from-agent"
            assert await c.read_one(n.agent, n.requests, n.agent_groups + "host-1") == b"request-from-worker"
    finally:
        await admin.delete_topics([n.requests, n.results])
        await admin.close()
