"""`tailguard diagnose` against the real broker, with fake GPU tools replaying recorded cases.

One agent process per case (node id = case name), each in its own consumer
group on the same request topic: every agent sees every request and answers
only its node's, one result each, in the worker's result contract.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from worker_harness import ROOT, produce, read_topic, wait_for

sys.path.insert(0, str(ROOT / "tests" / "agent"))
from gpu_fakes import fake_env

from tailguard.streaming.wire import parse_diagnostics_result

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EXPECTED = {  # case → (verdict, a reason it must name)
    "healthy": ("inconclusive", "no fault found"),
    "thermal": ("recoverable", "thermal_throttle"),
    "ecc": ("not_recoverable", "ecc_uncorrectable"),
    "xid79": ("not_recoverable", "xid_fatal"),
    "stray": ("recoverable", "stray_process"),
    "hung": ("inconclusive", "did not finish: nvidia_smi, compute_apps, dcgmi"),
}
AGENT_TOML = """
[timeouts_s]
nvidia_smi = 2
compute_apps = 2
dcgmi = 2
"""


async def make_topics(kafka: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 4, 1) for n in names])
    finally:
        await admin.close()


@contextmanager
def agents(kafka: str, req: str, res: str, cases: list[str], tmp_path: Path,
           group_suffix: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    conf = tmp_path / "agent.toml"
    conf.write_text(f'state_dir = "{tmp_path}"\n' + AGENT_TOML)
    procs = {}
    try:
        for case in cases:
            env = fake_env(case)
            env.update({"TAILGUARD_KAFKA_BOOTSTRAP": kafka, "TAILGUARD_TOPIC_DIAGNOSTICS_REQUESTS": req,
                        "TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS": res})
            log = open(tmp_path / f"agent-{case}.log", "ab")  # noqa: SIM115 - closed with the process
            procs[case] = subprocess.Popen(
                [sys.executable, "-m", "tailguard.cli", "diagnose", "--node", case, "--config", str(conf),
                 "--group", f"{req}-{case}-{group_suffix}"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
        yield procs
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def alive(procs: dict[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    dead = [c for c, p in procs.items() if p.poll() is not None]
    assert not dead, f"agents exited: {dead}\n{logs(tmp_path)}"


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:])
                     for f in sorted(tmp_path.glob("agent-*.log")))


def request(node: str, model: str = "llm", ts: float | None = None, **more: Any) -> tuple[bytes, bytes]:
    body = {"request_id": f"req-{node}-{model}", "ts": time.time() if ts is None else ts, "node_id": node,
            "model": model, "reason": "relative_p50",
            "collect": ["kernel_profile", "gpu_memory_state", "ecc_xid_errors"], **more}
    return node.encode(), json.dumps(body).encode()


async def results(kafka: str, topic: str) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in await read_topic(kafka, topic)]


MARKER = "zz-marker"


async def _after_markers(kafka: str, req: str, res: str, nodes: list[str],
                         tmp_path: Path) -> list[dict[str, Any]]:
    """Every result but the markers', once each node's agent answered a marker request sent now."""
    await produce(kafka, req, [request(n, model=MARKER) for n in nodes])

    async def markers_in() -> list[dict[str, Any]] | None:
        got = await results(kafka, res)
        return got if sum(r["model"] == MARKER for r in got) >= len(nodes) else None
    got = await wait_for(markers_in, 60, "the marker requests answered", lambda: logs(tmp_path))
    return [r for r in got if r["model"] != MARKER]


async def test_each_recorded_case_gets_one_result_with_its_verdict(
        kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    req, res = unique_name("req"), unique_name("res")
    await make_topics(kafka_bootstrap, req, res)
    with agents(kafka_bootstrap, req, res, list(EXPECTED), tmp_path, "a") as procs:
        await produce(kafka_bootstrap, req, [
            (b"x", b"not json"), (b"x", b'{"node_id": 7}'),     # bad: logged and skipped
            request("someone-else"),                               # no agent for it
            *(request(case) for case in EXPECTED),
            request("ecc", model="embed"),                         # a second model on one node
        ])

        async def all_answered() -> list[dict[str, Any]] | None:
            alive(procs, tmp_path)
            got = await results(kafka_bootstrap, res)
            return got if len(got) >= len(EXPECTED) + 1 else None
        await wait_for(all_answered, 60, "one result per request", lambda: logs(tmp_path))
        # Nothing more may come: each agent answers its node's requests in order (one partition
        # per node), so once it has answered a last marker request, every earlier answer is in.
        got = await _after_markers(kafka_bootstrap, req, res, list(EXPECTED), tmp_path)
        assert all(p.poll() is None for p in procs.values()), logs(tmp_path)
    assert sorted((r["node_id"], r["model"]) for r in got) == sorted(
        [(c, "llm") for c in EXPECTED] + [("ecc", "embed")])
    for r in got:
        verdict, reason = EXPECTED[r["node_id"]]
        assert r["verdict"] == verdict and reason in r["reasons"], (r["node_id"], r["reasons"])
        assert r["recoverable"] is (verdict != "not_recoverable")
        assert r["request_id"] == f"req-{r['node_id']}-{r['model']}"
        # The worker's own parser accepts every result (the existing contract).
        d = parse_diagnostics_result(json.dumps(r).encode())
        assert (d.node_id, d.model, d.recoverable) == (r["node_id"], r["model"], r["recoverable"])
    hung = next(r for r in got if r["node_id"] == "hung")
    status = {c["name"]: c["status"] for c in hung["checks"]}
    assert status["nvidia_smi"] == "timeout" and status["dcgmi"] == "timeout", hung["checks"]
    assert hung["duration_s"] < 10, hung["duration_s"]
    xid = next(r for r in got if r["node_id"] == "xid79")
    assert any(e["kind"] == "xid_fatal" and e["data"]["xid"] == 79 and e["class"] == "not_recoverable"
               for e in xid["evidence"]), xid["evidence"]


async def test_a_restarted_agent_answers_what_came_while_it_was_down_and_nothing_twice(
        kafka_bootstrap: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    req, res = unique_name("req"), unique_name("res")
    await make_topics(kafka_bootstrap, req, res)
    # Older than max_request_age_s (3600 s): from before this agent's time, never answered.
    await produce(kafka_bootstrap, req, [request("thermal", model="old", ts=time.time() - 7200)])
    with agents(kafka_bootstrap, req, res, ["thermal"], tmp_path, "same"):
        await produce(kafka_bootstrap, req, [request("thermal", model="m1")])

        async def n_results(n: int) -> bool:
            return len(await results(kafka_bootstrap, res)) >= n
        await wait_for(lambda: n_results(1), 60, "the first answer", lambda: logs(tmp_path))
    await produce(kafka_bootstrap, req, [request("thermal", model="m2")])   # while it is down
    with agents(kafka_bootstrap, req, res, ["thermal"], tmp_path, "same"):
        await wait_for(lambda: n_results(2), 60, "the answer to the request sent while down",
                       lambda: logs(tmp_path))
        got = await _after_markers(kafka_bootstrap, req, res, ["thermal"], tmp_path)
    assert [r["model"] for r in got] == ["m1", "m2"], got
