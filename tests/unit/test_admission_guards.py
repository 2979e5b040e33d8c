"""The fleet guards and liveness count admitted pairs only (tailguard.core.judge.guards, tailguard.core.judge.liveness,
tailguard.core.judge.admission): a crowd of new ids moves neither the ejection cap nor telemetry loss."""

from __future__ import annotations

import dataclasses

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import DiagnosticsRequest, Transition, WindowSummary
from tailguard.core.contract.types import HealthState as H
from tailguard.core.judge import health
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.guards import eject_within_cap
from tailguard.core.judge.health import PairState

S = DetectorSettings(max_sample_age_s=30.0, max_ejected_fraction=0.5)
T0 = 1000.0


def pair(node: str, state: H = H.HEALTHY, **kw: object) -> PairState:
    base = PairState(node_id=node, model="m", state=state, since_ts=0.0, first_seen_ts=0.0,
                     reason="x", routed=state in health.ROUTED_STATES, severity=1.5,
                     abnormal_streak=S.confirm_windows)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def new(node: str) -> PairState:
    p, _ = health.first_seen(node, "m", 0.0, T0, S)
    return p


def test_the_cap_is_over_admitted_pairs_only() -> None:
    # 3 admitted (one out already) + 4 new ids: cap floor(0.5 x 3) = 1, full: the candidate is
    # kept in. Counting the new ids (7 nodes, cap 3) would have ejected it.
    pairs = {"a": pair("a"), "b": pair("b"), "c": pair("c", H.QUARANTINED, routed=False),
             **{f"x{i}": new(f"x{i}") for i in range(4)}}
    trans: list[Transition] = []
    diag: list[DiagnosticsRequest] = []
    eject_within_cap("m", pairs, [pairs["a"]], T0, S, trans, diag)
    assert pairs["a"].routed and pairs["a"].reason == "ejection_cap" and not diag


def test_a_refused_new_pair_is_ejected_whatever_the_cap_and_takes_no_place_under_it() -> None:
    refused = dataclasses.replace(new("x"), abnormal_streak=S.confirm_windows, severity=3.0)
    pairs = {"a": pair("a"), "b": pair("b"), "x": refused}
    trans: list[Transition] = []
    diag: list[DiagnosticsRequest] = []
    eject_within_cap("m", pairs, [refused, pairs["a"]], T0, S, trans, diag)
    assert (pairs["x"].state, pairs["x"].routed) == (H.UNHEALTHY, False)
    # a's ejection still has the place: cap floor(0.5 x 2) = 1, b stays routed
    assert (pairs["a"].state, pairs["a"].routed) == (H.UNHEALTHY, False)
    assert [d.node_id for d in diag] == ["x", "a"]


def summ(node: str, now: float, seen: float, samples: int = 500) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=now, signal="latency", samples=samples,
                         p50=100.0 if samples else None, p99=200.0 if samples else None,
                         latency_p50_us=100.0, latency_p99_us=200.0, first_seen_ts=0.0,
                         last_seen_ts=seen)


def test_a_crowd_of_one_event_ids_going_silent_is_no_telemetry_loss() -> None:
    ev = FleetEvaluator(DetectorSettings(max_sample_age_s=30.0, silent_after_s=60.0))
    real = [f"n{i}" for i in range(4)]
    crowd = [f"id-{i}" for i in range(40)]
    for k in range(8):
        now = T0 + 30.0 * k
        sums = [summ(n, now, now) for n in real]
        # the crowd: one event each at T0 (no samples to judge), then silence
        sums += [summ(c, now, T0, samples=0) for c in crowd]
        mt = ev.evaluate("m", sums, now)
        assert not mt.fleet_events, mt.fleet_events
        assert mt.routing == frozenset(real)
    states = {n: p["state"] for n, p in ev.snapshot_model("m")["pairs"].items()}
    assert {states[c] for c in crowd} == {"gone"} and {states[n] for n in real} == {"healthy"}
