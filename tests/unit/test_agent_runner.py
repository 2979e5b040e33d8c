"""The agent's request handling without Kafka: validation, filtering, one result per request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tailguard.agent.checks import SuiteReport
from tailguard.agent.config import AgentConfig, NodeSpec
from tailguard.agent.findings import CheckOutcome, Finding
from tailguard.agent.runner import Agent, BadRequest, Request, parse_request
from tailguard.streaming.wire import parse_diagnostics_result

NOW = 1_800_000_000.0


class FakeSuite:
    def __init__(self) -> None:
        self.runs: list[tuple[str, str, float | None]] = []

    async def run(self, node: NodeSpec, model: str = "", peer_tflops: float | None = None) -> SuiteReport:
        self.runs.append((node.node_id, model, peer_tflops))
        f = Finding("xid_fatal", "xid", "XID 79 x1 on PCI 0f:00", gpu=1, data={"xid": 79})
        return SuiteReport([CheckOutcome("xid", "ok", 0.1, "read with dmesg", (f,))], [{"index": "0"}])


def agent(suite: FakeSuite) -> Agent:
    cfg = AgentConfig((NodeSpec("n1"), NodeSpec("n2", (2, 3))), max_request_age_s=600)
    return Agent(cfg, suite, clock=lambda: NOW, host="h")  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [None, b"", b"[1]", b"nope", b'{"node_id": "n1"}', b'{"node_id": "", "model": "m"}',
                                 b'{"node_id": 5, "model": "m"}'])
def test_bad_requests_are_refused_with_a_reason(raw: Any) -> None:
    with pytest.raises(BadRequest):
        parse_request(raw)


def test_a_request_is_parsed_with_its_optional_fields() -> None:
    r = parse_request(b'{"request_id": "r", "ts": 5, "node_id": "n1", "model": "m", "reason": "x", '
                      b'"collect": [], "peer_gemm_tflops": 210.5}')
    assert r == Request("n1", "m", "r", 5.0, "x", 210.5)


def test_only_fresh_requests_for_own_nodes_are_wanted() -> None:
    a = agent(FakeSuite())
    assert a.wanted(Request("n1", "m", ts=NOW - 10))
    assert a.wanted(Request("n2", "m"))                    # no ts: answered
    assert not a.wanted(Request("n3", "m", ts=NOW))        # not ours
    assert not a.wanted(Request("n1", "m", ts=NOW - 601))  # too old
    assert a.skipped == 1


async def test_one_result_per_request_one_suite_run_per_node() -> None:
    suite = FakeSuite()
    reqs = [Request("n1", "a", "r1", peer_gemm_tflops=200.0), Request("n1", "b", "r2"), Request("n2", "a", "r3")]
    results = await agent(suite).answer(reqs)
    assert [(r["node_id"], r["model"], r["request_id"]) for r in results] == [
        ("n1", "a", "r1"), ("n1", "b", "r2"), ("n2", "a", "r3")]
    assert suite.runs == [("n1", "a", 200.0), ("n2", "a", None)]
    r = results[0]
    assert (r["verdict"], r["recoverable"], r["reasons"], r["ts"]) == ("not_recoverable", False, ["xid_fatal"], NOW)
    assert r["evidence"] == [{"kind": "xid_fatal", "check": "xid", "detail": "XID 79 x1 on PCI 0f:00", "gpu": 1,
                              "data": {"xid": 79}, "class": "not_recoverable"}]
    assert r["checks"] == [{"name": "xid", "status": "ok", "duration_s": 0.1, "note": "read with dmesg"}]
    assert r["agent"]["host"] == "h" and r["gpus"] == [{"index": "0"}]
    d = parse_diagnostics_result(json.dumps(r).encode())
    assert (d.node_id, d.model, d.recoverable, d.ts) == ("n1", "a", False, NOW)


class BrokenSuite:
    async def run(self, node: NodeSpec, model: str = "", peer_tflops: float | None = None) -> SuiteReport:
        raise RuntimeError("parser bug")


async def test_a_crashing_suite_still_answers_inconclusive() -> None:
    a = Agent(AgentConfig((NodeSpec("n1"),)), BrokenSuite(), clock=lambda: NOW, host="h")  # type: ignore[arg-type]
    (r,) = await a.answer([Request("n1", "m", "r1")])
    assert (r["verdict"], r["recoverable"]) == ("inconclusive", True)
    assert r["checks"] == [{"name": "suite", "status": "error", "duration_s": 0.0, "note": "RuntimeError: parser bug"}]
