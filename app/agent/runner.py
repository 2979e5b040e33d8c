"""The agent's Kafka loop: requests in, one result per request out.

Owns the consumer of ``node-diagnostics-requests`` (written by the worker, key = node id:
``{"request_id", "ts", "node_id", "model", "reason", "collect": [...]}``, optionally
``peer_gemm_tflops``) and the producer of ``node-diagnostics-results`` (key = node id): the
worker's contract (``node_id``, ``model``, ``recoverable``, ``ts``) plus additive fields
(``request_id``, ``verdict``, ``reasons``, ``evidence``, ``checks``, ``gpus``, ``agent``,
``duration_s``). The consumer group is one per agent (``tailguard-agent-<node ids>``),
filtering by ``node_id`` (why: docs/diagnostics.md, "Consumer group").

Guarantees: ``recoverable`` is false only for ``not_recoverable`` (an inconclusive node is
probed as usual, never retired on no evidence); offsets are committed only after every result
of the batch is acknowledged by the broker (at least once: the worker applies a repeated
result as a no-op); a result is published for every fresh request of this agent's nodes,
whatever the checks do (each check bounded by its timeout, the suite by their sum, a crash of
the suite an ``error`` outcome); requests older than ``max_request_age_s`` are not answered,
bad requests are logged and skipped; requests of one node in one batch share one run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard import __version__
from tailguard.agent.checks import Suite, SuiteReport
from tailguard.agent.config import AgentConfig, AgentConfigError, NodeSpec
from tailguard.agent.findings import CheckOutcome
from tailguard.agent.verdict import decide, finding_dicts, summarize
from tailguard.kafka_security import client_options

log = logging.getLogger("tailguard.agent")
PUBLISH_RETRY_MAX_S = 10.0


class BadRequest(ValueError):
    """A request message that is not the contract's JSON object."""


@dataclass(frozen=True, slots=True)
class Request:
    node_id: str
    model: str
    request_id: str | None = None
    ts: float | None = None
    reason: str | None = None
    peer_gemm_tflops: float | None = None


def _loads(raw: bytes | str) -> Any:
    try:
        import orjson
        return orjson.loads(raw)
    except ImportError:  # orjson is in the [agent] extra; json does the same, slower
        return json.loads(raw)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def parse_request(raw: bytes | str | None) -> Request:
    """Validate one request message (raises :class:`BadRequest`)."""
    if raw is None:
        raise BadRequest("empty message")
    try:
        d = _loads(raw)
    except ValueError as e:
        raise BadRequest(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise BadRequest(f"not a JSON object: {type(d).__name__}")
    for k in ("node_id", "model"):
        v = d.get(k)
        if not isinstance(v, str) or not v or len(v) > 256:
            raise BadRequest(f"{k} must be a non-empty string, got {v!r:.40}")
    rid = d.get("request_id")
    return Request(d["node_id"], d["model"], rid if isinstance(rid, str) else None, _num(d.get("ts")),
                   d.get("reason") if isinstance(d.get("reason"), str) else None,
                   _num(d.get("peer_gemm_tflops")))


def build_result(req: Request, report: SuiteReport, now_s: float, duration_s: float,
                 host: str) -> dict[str, Any]:
    """The result message for ``req`` from one run of the suite."""
    v = decide(report.outcomes)
    return {"node_id": req.node_id, "model": req.model, "recoverable": v.recoverable, "ts": now_s,
            "request_id": req.request_id, "verdict": v.verdict, "reasons": list(v.reasons),
            "evidence": finding_dicts(v), "checks": [o.to_dict() for o in report.outcomes],
            "gpus": report.gpus, "agent": {"host": host, "version": __version__},
            "duration_s": round(duration_s, 3)}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


class Agent:
    """Answers requests for ``cfg.nodes`` with ``suite`` (default: the real tools)."""

    def __init__(self, cfg: AgentConfig, suite: Suite | None = None,
                 clock: Callable[[], float] = time.time, host: str | None = None) -> None:
        self.cfg, self.clock = cfg, clock
        self.suite = suite if suite is not None else Suite(cfg, clock)
        self.host = host or socket.gethostname()
        self.nodes = {n.node_id: n for n in cfg.nodes}
        self.answered = 0
        self.skipped = 0

    def wanted(self, req: Request) -> bool:
        """Whether ``req`` is for one of this agent's nodes and fresh enough to answer."""
        if req.node_id not in self.nodes:
            return False
        if req.ts is not None and self.clock() - req.ts > self.cfg.max_request_age_s:
            log.info("not answering request %s for %s/%s: %.0f s old (max_request_age_s=%g)",
                     req.request_id, req.node_id, req.model, self.clock() - req.ts,
                     self.cfg.max_request_age_s)
            self.skipped += 1
            return False
        return True

    async def answer(self, reqs: Sequence[Request]) -> list[dict[str, Any]]:
        """One result per request; one run of the suite per node."""
        by_node: dict[str, list[Request]] = {}
        for r in reqs:
            by_node.setdefault(r.node_id, []).append(r)
        out = []
        for node_id, rs in by_node.items():
            node: NodeSpec = self.nodes[node_id]
            peer = next((r.peer_gemm_tflops for r in rs if r.peer_gemm_tflops is not None), None)
            t0 = time.monotonic()
            report = await self._run_suite(node, rs[0].model, peer)
            took = time.monotonic() - t0
            for r in rs:
                res = build_result(r, report, self.clock(), took, self.host)
                log.info("diagnostics of %s/%s (request %s, %.1f s): %s", r.node_id, r.model,
                         r.request_id, took, summarize(decide(report.outcomes)))
                out.append(res)
        return out

    async def _run_suite(self, node: NodeSpec, model: str, peer: float | None) -> SuiteReport:
        """The suite's report; a bug or an overrun becomes an ``error``/``timeout`` outcome, never silence."""
        try:
            return await asyncio.wait_for(self.suite.run(node, model, peer), self.budget_s())
        except TimeoutError:
            return SuiteReport([CheckOutcome("suite", "timeout", self.budget_s(),
                                             f"the suite overran its {self.budget_s():.0f}-s budget")])
        except Exception as e:
            log.exception("the check suite failed for %s", node.node_id)
            return SuiteReport([CheckOutcome("suite", "error", 0.0, f"{type(e).__name__}: {e}"[:300])])

    def budget_s(self) -> float:
        """An upper bound of one suite run (every timeout, plus slack)."""
        return (sum(self.cfg.timeout(c) for c in ("nvidia_smi", "compute_apps", "xid", "gemm", "dcgmi"))
                + self.cfg.timeout("xid") + max((c.timeout_s for c in self.cfg.user_checks), default=0.0)
                + 30.0)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, answer, publish, commit — until ``stop`` is set."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka.errors import KafkaError

        budget_ms = int(self.budget_s() * 1000 * max(1, len(self.nodes)))
        # The worker's security settings and client options (SASL, TLS, CA, _FILE secrets).
        security = client_options(self.cfg.security, AgentConfigError)
        consumer = AIOKafkaConsumer(
            self.cfg.requests_topic, bootstrap_servers=self.cfg.kafka_bootstrap,
            group_id=self.cfg.group, enable_auto_commit=False, auto_offset_reset="earliest",
            max_poll_interval_ms=max(300_000, budget_ms + 60_000), **security)
        producer = AIOKafkaProducer(bootstrap_servers=self.cfg.kafka_bootstrap, acks="all", **security)
        await producer.start()
        try:
            await consumer.start()
            try:
                log.info("agent for %s: group %s, requests %s, results %s",
                         ", ".join(self.nodes), self.cfg.group, self.cfg.requests_topic,
                         self.cfg.results_topic)
                while not stop.is_set():
                    batches = await consumer.getmany(timeout_ms=500, max_records=100)
                    if not batches:
                        continue
                    reqs = []
                    for tp, recs in batches.items():
                        for rec in recs:
                            try:
                                req = parse_request(rec.value)
                            except BadRequest as e:
                                log.warning("skipping bad request at %s[%d]@%d: %s", tp.topic,
                                            tp.partition, rec.offset, e)
                                continue
                            if self.wanted(req):
                                reqs.append(req)
                    for res in await self.answer(reqs):
                        await self._publish(producer, res, stop, KafkaError)
                        self.answered += 1
                    try:
                        await consumer.commit()
                    except KafkaError as e:  # the batch may be answered again: the worker ignores repeats
                        log.warning("committing offsets failed (%s); the batch may be answered again", e)
            finally:
                await consumer.stop()
        finally:
            await producer.stop()

    async def _publish(self, producer: Any, res: dict[str, Any], stop: asyncio.Event,
                       kafka_error: type[Exception]) -> None:
        """Send until the broker acknowledges (a lost result would leave the node unjudged)."""
        delay = 0.5
        while True:
            try:
                await producer.send_and_wait(self.cfg.results_topic, dumps(res),
                                             key=res["node_id"].encode())
                return
            except kafka_error as e:
                if stop.is_set():
                    raise
                log.warning("publishing the result for %s failed (%s); retrying in %.1f s",
                            res["node_id"], e, delay)
                await asyncio.sleep(delay)
                delay = min(PUBLISH_RETRY_MAX_S, delay * 2)
