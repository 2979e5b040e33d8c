"""A load event holds every streak but a node slower than its slowed peers in its newest samples.

The fleet guard's load event (docs/rules.md, fleet guards): when most nodes are abnormal at once
the fleet slowed, not its nodes, and nobody is ejected. Still judged through it: a node whose P50
of the last tick is past ``relative_p50_factor`` x its peers' fresh P50s, which move with the
fleet (:func:`tailguard.core.judge.guards.through_load`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState as H
from tailguard.core.contract.types import ModelTick, Reason, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator

S = DetectorSettings(max_sample_age_s=30.0)
T0 = 1000.0
Spec = Mapping[str, tuple[float, float, float | None]]     # node -> (P50, P99/P50, fresh P50)


def _tick(ev: FleetEvaluator, spec: Spec, now_s: float) -> ModelTick:
    sums = [WindowSummary(node_id=n, model="m", tick_ts=now_s, signal="latency", samples=500,
                          p50=p50, p99=p50 * r, latency_p50_us=p50, latency_p99_us=p50 * r,
                          first_seen_ts=0.0, fresh_p50=f, fresh_samples=150 if f else 0)
            for n, (p50, r, f) in spec.items()]
    return ev.evaluate("m", sums, now_s)


def _run(spec: Callable[[int], Spec], peak_ticks: int) -> list[ModelTick]:
    """Five quiet ticks of 8 nodes at 100 (a baseline), then ``peak_ticks`` of ``spec(k)``."""
    ev = FleetEvaluator(S)
    quiet = {f"n{i:02d}": (100.0, 2.0, 100.0) for i in range(8)}
    for k in range(5):
        _tick(ev, quiet, T0 + 30 * k)
    return [_tick(ev, spec(k), T0 + 150 + 30 * k) for k in range(peak_ticks)]


def _peak(**over: tuple[float, float, float | None]) -> dict[str, tuple[float, float, float | None]]:
    """Every node 2.6x the baseline (past the P50 limit against it: a load event)."""
    f: dict[str, tuple[float, float, float | None]] = {f"n{i:02d}": (260.0, 2.0, 260.0) for i in range(8)}
    f.update(over)
    return f


def test_a_node_3x_its_slowed_peers_fresh_p50_is_ejected_during_a_load_event() -> None:
    ticks = _run(lambda k: _peak(n03=(260.0 if k == 0 else 700.0, 2.0, 800.0)), 4)
    kinds = [e.kind for t in ticks for e in t.fleet_events]
    assert kinds.count("load_event") == 1 and "load_event_end" not in kinds
    assert ["n03" in t.routing for t in ticks] == [True, True, False, False]
    out = next(tr for t in ticks for tr in t.transitions if tr.to_state is H.UNHEALTHY)
    assert out.node_id == "n03" and out.reason == Reason.RELATIVE_P50.value
    first = next(tr for t in ticks for tr in t.transitions if tr.to_state is H.SUSPECT)
    assert first.detail is not None and "during a load event" in first.detail
    assert all(len(t.routing) >= 7 for t in ticks)


def test_during_a_load_event_no_other_verdict_moves_a_streak() -> None:
    # a worse tail (P99/P50 6 against 2), a window P50 3x its peers' with a fresh P50 like
    # theirs (its window still holds older samples), a fresh P50 1.9x (below the limit)
    ticks = _run(lambda k: _peak(n01=(260.0, 6.0, 260.0), n02=(780.0, 2.0, 260.0),
                                 n03=(260.0, 2.0, 500.0)), 6)
    assert "load_event" in [e.kind for t in ticks for e in t.fleet_events]
    assert all(len(t.routing) == 8 for t in ticks)
    assert not [tr for t in ticks for tr in t.transitions]


def test_without_fresh_p50s_a_load_event_ejects_nobody() -> None:
    ticks = _run(lambda k: _peak(n03=(700.0, 2.0, None)), 6)
    assert all(len(t.routing) == 8 for t in ticks)
