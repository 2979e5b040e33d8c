"""A flood of one-event node ids (warming pairs that all fall silent) neither reads as a
telemetry loss nor freezes the ejection of a slow real node (tailguard.core.judge.liveness)."""

from __future__ import annotations

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState as H
from tailguard.core.contract.types import ModelTick, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator

S = DetectorSettings(max_sample_age_s=30.0, warmup_s=600.0, silent_after_s=60.0,
                     forget_after_s=900.0)
T0 = 10_000.0
TICK = S.tick_interval_s
REAL = [f"n{i}" for i in range(6)]
FLOOD_AT = T0 + 2 * TICK


def summ(node: str, p50: float, seen: float, first: float, samples: int) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=seen, signal="latency",
                         samples=samples, p50=p50 if samples else None,
                         p99=2 * p50 if samples else None,
                         latency_p50_us=p50 if samples else None,
                         latency_p99_us=2 * p50 if samples else None,
                         first_seen_ts=first, last_seen_ts=seen)


def run(n_flood: int, ticks: int = 14) -> list[ModelTick]:
    """6 real nodes past warm-up, n5 3x slower from tick 4; ``n_flood`` ids seen once at
    ``FLOOD_AT`` whose (empty) summaries stage 1 keeps sending."""
    ev = FleetEvaluator(S)
    out = []
    for k in range(ticks):
        now = T0 + k * TICK
        sums = [summ(n, 300.0 if n == "n5" and k >= 4 else 100.0, now, 0.0, 500) for n in REAL]
        if now >= FLOOD_AT:
            sums += [summ(f"flood-{i}", 0.0, FLOOD_AT, FLOOD_AT, 0) for i in range(n_flood)]
        out.append(ev.evaluate("m", sums, now))
    return out


def test_silent_flood_ids_are_no_telemetry_loss_and_the_slow_node_still_leaves() -> None:
    calm = run(0)
    flooded = run(2_000)
    out_at = {"calm": None, "flood": None}
    for name, ticks in (("calm", calm), ("flood", flooded)):
        for mt in ticks:
            if "n5" not in mt.routing and out_at[name] is None:
                out_at[name] = mt.ts
    assert out_at["calm"] is not None
    assert out_at["flood"] == out_at["calm"]            # removed within the usual time
    assert not [e for mt in flooded for e in mt.fleet_events if e.kind == "telemetry_lost"]
    last = flooded[-1]
    assert last.routing == frozenset(REAL) - {"n5"}
    gone = {st.node_id for st in last.statuses if st.state is H.GONE}
    assert len(gone) == 2_000 and all(n.startswith("flood-") for n in gone)
