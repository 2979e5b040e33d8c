"""The stage-2 operator edge: mode, drains, pins, announcements, history (pure, no I/O)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import (
    DiagnosticsRequest,
    FleetEvent,
    HealthState,
    ModelTick,
    NodeStatus,
    Transition,
    WindowSummary,
)
from tailguard.routing.operators import OperatorState, Override, parse_override
from tailguard.streaming.edge import EdgeInput, EdgeOutput, OperatorEdge
from tailguard.streaming.tickstats import rule_stats

H, Q, U = HealthState.HEALTHY, HealthState.QUARANTINED, HealthState.UNHEALTHY
SETTINGS = DetectorSettings(min_samples=10, min_peers=3)


def status(node: str, state: HealthState = H, routed: bool = True, reason: str = "normal",
           p50: float = 1000.0, probe_after: float | None = None) -> NodeStatus:
    return NodeStatus(node_id=node, model="m", state=state, routed=routed, since_ts=0.0,
                      reason=reason, p50=p50, p99=2 * p50, ratio=2.0, samples=100,
                      latency_p50_us=p50, latency_p99_us=2 * p50, signal="latency",
                      probe_after_ts=probe_after)


def summ(node: str, p50: float = 1000.0, req: int = 0, failed: int = 0,
         fresh: float | None = None) -> WindowSummary:
    return WindowSummary(node_id=node, model="m", tick_ts=10.0, signal="latency", samples=100,
                         p50=p50, p99=2 * p50, latency_p50_us=p50, latency_p99_us=2 * p50,
                         fresh_samples=50 if fresh else 0, fresh_p50=fresh,
                         requests_total=req, failed_total=failed)


def tick(statuses: list[NodeStatus], transitions: tuple[Transition, ...] = (),
         fleet: tuple[FleetEvent, ...] = ()) -> ModelTick:
    return ModelTick(model="m", ts=10.0, transitions=transitions,
                     routing=frozenset(s.node_id for s in statuses if s.routed),
                     quarantine={s.node_id: 99.0 for s in statuses if s.state is Q},
                     statuses=tuple(statuses), fleet_events=fleet)


def fleet_with_slow() -> ModelTick:
    return tick([status("a"), status("b"), status("c"),
                 status("slow", Q, routed=False, reason="quarantine", p50=5000.0,
                        probe_after=99.0)])


def drain(node: str, model: str | None = None, reason: str = "kernel upgrade",
          until: float | None = None) -> Override:
    return Override(node, model, "drain", reason=reason, until_ts=until)


NO_OPS = OperatorState()


def run(edge: OperatorEdge, t: ModelTick, ops: OperatorState = NO_OPS,
        now: float = 10.0) -> EdgeOutput:
    return edge.apply(EdgeInput(t, t.transitions), ops, now)


def test_enforce_writes_the_cores_set_and_observe_keeps_every_node() -> None:
    t = fleet_with_slow()
    enforce = run(OperatorEdge(SETTINGS), t)
    assert enforce.tick.routing == {"a", "b", "c"} and enforce.extras.shadow == {"a", "b", "c"}
    assert enforce.tick.quarantine == {"slow": 99.0}
    observe = run(OperatorEdge(SETTINGS, "observe"), t)
    assert observe.tick.routing == {"a", "b", "c", "slow"}
    assert observe.extras.shadow == {"a", "b", "c"}          # what enforce would write
    assert observe.tick.quarantine == {}                      # routed: nothing to probe
    assert observe.extras.annotations["slow"]["routed_by_rules"] is False


def test_observe_does_not_keep_gone_nodes_routed() -> None:
    # The liveness rules mark a silent node gone (out of routing): observe mode must not keep a
    # dead node in the real routing set, though it keeps the quarantined one.
    gone = status("dead", HealthState.GONE, routed=False, reason="silent")
    t = tick([*fleet_with_slow().statuses, gone])
    observe = run(OperatorEdge(SETTINGS, "observe"), t)
    assert observe.tick.routing == {"a", "b", "c", "slow"}
    assert "dead" not in observe.extras.shadow
    assert observe.extras.annotations["dead"]["routed_by_rules"] is False
    # Observe never routes fewer nodes than the core: a gone-marked pair in its set stays.
    lost = ModelTick(model="m", ts=10.0, transitions=(), routing=frozenset({"a", "dead"}),
                     quarantine={}, statuses=(status("a"), gone), fleet_events=())
    assert run(OperatorEdge(SETTINGS, "observe"), lost).tick.routing == {"a", "dead"}


def test_health_changes_say_whether_they_were_enforced() -> None:
    tr = Transition(ts=10.0, node_id="slow", model="m", from_state=U, to_state=Q, routed=False,
                    reason="quarantine")
    t = tick(list(fleet_with_slow().statuses), (tr,))
    assert [e["enforced"] for e in run(OperatorEdge(SETTINGS, "observe"), t).health_events] == [False]
    # A per-model mode in Redis wins over the default.
    ops = OperatorState(modes={"m": "enforce", "": "observe"})
    assert [e["enforced"] for e in run(OperatorEdge(SETTINGS, "observe"), t, ops).health_events] == [True]
    assert OperatorState(modes={"": "observe"}).mode_of("x", "enforce") == "observe"


def test_drain_takes_a_node_out_once_announced_and_release_is_published() -> None:
    edge = OperatorEdge(SETTINGS)
    t = tick([status("a"), status("b"), status("c")])
    out = run(edge, t, OperatorState((drain("b"),)))
    assert out.tick.routing == {"a", "c"} and out.extras.shadow == {"a", "c"}
    (ev,) = out.health_events
    assert (ev["node_id"], ev["reason"], ev["detail"], ev["routed"]) == (
        "b", "operator_drain", "kernel upgrade", False)
    assert ev["from"] == ev["to"] == "healthy" and ev["operator"]["action"] == "drain"
    assert out.extras.annotations["b"]["override"]["reason"] == "kernel upgrade"
    # Next tick, same override: not announced again.
    again = run(edge, t, OperatorState((drain("b"),)), now=11.0)
    assert again.health_events == () and again.tick.routing == {"a", "c"}
    released = run(edge, t, OperatorState(), now=12.0)
    assert released.tick.routing == {"a", "b", "c"}
    (rel,) = released.health_events
    assert (rel["reason"], rel["routed"]) == ("operator_release", True)
    assert "released by an operator" in rel["detail"]


def test_drain_in_observe_mode_still_takes_the_node_out() -> None:
    out = run(OperatorEdge(SETTINGS, "observe"), fleet_with_slow(), OperatorState((drain("a"),)))
    assert out.tick.routing == {"b", "c", "slow"}


def test_expired_drain_is_released_and_returned_for_deletion() -> None:
    edge = OperatorEdge(SETTINGS)
    t = tick([status("a"), status("b"), status("c")])
    d = drain("b", until=20.0)
    assert run(edge, t, OperatorState((d,)), now=10.0).tick.routing == {"a", "c"}
    out = run(edge, t, OperatorState((d,)), now=20.0)
    assert out.tick.routing == {"a", "b", "c"} and out.expired == (d,)
    (rel,) = out.health_events
    assert rel["reason"] == "operator_release" and "until 1970-01-01T00:00:20.000Z passed" in rel["detail"]


def test_pin_keeps_an_ejected_node_in_and_a_model_specific_override_wins() -> None:
    pin = Override("slow", "m", "pin", reason="customer demo")
    ops = OperatorState((drain("slow"), pin))
    out = run(OperatorEdge(SETTINGS), fleet_with_slow(), ops)
    assert out.tick.routing == {"a", "b", "c", "slow"} and out.tick.quarantine == {}
    assert [e["reason"] for e in out.health_events] == ["operator_pin"]
    # A pin of a node the model does not know adds nothing.
    other = run(OperatorEdge(SETTINGS), fleet_with_slow(),
                OperatorState((Override("ghost", None, "pin"),)))
    assert other.tick.routing == {"a", "b", "c"} and other.health_events == ()


def test_a_new_owner_announcing_the_same_override_repeats_its_event_id() -> None:
    # After a rebalance the new owner announces the active overrides again: consumers drop
    # the repeat by event_id. A changed override (set again, refused) is a new event.
    t = fleet_with_slow()
    ops = OperatorState((Override("a", "m", "drain", set_ts=5.0),))
    first = run(OperatorEdge(SETTINGS), t, ops, now=10.0).health_events
    again = run(OperatorEdge(SETTINGS), t, ops, now=40.0).health_events
    assert [e["event_id"] for e in first] == [e["event_id"] for e in again]
    assert first[0]["ts"] != again[0]["ts"]
    reset = run(OperatorEdge(SETTINGS), t, OperatorState((Override("a", "m", "drain", set_ts=6.0),)))
    assert reset.health_events[0]["event_id"] != first[0]["event_id"]


def history(edge: OperatorEdge, model: str = "m") -> dict[str, str]:
    """The model's history as the worker writes it after the routing write (once a tick)."""
    rows = edge.deferred_history(model)
    assert rows is not None and edge.deferred_history(model) is None    # made once
    return rows


def test_drains_never_empty_the_routing_set() -> None:
    # Only the drain that would empty the set is refused (the one set last; by node id on
    # a tie); the earlier drains stay applied.
    t = tick([status("a"), status("b")])
    edge = OperatorEdge(SETTINGS)
    out = run(edge, t, OperatorState((drain("a"), drain("b"))))
    assert out.tick.routing == {"b"}
    assert out.extras.annotations["b"]["drain_refused"] is True
    assert out.extras.annotations["a"]["drain_refused"] is False
    assert out.extras.held_out == {"a"}
    hist = json.loads(history(edge)["b"])
    assert "drain_refused" in hist[-1]["guards"]


def test_draining_the_last_routed_node_keeps_the_other_drains() -> None:
    # m1..m4 drained one after another, then the last routed node: only its drain is
    # refused, and the announcement says it stays routed.
    nodes = [f"m{i}" for i in range(1, 6)]
    edge = OperatorEdge(SETTINGS)
    t = tick([status(n) for n in nodes])
    drains = [Override(n, "m", "drain", set_ts=float(i)) for i, n in enumerate(nodes)]
    run(edge, t, OperatorState(tuple(drains[:4])))
    out = run(edge, t, OperatorState(tuple(drains)), now=20.0)
    assert out.tick.routing == {"m5"}
    assert out.extras.held_out == {"m1", "m2", "m3", "m4"}
    assert [(e["node_id"], e["routed"]) for e in out.health_events] == [("m5", True)]
    assert "refused: it would leave model 'm' with no routed node" in out.health_events[0]["detail"]
    # m5 goes silent: nobody is left to route, m4's drain (set last of the rest) is refused now
    t2 = tick([status(n) for n in nodes[:4]] + [status("m5", HealthState.GONE, routed=False)])
    out = run(edge, t2, OperatorState(tuple(drains)), now=30.0)
    assert out.tick.routing == {"m4"}
    assert [(e["node_id"], e["routed"]) for e in out.health_events] == [("m4", True), ("m5", False)]
    # the order the drains were set decides, not the node ids
    rev = [Override(n, "m", "drain", set_ts=float(-i)) for i, n in enumerate(nodes)]
    assert run(OperatorEdge(SETTINGS), t, OperatorState(tuple(rev))).tick.routing == {"m1"}


def test_history_is_capped_and_carries_stats_limits_guards() -> None:
    edge = OperatorEdge(SETTINGS, history_len=3)
    statuses = [status("a"), status("b"), status("c"),
                status("d", U, routed=True, reason="ejection_cap", p50=5000.0)]
    summaries = (*(summ(n) for n in "abc"), summ("d", 5000.0))
    load = FleetEvent(ts=10.0, model="m", kind="load_event", abnormal_nodes=3, judged_nodes=4)
    for i in range(5):
        edge.apply(EdgeInput(tick(statuses, fleet=(load,) if i == 0 else ()), (),
                             summaries, {"d": 3}), OperatorState(), 10.0 + i)
        rows = history(edge)
    hist = json.loads(rows["d"])
    assert [h["ts"] for h in hist] == [12.0, 13.0, 14.0]
    last = hist[-1]
    assert last["streak"] == 3 and last["state"] == "unhealthy" and last["routed"] is True
    assert last["guards"] == ["load_event", "ejection_cap"]
    # P50 of d against 2 x the median of the routed peers' P50s (a, b, c, d: 1000).
    assert last["stats"]["p50"] == [5000.0, 2000.0]
    assert last["lat"] == [5000.0, 10000.0]
    events = [json.loads(e) for e in edge.apply(EdgeInput(tick(statuses, fleet=(load,)), ()),
                                                OperatorState(), 20.0).extras.events]
    assert events[0]["kind"] == "load_event"


def test_rule_stats_error_share_needs_the_previous_counters() -> None:
    summaries = [summ("a", req=1000, failed=0), summ("b", req=1000, failed=0),
                 summ("c", req=1000, failed=500, fresh=4000.0)]
    statuses = [status(n) for n in "abc"]
    stats, counts = rule_stats(summaries, statuses, SETTINGS, {})
    assert stats["c"]["err"].value is None and counts["c"] == (1000, 500)
    later = [summ("a", req=1100, failed=0), summ("b", req=1100, failed=0),
             summ("c", req=1100, failed=550, fresh=4000.0)]
    stats, _ = rule_stats(later, statuses, SETTINGS, counts)
    assert stats["c"]["err"].value == pytest.approx(0.5) and stats["c"]["err"].over
    assert stats["a"]["err"].value == 0.0 and not stats["a"]["err"].over
    # Only c has a fresh P50: fewer than min_peers, so no fresh limit.
    assert stats["c"]["fresh_p50"].limit is None


def test_rule_stats_limits_follow_the_cores_factors() -> None:
    # The P99 limit uses relative_p99_factor, the error limit error_share_peer_factor x the
    # peers' median share when that is above max_error_share (as tailguard.core.judge.rules does).
    st = DetectorSettings(min_samples=10, min_peers=3, relative_p50_factor=2.0,
                          relative_p99_factor=3.0, max_error_share=0.1,
                          error_share_peer_factor=2.0)
    statuses = [status(n) for n in "abcd"]
    first = [summ(n, req=1000, failed=0) for n in "abcd"]
    _, counts = rule_stats(first, statuses, st, {})
    later = [summ(n, req=2000, failed=f) for n, f in zip("abcd", (100, 100, 100, 500), strict=True)]
    stats, _ = rule_stats(later, statuses, st, counts)
    assert stats["a"]["p50"].limit == pytest.approx(2000.0)
    assert stats["a"]["p99"].limit == pytest.approx(6000.0)        # 3 x the peers' 2000
    # Peers' median share 0.1 x 2 = 0.2 > max_error_share.
    assert stats["d"]["err"].limit == pytest.approx(0.2) and stats["d"]["err"].over
    assert not stats["a"]["err"].over


def test_override_parsing_names_what_is_wrong() -> None:
    o = parse_override(b'["n1", null]', b'{"action": "pin", "reason": "x", "until": 5}')
    assert (o.node_id, o.model, o.action, o.until_ts) == ("n1", None, "pin", 5.0)
    with pytest.raises(ValueError, match="action must be one of drain, pin"):
        parse_override('["n1", "m"]', '{"action": "eject"}')
    with pytest.raises(ValueError, match="want"):
        parse_override('"n1"', '{"action": "pin"}')
    with pytest.raises(ValueError, match="until must be"):
        parse_override('["n1", "m"]', '{"action": "pin", "until": "soon"}')


def test_ticks_with_nothing_judged_share_one_row() -> None:
    edge = OperatorEdge(SETTINGS, history_len=3)
    statuses = [status("a"), status("b"), status("c")]
    judged = tuple(summ(n) for n in "abc")
    for i in range(2):
        edge.apply(EdgeInput(tick(statuses), (), judged), NO_OPS, 10.0 + i)
        history(edge)
    for i in range(5):   # c is not judged any more (no summary): one rolling row
        edge.apply(EdgeInput(tick(statuses), (), judged[:2]), NO_OPS, 20.0 + i)
        rows = history(edge)
    hist = json.loads(rows["c"])
    assert [h["ts"] for h in hist] == [10.0, 11.0, 24.0]
    assert hist[0]["stats"]["p50"][0] == 1000.0 and hist[-1]["stats"] == {}


def test_history_turned_off_writes_an_empty_history() -> None:
    edge = OperatorEdge(SETTINGS, history_len=0)
    out = run(edge, fleet_with_slow())
    assert history(edge) == {} and out.tick.routing == {"a", "b", "c"}
    with pytest.raises(ValueError, match="history_len"):
        OperatorEdge(SETTINGS, history_len=-1)
    with pytest.raises(ValueError, match="default_mode"):
        OperatorEdge(SETTINGS, "shadow")


def test_new_nodes_stay_out_in_either_mode_and_drained_ones_are_held_out() -> None:
    t = tick([status("a"), status("b"), status("c"),
              status("slow", Q, routed=False, reason="quarantine", p50=5000.0, probe_after=99.0),
              status("new", HealthState.WARMING, routed=False, reason="first_seen")])
    enforce = run(OperatorEdge(SETTINGS), t)
    assert enforce.tick.routing == {"a", "b", "c"} and enforce.extras.held_out == {"slow"}
    observe = run(OperatorEdge(SETTINGS, "observe"), t)
    assert observe.tick.routing == {"a", "b", "c", "slow"}   # admission holds in observe mode
    assert observe.extras.held_out == frozenset()             # "new" is not taken out: not judged
    drained = run(OperatorEdge(SETTINGS), t, OperatorState(overrides=[drain("b"), drain("new")]))
    assert drained.tick.routing == {"a", "c"} and drained.extras.held_out == {"slow", "b", "new"}


def test_a_model_with_only_new_nodes_refuses_no_drain_and_writes_no_routing() -> None:
    t = tick([status("new", HealthState.WARMING, routed=False, reason="first_seen")])
    out = run(OperatorEdge(SETTINGS), t, OperatorState(overrides=[drain("new")]))
    assert out.tick.routing == frozenset() and out.extras.held_out == {"new"}
    assert out.extras.annotations["new"]["drain_refused"] is False


def test_observe_mode_asks_for_no_diagnostics_unless_a_setting_says_so() -> None:
    req = DiagnosticsRequest(ts=10.0, node_id="slow", model="m", reason="relative_p50")
    t = replace(fleet_with_slow(), diagnostics=(req,))
    assert run(OperatorEdge(SETTINGS), t).tick.diagnostics == (req,)
    # observe keeps the node serving traffic: no DCGM / GEMM run on it by default
    assert run(OperatorEdge(SETTINGS, "observe"), t).tick.diagnostics == ()
    assert run(OperatorEdge(SETTINGS, "observe", diagnose_in_observe=True), t).tick.diagnostics == (req,)
    # the mode set in Redis for the model decides, as for routing
    ops = OperatorState(modes={"m": "observe"})
    assert run(OperatorEdge(SETTINGS), t, ops).tick.diagnostics == ()


def test_status_says_when_a_node_s_signal_was_chosen_by_its_worker_alone() -> None:
    # Before stage 2's first signal choice for a model, a stage 1 marks its summaries
    # (extra signal_local); the status JSON and `tailguard explain` say so.
    t = tick([status("a"), status("b")])
    sums = (summ("a")._replace(extra={"signal_local": True}), summ("b"))
    out = OperatorEdge(SETTINGS).apply(EdgeInput(t, (), sums), NO_OPS, 10.0)
    assert out.extras.annotations["a"]["signal_local"] is True
    assert out.extras.annotations["b"]["signal_local"] is False
