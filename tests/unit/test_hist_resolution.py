"""Buckets that cannot resolve a model's P50: the first-bucket check (hist_resolution), the
replay summary that names it, and stage 2's warning once per model and metric."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.core.judge.hist_resolution import advice, summary_text, unresolved
from tailguard.core.window.hist_window import HistWindow
from tailguard.replay_cli import main
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.stage2 import Stage2

DYNAMO = (2.0, 5.0, 10.0)
VLLM = (0.3, 0.5, 0.8, 1.0)


def peer(node: str, wins: dict[str, tuple[tuple[float, ...], list[int]]]) -> WindowSummary:
    hist = {m: HistWindow(b, tuple(c), sum(c), None, 30.0).to_dict() for m, (b, c) in wins.items()}
    return WindowSummary(node, "m", 0.0, "e2e_hist", 100, 1.0, 2.0, None, None, extra={"hist": hist})


def test_all_mass_in_the_first_bucket_is_unresolved_with_its_bound() -> None:
    fleet = [peer(f"n{i}", {"e2e": (DYNAMO, [100, 0, 0, 0])}) for i in range(5)]
    assert unresolved(fleet) == (("e2e", 2.0),)


def test_a_fleet_whose_median_lies_past_the_first_bound_is_resolved() -> None:
    fleet = [peer(f"n{i}", {"e2e": (VLLM, [10, 30, 10, 0, 0])}) for i in range(5)]
    assert unresolved(fleet) == ()


def test_most_peers_or_the_pooled_median_in_the_first_bucket_mark_the_model() -> None:
    fast, slow = (VLLM, [90, 10, 0, 0, 0]), (VLLM, [10, 80, 10, 0, 0])
    itl, itl_fast = ((0.01, 0.025, 0.05), [5, 40, 5, 0]), ((0.01, 0.025, 0.05), [45, 5, 0, 0])
    # 3 of 5 peers' P50 below 0.3 s: e2e unresolved, and with itl unresolved too both are named.
    fleet = [peer(f"n{i}", {"e2e": fast if i < 3 else slow, "itl": itl_fast}) for i in range(5)]
    assert unresolved(fleet) == (("e2e", 0.3), ("itl", 0.01))
    # itl resolves the model (P50 past its first bound): it is judged there, nothing is named.
    fleet = [peer(f"n{i}", {"e2e": fast if i < 3 else slow, "itl": itl}) for i in range(5)]
    assert unresolved(fleet) == ()
    fleet = [peer(f"n{i}", {"e2e": fast if i < 3 else slow}) for i in range(5)]
    assert unresolved(fleet) == (("e2e", 0.3),)
    # 2 of 5 peers, but they carry most of the requests: the pooled median is below 0.3 s.
    busy = (VLLM, [900, 100, 0, 0, 0])
    fleet = [peer(f"n{i}", {"e2e": busy if i < 2 else slow}) for i in range(5)]
    assert unresolved(fleet) == (("e2e", 0.3),)
    # 2 of 5 peers alike in size: neither most peers nor the pooled median.
    fleet = [peer(f"n{i}", {"e2e": fast if i < 2 else slow}) for i in range(5)]
    assert unresolved(fleet) == ()


def test_counters_only_pairs_are_never_marked() -> None:
    fleet = [peer(f"n{i}", {"e2e": ((), [50])}) for i in range(5)]
    assert unresolved(fleet) == ()


def test_summary_text_names_each_model_and_metric_sorted() -> None:
    text = summary_text({("b", "e2e"): 2.0, ("a", "ttft"): 0.001})
    assert text == "; " + advice("a", "ttft", 0.001) + "; " + advice("b", "e2e", 2.0)
    assert "first bound 2 s" in advice("b", "e2e", 2.0) and "(ttft/itl)" in advice("b", "e2e", 2.0)
    assert summary_text({}) == ""


def hist_trace(counts: list[int], bounds: tuple[float, ...] = DYNAMO, nodes: int = 6,
               seconds: int = 300) -> bytes:
    out = []
    for t in range(10, seconds + 1, 10):
        for i in range(nodes):
            out.append(json.dumps({"type": "histogram", "node_id": f"n{i}", "model": "m", "metric": "e2e",
                                   "ts": 1_764_680_000.0 + t, "interval_s": 10.0, "bounds_s": list(bounds),
                                   "counts": counts, "requests": sum(counts), "instance": f"n{i}#0"}))
    return "\n".join(out).encode() + b"\n"


@pytest.mark.parametrize(("counts", "bounds", "named"), [
    ([50, 0, 0, 0], DYNAMO, True),                  # ~0.1-s requests under Dynamo's 2-s first bound
    ([5, 30, 10, 5, 0], VLLM, False),                # a median inside the buckets
])
def test_replay_summary_names_an_unresolved_model(counts: list[int], bounds: tuple[float, ...], named: bool,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "trace.jsonl"
    f.write_bytes(hist_trace(counts, bounds))
    assert main([str(f)]) == 0
    err = capsys.readouterr().err
    line = ("buckets cannot resolve model m's e2e: most requests below the first bound 2 s, so its "
            "nodes are judged on their mean per window only (a slower tail under the bound is not seen); "
            "judge it on another metric (ttft/itl) or give the server finer buckets")
    assert (line in err) is named
    assert ("buckets cannot resolve" in err) is named


def test_stage2_warns_once_per_model_and_metric_and_again_after_it_cleared(
        caplog: pytest.LogCaptureFixture) -> None:
    st = DetectorSettings()
    s2 = Stage2(FleetEvaluator(st), {}, stale_after_s=100.0)
    marks = []
    with caplog.at_level(logging.WARNING, logger="tailguard.streaming.stage2"):
        for k in range(15):
            ts = 1000.0 + k * st.tick_interval_s
            counts = (10, 60, 30, 0) if 8 <= k < 11 else (100, 0, 0, 0)     # resolved for 3 ticks
            for i in range(5):
                w = HistWindow(DYNAMO, counts, sum(counts), None, 30.0).to_dict()
                s2.on_summary(WindowSummary(f"n{i}", "m", ts, "e2e_hist", sum(counts), 1e6, 2e6, None, None,
                                            extra={"hist": {"e2e": w}}))
            marks += [o.tick.unresolved for o in s2.tick_models(ts + 0.1, lambda m: True)]
    assert marks[7] == marks[11] == marks[14] == (("e2e", 2.0),)
    assert marks[8] == marks[10] == ()
    warned = [r.getMessage() for r in caplog.records if "buckets cannot resolve" in r.getMessage()]
    assert warned == [advice("m", "e2e", 2.0)] * 2      # once, and once more after it cleared


def test_the_gauge_carries_the_first_bound_until_the_metric_is_resolved() -> None:
    m = WorkerMetrics(CollectorRegistry())

    def value(metric: str) -> float | None:
        return m.registry.get_sample_value("tailguard_unresolved_first_bound_seconds",
                                           {"model": "m", "metric": metric})

    m.set_unresolved("m", {"e2e": 2.0})
    assert value("e2e") == 2.0 and value("itl") is None
    m.set_unresolved("m", {})
    assert value("e2e") is None
    m.set_unresolved("m", {"e2e": 0.3})
    m.forget_model("m")
    assert value("e2e") is None
