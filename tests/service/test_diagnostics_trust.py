"""Which diagnostics results count (issue 28 item 2): only the current episode's answer.

Stage 2 with the real FleetEvaluator, no Kafka: a node is ejected (a diagnostics request),
re-admitted, ejected again; results for the earlier request, forged ones, ones without a
request_id or arriving before the request are dropped, counted and logged once per reason.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from stream_fakes import summary

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import DiagnosticsRequest, HealthState
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.streaming.stage2 import ModelOutput, Stage2
from tailguard.streaming.wire import DiagnosticsResult

SETTINGS = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0, confirm_windows=2,
                            backoff_initial_s=4.0, backoff_max_s=4.0, probe_min_samples=10)
T = 2.0
NODES = ["n0", "n1", "n2", "n3", "x"]


class Clock:
    def __init__(self) -> None:
        self.ts = 1000.0


def tick(s2: Stage2, clock: Clock, slow: bool) -> ModelOutput:
    for n in NODES:
        p50 = 3000.0 if n == "x" and slow else 1000.0
        s2.on_summary(summary(n, "m", clock.ts, p50, p50 * 1.5))
    (out,) = s2.tick(clock.ts + 0.5, lambda m: True)
    clock.ts += T
    return out


def state(s2: Stage2) -> HealthState:
    p = s2.evaluator.pair("m", "x")
    assert p is not None
    return HealthState(p.state)


def eject(s2: Stage2, clock: Clock) -> DiagnosticsRequest:
    """Ticks with ``x`` slow until it leaves routing; the request made then."""
    for _ in range(10):
        out = tick(s2, clock, slow=True)
        if out.tick.diagnostics:
            (req,) = out.tick.diagnostics
            assert req.node_id == "x" and "x" not in out.tick.routing
            return req
    raise AssertionError(f"x was not ejected: {state(s2)}")


def readmit(s2: Stage2, clock: Clock) -> None:
    for _ in range(20):
        if "x" in tick(s2, clock, slow=False).tick.routing:
            return
    raise AssertionError(f"x was not re-admitted: {state(s2)}")


def answer(req: DiagnosticsRequest, *, recoverable: bool = False,
           request_id: str | None = "same", arrived_ts: float | None = None) -> DiagnosticsResult:
    return DiagnosticsResult(req.node_id, req.model, recoverable,
                             request_id=req.request_id if request_id == "same" else request_id,
                             arrived_ts=req.ts + 1.0 if arrived_ts is None else arrived_ts)


def fresh() -> tuple[Stage2, Clock, list[str]]:
    dropped: list[str] = []
    return (Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T,
                   on_diagnostics_dropped=dropped.append), Clock(), dropped)


def test_a_stale_result_of_an_earlier_episode_does_not_retire_a_node_ejected_again() -> None:
    s2, clock, dropped = fresh()
    first = eject(s2, clock)
    readmit(s2, clock)
    second = eject(s2, clock)
    assert second.request_id != first.request_id
    # The first episode's "not recoverable" arrives late (or is read again from the topic).
    s2.on_diagnostics(answer(first, arrived_ts=second.ts + 5.0))
    out = tick(s2, clock, slow=True)
    assert out.diagnostics_transitions == ()
    assert state(s2) is not HealthState.RETIRED
    assert dropped == ["wrong_request"] and s2.diagnostics_dropped == {"wrong_request": 1}
    # The answer to the current request counts.
    s2.on_diagnostics(answer(second))
    (t,) = tick(s2, clock, slow=True).diagnostics_transitions
    assert (t.node_id, t.to_state) == ("x", HealthState.RETIRED)


@pytest.mark.parametrize(("result", "reason"), [
    (lambda req: answer(req, request_id="f" * 32), "wrong_request"),
    (lambda req: answer(req, request_id=None), "no_request_id"),
    (lambda req: answer(req, arrived_ts=req.ts - 1.0), "before_request"),
    (lambda req: DiagnosticsResult("n0", "m", False, request_id=req.request_id,
                                   arrived_ts=req.ts + 1), "no_episode"),
    (lambda req: DiagnosticsResult("ghost", "m", False, request_id=req.request_id,
                                   arrived_ts=req.ts + 1), "no_episode"),
])
def test_a_result_that_answers_no_current_request_does_nothing(
        result: Any, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    s2, clock, dropped = fresh()
    req = eject(s2, clock)
    with caplog.at_level(logging.WARNING, logger="tailguard.streaming.stage2"):
        for _ in range(3):
            s2.on_diagnostics(result(req))
            assert tick(s2, clock, slow=True).diagnostics_transitions == ()
    assert state(s2) is not HealthState.RETIRED
    assert dropped == [reason] * 3
    logged = [r.getMessage() for r in caplog.records if "dropping a diagnostics result" in r.getMessage()]
    assert len(logged) == 1 and reason in logged[0], logged   # once per reason


def test_the_answer_to_the_current_request_retires_the_node() -> None:
    s2, clock, dropped = fresh()
    req = eject(s2, clock)
    s2.on_diagnostics(answer(req))
    (t,) = tick(s2, clock, slow=True).diagnostics_transitions
    assert (t.node_id, t.to_state) == ("x", HealthState.RETIRED)
    s2.on_diagnostics(answer(req))                 # at least once: a repeat is a no-op
    assert tick(s2, clock, slow=True).diagnostics_transitions == () and dropped == []
