"""The detector façade: WindowStore + FleetEvaluator composed (tailguard.core.replay.detector)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.contract.types import HealthState
from tailguard.core.replay.detector import Detector

S = DetectorSettings()
T0 = 1_764_680_010.0          # a multiple of 30


def batch(node: str, t_lo: float, t_hi: float, p50: float, *, model: str = "m", rate: float = 20.0,
          seed: int = 0, hardware: str | None = "A100", probe: bool = False) -> SampleBatch:
    rng = np.random.default_rng(seed)
    n = int((t_hi - t_lo) * rate)
    ts = np.linspace(t_lo, t_hi, n, endpoint=False)
    lat = p50 * np.exp(rng.normal(0.0, 0.3, n))
    return SampleBatch(node, model, hardware, ts, lat, np.ones(n, bool), np.full(n, probe))


def feed(det: Detector, start: float, ticks: int, slow: dict[str, float] | None = None,
         nodes: int = 5, seed: int = 0) -> list[object]:
    out = []
    for k in range(ticks):
        lo = start + k * 30.0
        det.observe(batch(f"n{i}", lo, lo + 30.0, 100_000.0 * (slow or {}).get(f"n{i}", 1.0),
                          seed=seed + 97 * k + i) for i in range(nodes))
        out.append(det.evaluate(lo + 30.0))
    return out


def test_steady_fleet_then_a_slow_node_is_ejected() -> None:
    det = Detector(S)
    ticks = feed(det, T0, 10)
    assert det.routing() == {"m": frozenset({f"n{i}" for i in range(5)})}
    ticks = feed(det, T0 + 300, 4, slow={"n3": 3.0})
    assert "n3" not in det.routing()["m"]
    ejected = [t for r in ticks for t in r.transitions if not t.routed]   # type: ignore[attr-defined]
    assert ejected[0].node_id == "n3" and ejected[0].reason == "relative_p50"
    assert ejected[0].latency_p50_us == pytest.approx(300_000, rel=0.15)
    diag = [d for r in ticks for m in r.models for d in m.diagnostics]   # type: ignore[attr-defined]
    assert [d.node_id for d in diag] == ["n3"]


def test_heartbeat_only_node_is_known_but_not_routed_until_its_traffic_is_judged() -> None:
    det = Detector(S)
    feed(det, T0, 6)
    det.observe([Heartbeat("idle", "m", "A100", T0 + 185.0)])
    res = det.evaluate(T0 + 210.0)
    assert "idle" not in res.routing()["m"]
    st = {s.node_id: s for s in det.statuses()}
    assert st["idle"].state is HealthState.WARMING and st["idle"].samples == 0
    assert not st["idle"].routed
    # It gets traffic (its load balancer's own list), warms up, and a normal window admits it.
    admitted = []
    for k in range(10):
        lo = T0 + 210.0 + 30.0 * k
        det.observe([batch("idle", lo, lo + 30.0, 100_000.0, seed=500 + k)])
        det.observe(batch(f"n{i}", lo, lo + 30.0, 100_000.0, seed=97 * k + i) for i in range(5))
        res = det.evaluate(lo + 30.0)
        admitted += [t for t in res.transitions if t.node_id == "idle"]  # type: ignore[attr-defined]
    (t,) = admitted
    assert (t.to_state, t.reason, t.routed) == (HealthState.HEALTHY, "admitted", True)
    # warm-up ends at T0+305; the window is cut there and needs min_samples after it
    assert T0 + 185.0 + S.warmup_s < t.ts <= T0 + 185.0 + S.warmup_s + 60.0
    assert t.samples >= S.min_samples
    assert "idle" in res.routing()["m"]


def test_quarantined_node_is_judged_on_samples_since_ejection() -> None:
    det = Detector(S.replace(backoff_initial_s=0.0))
    feed(det, T0, 6)
    feed(det, T0 + 180, 4, slow={"n1": 4.0})
    p = det.evaluator.pair("m", "n1")
    assert p is not None and p.state is HealthState.QUARANTINED
    # recovered at T0+300. The round that began at ejection (T0+270) still holds 30 s of slow
    # samples and fails; the next round holds only normal ones and passes.
    ticks = feed(det, T0 + 300, 2)
    reasons = [t.reason for r in ticks for t in r.transitions]  # type: ignore[attr-defined]
    assert reasons == ["probe_failed", "probe_passed"]
    assert "n1" in det.routing()["m"]


def test_warmup_samples_are_never_judged() -> None:
    det = Detector(S)
    feed(det, T0, 6)
    # a joiner 8x slower for its first 60 s, then normal
    for k in range(8):
        lo = T0 + 180 + 30 * k
        evs = [batch(f"n{i}", lo, lo + 30, 100_000.0, seed=k * 10 + i) for i in range(5)]
        evs.append(batch("new", lo, lo + 30, 800_000.0 if k < 2 else 100_000.0, seed=k))
        det.observe(evs)
        det.evaluate(lo + 30)
    assert "new" in det.routing()["m"]
    p = det.evaluator.pair("m", "new")
    assert p is not None and p.state is HealthState.HEALTHY


def test_snapshot_restore_same_future() -> None:
    a = Detector(S)
    feed(a, T0, 8)
    feed(a, T0 + 240, 2, slow={"n0": 3.0})
    snap = json.loads(json.dumps(a.snapshot()))     # plain data, survives JSON
    b = Detector(S)
    b.restore(snap)
    fa = feed(a, T0 + 300, 6, slow={"n0": 3.0}, seed=5)
    fb = feed(b, T0 + 300, 6, slow={"n0": 3.0}, seed=5)
    assert [r.transitions for r in fa] == [r.transitions for r in fb]  # type: ignore[attr-defined]
    assert a.snapshot() == b.snapshot()
    with pytest.raises(ValueError, match="version"):
        b.restore({"version": 0})


def test_apply_diagnostics_through_the_facade() -> None:
    det = Detector(S)
    feed(det, T0, 6)
    feed(det, T0 + 180, 3, slow={"n2": 3.0})
    (t,) = det.apply_diagnostics("m", "n2", False, T0 + 275.0)
    assert t.to_state is HealthState.RETIRED
    res = det.evaluate(T0 + 300.0)
    assert "n2" not in res.routing()["m"] and "n2" not in res.models[0].quarantine


def test_a_retired_node_is_forgotten_once_silent_and_frees_its_place_under_the_cap() -> None:
    det = Detector(S.replace(max_ejected_fraction=0.25, forget_after_s=600.0))  # 4-7 nodes: 1 out
    feed(det, T0, 6)
    feed(det, T0 + 180, 3, slow={"n2": 3.0})
    (t,) = det.apply_diagnostics("m", "n2", False, T0 + 275.0)
    assert t.to_state is HealthState.RETIRED
    start, last_hb = T0 + 270.0, 0.0
    trans = []
    for k in range(32):
        lo = start + 30.0 * k
        det.observe(batch(f"n{i}", lo, lo + 30.0, 100_000.0 * (3.0 if i == 4 and k >= 3 else 1.0),
                          seed=1000 + 7 * k + i) for i in (0, 1, 3, 4))
        if k < 10:                               # the retired node still sends heartbeats
            last_hb = lo + 29.0
            det.observe([Heartbeat("n2", "m", "A100", last_hb)])
        trans.extend(det.evaluate(lo + 30.0).transitions)
    (gone,) = [t for t in trans if t.node_id == "n2"]
    assert (gone.from_state, gone.to_state, gone.reason) == (HealthState.RETIRED,
                                                             HealthState.UNKNOWN, "forgotten")
    assert last_hb + 600.0 < gone.ts <= last_hb + 630.0 and gone.routed is False
    n4 = [t for t in trans if t.node_id == "n4"]
    kept = [t for t in n4 if t.reason == "ejection_cap"]
    out = [t for t in n4 if not t.routed]
    assert kept and kept[0].ts < gone.ts and kept[0].routed   # the cap held it in …
    assert out and out[0].ts == gone.ts                       # … until n2 left its place
    # Back under the same id later: a new pair, warming, not routed until admitted.
    back = start + 32 * 30.0
    det.observe([Heartbeat("n2", "m", "A100", back + 1.0)])
    (t,) = [t for t in det.evaluate(back + 30.0).transitions if t.node_id == "n2"]
    assert (t.from_state, t.to_state, t.routed) == (HealthState.UNKNOWN, HealthState.WARMING, False)


def test_forgetting_is_off_with_zero_and_survives_snapshots() -> None:
    det = Detector(S.replace(forget_after_s=0.0))
    feed(det, T0, 6)
    feed(det, T0 + 180, 3, slow={"n2": 3.0})
    det.apply_diagnostics("m", "n2", False, T0 + 275.0)
    feed(det, T0 + 270, 40)                      # n2 silent for 20 min: never forgotten
    assert det.evaluator.pair("m", "n2").state is HealthState.RETIRED  # type: ignore[union-attr]
    assert ("n2", "m") in det.store
    snap = det.snapshot()
    assert snap["evaluator"]["models"]["m"]["retired_seen"] == {"n2": T0 + 275.0}
    again = Detector(S)
    again.restore(json.loads(json.dumps(snap)))
    assert again.evaluator.snapshot()["models"]["m"]["retired_seen"] == {"n2": T0 + 275.0}
    # An incomplete snapshot (no retired_seen) is refused, naming the field: no guessed defaults.
    del snap["evaluator"]["models"]["m"]["retired_seen"]
    with pytest.raises(ValueError, match="retired_seen"):
        Detector(S).restore(json.loads(json.dumps(snap)))
