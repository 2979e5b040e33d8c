"""Routing weights at the stage-2 edge: what is written per mode and override, and the
rate-limited weight events (tailguard.streaming.edge, tailguard.streaming.weight_events)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus, WeightChange, WeightEvidence
from tailguard.routing.explain import NodeExplain, render_explain
from tailguard.routing.operators import OperatorState, Override
from tailguard.routing.status import ModelStatus, format_table
from tailguard.streaming.edge import EdgeInput, EdgeOutput, OperatorEdge
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.weight_events import WeightAnnouncer

S = DetectorSettings(min_samples=10, min_peers=3)
NODES = ("a", "b", "c", "d")
EVIDENCE = WeightEvidence(signal="latency", value=1600.0, ref=1000.0, band=1.1, target=0.45,
                          samples=100, peers=4)


def tick(weights: dict[str, float], ts: float = 10.0, *, changed: dict[str, float] | None = None,
         routed: tuple[str, ...] = NODES) -> ModelTick:
    statuses = tuple(NodeStatus(node_id=n, model="m", state=HealthState.HEALTHY, routed=True,
                                since_ts=0.0, reason="normal", samples=100,
                                weight=weights.get(n, 1.0)) for n in routed)
    changes = tuple(WeightChange(ts, n, "m", w, prev, "slower_than_peers", EVIDENCE)
                    for n, prev in (changed or {}).items() for w in (weights.get(n, 1.0),))
    return ModelTick(model="m", ts=ts, transitions=(), routing=frozenset(routed), quarantine={},
                     statuses=statuses, weights=weights, weight_changes=changes)


NO_OPS = OperatorState()


def run(edge: OperatorEdge, t: ModelTick, ops: OperatorState = NO_OPS) -> EdgeOutput:
    return edge.apply(EdgeInput(t, ()), ops, t.ts)


def test_enforce_writes_the_weights_observe_and_off_write_none() -> None:
    t = tick({"b": 0.45}, changed={"b": 1.0})
    out = run(OperatorEdge(S), t)
    assert out.extras.weights == {"b": 0.45}
    (ev,) = out.health_events
    assert ev["type"] == "weight" and (ev["node_id"], ev["weight"], ev["previous_weight"]) == (
        "b", 0.45, 1.0)
    assert ev["enforced"] is True and ev["evidence"]["slower"] == 1.6
    obs = run(OperatorEdge(S.replace(weights="observe")), t)
    assert obs.extras.weights == {}                        # the hash is emptied
    assert [e["enforced"] for e in obs.health_events] == [False]    # but published
    # The model in observe mode: nothing written either.
    assert run(OperatorEdge(S, "observe"), t).extras.weights == {}


def test_a_pinned_node_is_at_full_weight_and_a_drained_one_has_none() -> None:
    t = tick({"b": 0.45, "c": 0.6})
    ops = OperatorState((Override("b", None, "pin"), Override("c", None, "drain")))
    out = run(OperatorEdge(S), t, ops)
    assert out.extras.weights == {} and "c" not in out.tick.routing


def test_weight_events_are_rate_limited_and_the_last_weight_is_always_announced() -> None:
    ann = WeightAnnouncer(interval_s=60.0)
    routing = frozenset(NODES)

    def events(ts: float, w: dict[str, float]) -> list[float]:
        t = tick(w, ts)
        return [e["weight"] for e in ann.events(t, routing, w, True, ts)]

    assert events(0.0, {"b": 0.8}) == [0.8]               # leaves 1.0: at once
    assert events(30.0, {"b": 0.6}) == []                 # within 60 s: later
    assert events(60.0, {"b": 0.5}) == [0.5]              # the weight then
    assert events(90.0, {"b": 0.5}) == []                 # no change, no event
    assert events(100.0, {}) == [1.0]                     # back at 1.0: at once
    assert events(110.0, {"b": 0.7}) == [0.7]
    # Out of routing: forgotten silently, back at 1.0 with no event.
    assert ann.events(tick({}, 120.0, routed=("a", "c", "d")), frozenset("acd"), {}, True,
                      120.0) == []
    assert events(130.0, {}) == []


def test_the_weight_gauge_follows_routed_nodes() -> None:
    m = WorkerMetrics(CollectorRegistry())

    def value(node: str) -> float | None:
        return m.registry.get_sample_value("tailguard_node_weight", {"model": "m", "node": node})

    m.set_weights("m", {"b": 0.45}, frozenset(NODES))
    assert value("b") == 0.45 and value("a") is None
    assert m.registry.get_sample_value("tailguard_weighted_nodes", {"model": "m"}) == 1
    m.set_weights("m", {}, frozenset(NODES))
    assert value("b") == 1.0                                   # back at full weight
    m.set_weights("m", {}, frozenset("acd"))
    assert value("b") is None                                  # out of routing: no series
    m.set_weights("m", {"c": 0.5}, frozenset(NODES))
    m.forget_model("m")
    assert value("c") is None


def test_explain_shows_the_weight_why_and_what_load_balancers_read() -> None:
    now = 1_764_680_000.0
    status = {"state": "healthy", "routed": True, "since": now - 60, "reason": "admitted",
              "signal": "latency", "mode": "enforce", "weight": 0.45,
              "weight_detail": EVIDENCE.text() + "; last targets 0.45, 0.45, 0.45"}
    hist = [{"ts": now - 30, "state": "healthy", "routed": True, "streak": 0, "stats": {},
             "guards": [], "weight": 0.45}]
    text = render_explain([NodeExplain("b", "m", status, hist, in_routing=True,
                                       written_weight=0.45)], now)
    assert "routing weight: 0.45 (P50 1.60x its 4 peers' (latency)" in text
    assert "load balancers read" not in text
    assert "weight" in text.splitlines()[-2] and "0.45" in text.splitlines()[-1]
    observed = render_explain([NodeExplain("b", "m", status, hist, in_routing=True)], now)
    assert "load balancers read 1 (TAILGUARD_WEIGHTS=observe" in observed
    full = dict(status, weight=1.0, weight_detail=None)
    assert "routing weight" not in render_explain([NodeExplain("b", "m", full, hist, True)], now)


def test_status_shows_the_weight_load_balancers_read() -> None:
    ms = ModelStatus(model="m", version=3, routing=frozenset({"a", "b"}),
                     nodes={"a": {"state": "healthy"}, "b": {"state": "healthy"},
                            "c": {"state": "quarantined"}},
                     weights={"b": 0.45, "c": 0.5})       # c: out of routing, not shown
    rows = {line.split()[0]: line for line in format_table([ms], 100.0).splitlines()[2:]}
    assert "yes (weight 0.45)" in rows["b"] and "weight" not in rows["a"]
    assert "weight" not in rows["c"]
    assert ms.to_dict()["weights"] == {"b": 0.45, "c": 0.5}
