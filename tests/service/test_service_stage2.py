"""Stage 2 (evaluation, durable state, ownership) against the real FleetEvaluator, no Kafka."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stream_fakes import summary

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.window.quantiles import digest_dict_of_sorted
from tailguard.streaming.hints import decode_hints, encode_hints
from tailguard.streaming.stage2 import Stage2, state_key
from tailguard.streaming.table_values import pack_value, unpack_value, value_json
from tailguard.streaming.wire import ClusterDigest, DiagnosticsResult

SETTINGS = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0, confirm_windows=2,
                            backoff_initial_s=600.0, backoff_max_s=600.0)
T = 2.0
NODES = ["n0", "n1", "n2", "n3", "slow"]


def feed(s2: Stage2, model: str, tick_ts: float, nodes: list[str] = NODES) -> None:
    for n in nodes:
        p50 = 3000.0 if n == "slow" else 1000.0
        s2.on_summary(summary(n, model, tick_ts, p50, p50 * 1.5))


def run_ticks(s2: Stage2, model: str, start: float, n: int) -> list[Any]:
    outs = []
    for i in range(n):
        ts = start + i * T
        feed(s2, model, ts)
        outs.extend(s2.tick(ts + 0.5, lambda m: True))
    return outs


def states(s2: Stage2, model: str) -> dict[str, HealthState]:
    ev = s2.evaluator
    assert isinstance(ev, FleetEvaluator)
    return {n: p.state for n in NODES if (p := ev.pair(model, n)) is not None}


def test_slow_node_leaves_routing_and_state_is_written() -> None:
    state: dict[bytes, Any] = {}
    hints: dict[bytes, Any] = {}
    s2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T, hints=hints)
    outs = run_ticks(s2, "m", 1000.0, 4)
    trans = [t for o in outs for t in o.transitions if t.node_id == "slow"]
    assert [str(t.to_state) for t in trans][-2:] == ["unhealthy", "quarantined"]
    assert "slow" not in outs[-1].tick.routing
    assert set(outs[-1].tick.routing) == {"n0", "n1", "n2", "n3"}
    assert state[state_key("m")] == s2.evaluator.snapshot_model("m")
    got = decode_hints(hints.items())
    assert ("slow", "m") in got.judge_since              # quarantined: judged on samples since
    assert got.out_of_fit == {("slow", "m")}             # out of routing: no vote in the fit


def test_hints_follow_routing_and_are_written_only_on_change() -> None:
    writes: list[Any] = []

    class Recording(dict[bytes, Any]):
        def __setitem__(self, key: bytes, value: Any) -> None:
            writes.append(value)
            super().__setitem__(key, value)

    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T, hints=Recording())
    run_ticks(s2, "m", 1000.0, 1)
    # the slow node is not admitted at the first tick (3x its fellow new nodes): never routed,
    # it has no vote in the fit either
    assert [decode_hints([(b"m", w)]).out_of_fit for w in writes] == [frozenset({("slow", "m")})]
    run_ticks(s2, "m", 1000.0 + T, 3)
    assert decode_hints([(b"m", writes[-1])]).out_of_fit == {("slow", "m")}
    n = len(writes)
    run_ticks(s2, "m", 1000.0 + 4 * T, 1)                # quarantined, nothing new to say
    assert len(writes) == n


class FailingOnce(dict[bytes, Any]):
    """A table whose first ``fail`` writes raise, as faust's do when the producer lost metadata."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail

    def __setitem__(self, key: bytes, value: Any) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise TypeError("'NoneType' object is not iterable")
        super().__setitem__(key, value)


def test_failed_table_writes_lose_no_verdict_and_are_retried_next_tick() -> None:
    state, hints = FailingOnce(fail=4), FailingOnce(fail=4)
    s2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T, hints=hints)
    outs = run_ticks(s2, "m", 1000.0, 4)        # every write of these ticks fails
    trans = [t for o in outs for t in o.transitions if t.node_id == "slow"]
    assert [str(t.to_state) for t in trans][-2:] == ["unhealthy", "quarantined"]
    assert "slow" not in outs[-1].tick.routing
    assert not state and not hints and s2.write_failures == 8
    run_ticks(s2, "m", 1000.0 + 4 * T, 1)       # nothing new to say, yet both are written now
    assert state[state_key("m")] == s2.evaluator.snapshot_model("m")
    assert decode_hints(hints.items()).out_of_fit == {("slow", "m")}


def test_a_table_value_too_large_for_kafka_is_not_written_and_the_worker_goes_on() -> None:
    # faust's producer crashes the worker on a message above max_request_size: never send one
    state: dict[bytes, Any] = {}
    s2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T, max_value_bytes=200)
    outs = run_ticks(s2, "m", 1000.0, 4)
    assert "slow" not in outs[-1].tick.routing          # verdicts go on
    assert not state and s2.oversized >= 4 and s2.write_failures == s2.oversized
    s2.max_value_bytes = 1_000_000
    run_ticks(s2, "m", 1000.0 + 4 * T, 1)               # fits again: written
    assert state[state_key("m")] == s2.evaluator.snapshot_model("m")


def _share(source: str, tick_ts: float, values: np.ndarray) -> ClusterDigest:
    return ClusterDigest("m", tick_ts, source, 3, digest_dict_of_sorted(np.sort(values)))


def test_a_large_state_is_stored_compressed_and_a_new_worker_resumes_from_it() -> None:
    # A model of ~1,300 nodes has ~900 KB of JSON state: stored packed, it still fits
    state: dict[bytes, Any] = {}
    hints: dict[bytes, Any] = {}
    plain = pack_value(_quarantined_state())[1]         # its size as plain JSON
    s2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T, hints=hints,
                max_value_bytes=plain // 2, plain_max_bytes=50)
    run_ticks(s2, "m", 1000.0, 4)
    stored = state[state_key("m")]
    assert set(stored) == {"zlib_b64"} and s2.oversized == 0
    assert unpack_value(stored) == s2.evaluator.snapshot_model("m")
    assert set(hints[state_key("m")]) == {"zlib_b64"}
    assert decode_hints(hints.items()).out_of_fit == {("slow", "m")}
    fresh = Stage2(FleetEvaluator(SETTINGS), dict(state), stale_after_s=1.5 * T)
    outs = run_ticks(fresh, "m", 1010.0, 1)
    assert states(fresh, "m")["slow"] is HealthState.QUARANTINED     # resumed, not started over
    assert "slow" not in outs[0].tick.routing and fresh.refused_states == 0


def _quarantined_state() -> dict[str, Any]:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    run_ticks(s2, "m", 1000.0, 4)
    return s2.evaluator.snapshot_model("m")


def test_pack_value_keeps_small_values_readable_and_round_trips_large_ones() -> None:
    small = {"judge_since": {"a": 1.0}, "out_of_fit": [], "tail_ref": None}
    assert pack_value(small) == (small, len(b'{"judge_since":{"a":1.0},"out_of_fit":[],"tail_ref":null}'))
    big = {"pairs": {f"gpu-{i:05d}": {"state": "healthy", "p50": 1000.0 + i} for i in range(5000)}}
    stored, size = pack_value(big)
    assert set(stored) == {"zlib_b64"} and size < len(repr(big)) / 5
    assert unpack_value(stored) == big and unpack_value(small) is small
    # The JSON a caller made already (stage 2 keeps it to tell a changed state) packs the same.
    assert pack_value(big, raw=value_json(big)) == (stored, size)
    assert value_json(small) == b'{"judge_since":{"a":1.0},"out_of_fit":[],"tail_ref":null}'
    with pytest.raises(ValueError, match="does not decode"):
        unpack_value({"zlib_b64": "!!"})


def test_hints_that_do_not_decode_are_skipped_and_the_others_kept() -> None:
    got = decode_hints([(b"bad", {"zlib_b64": "bm90IHpsaWI="}),
                        (b"x", pack_value(encode_hints({"a": 1.0}, ["b"]), plain_max_bytes=10)[0])])
    assert got.judge_since == {("a", "x"): 1.0} and got.out_of_fit == {("b", "x")}


def test_cluster_quantiles_merge_every_fresh_worker_share() -> None:
    rng = np.random.default_rng(5)
    fast, slow = rng.lognormal(7.0, 0.2, 6000), rng.lognormal(8.0, 0.2, 2000)
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    s2.on_cluster(_share("w1", 999.0, fast))
    s2.on_cluster(_share("w2", 998.0, rng.lognormal(12.0, 0.1, 5000)))   # superseded below
    s2.on_cluster(_share("w2", 999.5, slow))
    s2.on_cluster(_share("w2", 999.2, fast))                                # older: ignored
    (out,) = run_ticks(s2, "m", 1000.0, 1)
    union = np.concatenate([fast, slow])
    for got, q in ((out.tick.fleet_latency_p50_us, 0.5), (out.tick.fleet_latency_p99_us, 0.99)):
        assert got is not None
        assert abs(got / float(np.quantile(union, q)) - 1) < 0.02, (q, got)
    # w1 stops sending: its share goes stale and the cluster is w2's alone.
    s2.on_cluster(_share("w2", 1005.5, slow))
    (out,) = run_ticks(s2, "m", 1000.0 + 3 * T, 1)
    assert out.tick.fleet_latency_p50_us is not None
    assert abs(out.tick.fleet_latency_p50_us / float(np.median(slow)) - 1) < 0.02
    # Nothing fresh: no figure rather than an old one.
    (out,) = run_ticks(s2, "m", 1000.0 + 9 * T, 1)
    assert out.tick.fleet_latency_p50_us is None and out.tick.fleet_latency_p99_us is None


def test_cluster_digests_of_models_not_owned_are_dropped() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    s2.on_cluster(_share("w1", 999.0, np.arange(1.0, 100.0)))
    feed(s2, "m", 999.0)
    assert s2.tick(1000.0, lambda m: False) == []
    feed(s2, "m", 1000.0)
    (out,) = s2.tick(1001.0, lambda m: True)
    assert out.tick.fleet_latency_p50_us is None


def test_hints_written_by_older_versions_still_decode() -> None:
    old = {b"m": {"slow": 990.0, "judge_since": 5.0}, "other": {}}   # bare {node: since_ts}
    new = {b"x": encode_hints({"a": 1.0}, ["b"])}
    got = decode_hints([*old.items(), *new.items()])
    assert got.judge_since == {("slow", "m"): 990.0, ("judge_since", "m"): 5.0, ("a", "x"): 1.0}
    assert got.out_of_fit == {("b", "x")}


def test_restart_resumes_quarantine_from_state() -> None:
    state: dict[bytes, Any] = {}
    s2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T)
    run_ticks(s2, "m", 1000.0, 4)
    assert states(s2, "m")["slow"] is HealthState.QUARANTINED
    # A new process: fresh evaluator, same (changelog-restored) table.
    fresh = Stage2(FleetEvaluator(SETTINGS), dict(state), stale_after_s=1.5 * T)
    outs = run_ticks(fresh, "m", 1010.0, 1)
    assert states(fresh, "m")["slow"] is HealthState.QUARANTINED
    assert "slow" not in outs[0].tick.routing
    assert not [t for o in outs for t in o.transitions if t.node_id == "slow"]


def test_without_state_a_fresh_worker_would_start_over() -> None:
    # The control for the test above: the table is what carries the quarantine.
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    outs = run_ticks(s2, "m", 1010.0, 1)
    # a new pair again (admission: not routed while its first window is 3x its fellows')
    assert states(s2, "m")["slow"] is HealthState.WARMING
    assert "slow" not in outs[0].tick.routing


@pytest.mark.parametrize("stored", [
    "version-1",                 # the unversioned per-model state written before version 2
    {"version": 99},             # a newer format
    {"version": 2, "pairs": {}},  # incomplete
    "not a dict",
    {"zlib_b64": "eJzT0yMAAGTvBe8="},   # packed, but its JSON is cut short
    {"zlib_b64": "bm90IHpsaWI="},       # packed, but not zlib
])
def test_a_refused_stored_state_is_logged_and_the_model_starts_fresh(
        stored: Any, caplog: pytest.LogCaptureFixture) -> None:
    state: dict[bytes, Any] = {}
    s2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T)
    run_ticks(s2, "m", 1000.0, 4)
    assert states(s2, "m")["slow"] is HealthState.QUARANTINED
    if stored == "version-1":
        stored = dict(state[state_key("m")])
        del stored["version"]
    fresh = Stage2(FleetEvaluator(SETTINGS), {state_key("m"): stored}, stale_after_s=1.5 * T)
    outs = run_ticks(fresh, "m", 1010.0, 1)
    assert states(fresh, "m")["slow"] is HealthState.WARMING    # started over, as without state
    assert "slow" not in outs[0].tick.routing                   # (a new pair: not admitted yet)
    assert fresh.refused_states == 1
    assert "cannot be restored" in caplog.text and "'m'" in caplog.text
    # The fresh state replaced the refused one in the table.
    assert fresh.state[state_key("m")] == fresh.evaluator.snapshot_model("m")


def test_a_refused_state_drops_what_the_worker_held_of_the_model() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    run_ticks(s2, "m", 1000.0, 4)
    assert states(s2, "m")["slow"] is HealthState.QUARANTINED
    s2.state[state_key("m")] = {"version": 1}
    s2.on_assignment_changed()                  # the model comes back after a rebalance
    outs = run_ticks(s2, "m", 1010.0, 1)
    # a new pair again (admission: not routed while its first window is 3x its fellows')
    assert states(s2, "m")["slow"] is HealthState.WARMING
    assert "slow" not in outs[0].tick.routing


def test_models_not_owned_are_not_evaluated_and_their_input_dropped() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    feed(s2, "mine", 1000.0)
    feed(s2, "theirs", 1000.0)
    outs = s2.tick(1000.5, lambda m: m == "mine")
    assert [o.tick.model for o in outs] == ["mine"]
    assert s2.pending_summaries() == 0
    assert "theirs" not in s2.evaluator.models()  # type: ignore[attr-defined]


def test_stale_summaries_are_ignored() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    feed(s2, "m", 1000.0)
    (out,) = s2.tick(1000.0 + 10 * T, lambda m: True)
    assert out.tick.transitions == ()


def test_newest_summary_per_node_wins() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    s2.on_summary(summary("a", "m", 1002.0, 10.0, 11.0))
    s2.on_summary(summary("a", "m", 1000.0, 99.0, 99.0))
    assert s2.pending_summaries() == 1
    (out,) = s2.tick(1002.5, lambda m: True)
    (status,) = out.tick.statuses
    assert status.p50 == 10.0


def test_unrecoverable_diagnostics_retire_the_node() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)
    (req,) = [r for o in run_ticks(s2, "m", 1000.0, 4) for r in o.tick.diagnostics]
    # The answer to the request made at the ejection (issue 28: only that one counts).
    s2.on_diagnostics(DiagnosticsResult("slow", "m", recoverable=False, request_id=req.request_id,
                                        arrived_ts=req.ts + 1.0))
    outs = run_ticks(s2, "m", 1008.0, 1)
    (t,) = outs[0].diagnostics_transitions
    assert (t.node_id, t.to_state) == ("slow", HealthState.RETIRED)
    assert outs[0].transitions[0] == t


def test_diagnostics_queue_is_bounded() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T, max_pending_diagnostics=3)
    for i in range(10):
        s2.on_diagnostics(DiagnosticsResult(f"n{i}", "m", recoverable=True))
    assert len(s2._diagnostics["m"]) == 3


def test_bad_stale_after() -> None:
    with pytest.raises(ValueError, match="stale_after_s"):
        Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=0)


@settings(max_examples=30, deadline=None)
@given(owned=st.sets(st.sampled_from(["a", "b", "c", "d"])))
def test_each_model_evaluated_by_exactly_its_owner(owned: set[str]) -> None:
    """Two workers splitting the models evaluate disjoint sets that cover all models."""
    models = ["a", "b", "c", "d"]
    w1 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=3.0)
    w2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=3.0)
    for m in models:
        for w in (w1, w2):
            feed(w, m, 1000.0, ["x", "y"])
    got1 = {o.tick.model for o in w1.tick(1000.5, lambda m: m in owned)}
    got2 = {o.tick.model for o in w2.tick(1000.5, lambda m: m not in owned)}
    assert got1 == owned and got1.isdisjoint(got2) and got1 | got2 == set(models)


def test_hints_carry_the_fresh_tail_threshold() -> None:
    hints: dict[bytes, Any] = {}
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T, hints=hints)
    run_ticks(s2, "m", 1000.0, 2)
    got = decode_hints(hints.items()).tail_refs
    ev = s2.evaluator
    assert isinstance(ev, FleetEvaluator)
    assert got == {"m": ev.tail_ref("m")} and got["m"] > 0
    assert decode_hints([(b"x", encode_hints({}, [], None))]).tail_refs == {}


def test_every_summary_not_evaluated_is_counted_by_reason() -> None:
    s2 = Stage2(FleetEvaluator(SETTINGS), {}, stale_after_s=1.5 * T)

    def summary(node: str, model: str, tick_ts: float) -> WindowSummary:
        return WindowSummary(node_id=node, model=model, tick_ts=tick_ts, signal="latency",
                             samples=200, p50=100.0, p99=200.0, latency_p50_us=100.0,
                             latency_p99_us=200.0, first_seen_ts=0.0)
    s2.on_summary(summary("a", "m", 1000.0))
    s2.on_summary(summary("a", "m", 1000.0 + T))          # supersedes the first
    s2.on_summary(summary("b", "m", 1000.0 - 10 * T))     # stale at the tick
    s2.on_summary(summary("c", "other", 1000.0 + T))      # another worker's model
    outs = s2.tick(1000.0 + T, lambda model: model == "m")
    assert [s.node_id for o in outs for s in o.summaries] == ["a"]
    assert s2.dropped == {"superseded": 1, "stale": 1, "not_owned": 1}
