"""Issue 24's done-when: the scenario faults through the histogram path, at vLLM's default buckets.

Every ``scenarios/*.toml`` trace is turned into what ``tailguard scrape`` would publish had each
node been a vLLM server scraped every 10 s (:func:`tailguard.sim.histtrace.histogram_lines`: e2e, and
for LLM traffic TTFT and inter-token latency, which vLLM always exports) and replayed through
:func:`tailguard.core.replay.replay.replay` with default settings. Each scenario's own expectations
(:func:`tailguard.sim.outcome.check`: which pairs leave, within which deadline, and that the others
stay) are the event path's, unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import decode
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.replay.replay import replay
from tailguard.sim import histtrace, outcome, tracegen
from tailguard.sim import scenario as sc

ROOT = Path(__file__).resolve().parents[2]
ALL = sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml"))
# Faults judged with fewer than min_peers peers in the class: against each node's own history, as
# on the event path (docs/rules.md, Histogram pairs).
BELOW_MIN_PEERS = {"two_node_models", "scale_down_then_fault"}
# A tail of 8 % at 5 req/s: ~150 requests a window, so the 1e-4 binomial test passes on some ticks
# only; the windows between, past the share limit but not significant, hold the streak
# (docs/rules.md, Histogram pairs), and the node leaves within the event path's deadline.
LOW_RATE_TAIL = "low_rate_tail"


def _scenario(name: str) -> sc.Scenario:
    s = sc.load(ROOT / "scenarios" / f"{name}.toml")
    if any(m.kind == "llm" for m in s.models):   # a vLLM server exports TTFT and ITL whatever it is asked
        s = dataclasses.replace(s, emit_tokens=True, emit_ttft=True)
    return s


@cache
def run(name: str, seed: int) -> tuple[outcome.Outcome, tuple[dict[str, object], ...]]:
    s = _scenario(name)
    lines = histtrace.histogram_lines(tracegen.generate(s, seed))
    out: list[str] = []
    _det, stats = replay(lines, DetectorSettings(), out.append)
    assert stats.bad == {}, stats.summary()
    records = tuple(json.loads(line) for line in out)
    return outcome.check(s, records), records


def _explain(records: tuple[dict[str, object], ...]) -> str:
    return "\n".join(f"{r.get('ts')} {r.get('node_id')} {r.get('from')}->{r.get('to')} {r.get('reason')}"
                     f" {r.get('detail')}" for r in records
                     if r.get("type") == "transition" and r.get("reason") not in ("first_seen", "admitted"))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", ["slowdown_3x", "llm_tpot_2_5x"])
def test_3x_slowdown_and_2_5x_per_token_are_out_within_the_event_paths_deadline(name: str, seed: int) -> None:
    s = _scenario(name)
    (e,) = s.expect.eject
    assert e.within_s == 120.0                     # the event path's deadline, same file
    res, records = run(name, seed)
    assert res.ok, "\n".join(res.problems) + "\n" + _explain(records)
    assert set(res.ejected_at_s) == {(e.node_id, e.model)}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", ALL)
def test_every_scenario_meets_its_expectations(name: str, seed: int) -> None:
    """Healthy scenarios remove nobody; the others remove what they expect, in time, and only that."""
    res, records = run(name, seed)
    assert res.ok, "\n".join(res.problems) + "\n" + _explain(records)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_low_rate_tail_leaves_within_the_event_paths_deadline(seed: int) -> None:
    """Seeds 1-6: 180, 150, 90, 120, 120, 150 s after onset (before the hold: 330 s at seed 1)."""
    res, records = run(LOW_RATE_TAIL, seed)
    s = _scenario(LOW_RATE_TAIL)
    (e,) = s.expect.eject
    assert set(res.ejected_at_s) == {(e.node_id, e.model)}, _explain(records)
    assert res.ejected_at_s[(e.node_id, e.model)] - e.onset_s <= e.within_s, _explain(records)


@cache
def event_path_ejections(name: str, seed: int) -> dict[tuple[str, str], float]:
    s = _scenario(name)
    out: list[str] = []
    replay(tracegen.lines(tracegen.generate(s, seed)), DetectorSettings(), out.append)
    return dict(outcome.check(s, [json.loads(line) for line in out]).ejected_at_s)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(BELOW_MIN_PEERS))
def test_below_min_peers_the_fault_leaves_as_soon_as_on_the_event_path(name: str, seed: int) -> None:
    """Two live nodes: each judged against its own bucket history, moved as the other moved; the
    faulty one leaves within the scenario's deadline and at most one tick after the event path's
    own-history fallback takes it (seed 1: 70 s and 90 s after onset on both paths)."""
    res, records = run(name, seed)
    s = _scenario(name)
    (e,) = s.expect.eject
    key = (e.node_id, e.model)
    assert res.ok, "\n".join(res.problems) + "\n" + _explain(records)
    assert set(res.ejected_at_s) == {key}, _explain(records)
    events = event_path_ejections(name, seed)
    assert res.ejected_at_s[key] <= events[key] + DetectorSettings().tick_interval_s, _explain(records)


def test_histogram_lines_are_valid_events_with_vllm_buckets() -> None:
    s = _scenario("llm_tpot_2_5x")
    lines = histtrace.histogram_lines(tracegen.generate(s, 1))
    evs = [decode(line) for line in lines[:400]]
    hists = [e for e in evs if isinstance(e, HistogramBatch)]
    assert {e.metric for e in hists} == {"e2e", "ttft", "itl"}
    assert {e.bounds_s for e in hists if e.metric == "e2e"} == {histtrace.VLLM_BUCKETS["e2e"]}
    assert len(histtrace.VLLM_BUCKETS["ttft"]) == 22 and len(histtrace.VLLM_BUCKETS["itl"]) == 19
    assert all(e.interval_s == 10.0 and e.ts % 10 == 0 for e in hists)
    e2e = [e for e in hists if e.metric == "e2e"]
    assert all(e.observations == e.requests for e in e2e)
    itl = [e for e in hists if e.metric == "itl"]
    assert sum(e.observations for e in itl) > 10 * sum(e.requests or 0 for e in itl)   # tokens, not requests


@pytest.mark.parametrize("shift_s", range(0, 30, 3))
def test_a_tail_fault_leaves_within_the_deadline_at_any_onset_phase(shift_s: int) -> None:
    """The onset against the 30-s tick grid: the window the onset splits is past the share limit
    but not significant (held), and counts once the next one is abnormal (onset credit). Without
    the credit, onsets 6 and 9 s later left 124 and 121 s after onset (deadline 120 s)."""
    base = _scenario("tail_fault")
    s = dataclasses.replace(
        base, faults=tuple(dataclasses.replace(f, onset_s=f.onset_s + shift_s) for f in base.faults),
        expect=dataclasses.replace(base.expect, eject=tuple(
            dataclasses.replace(e, onset_s=e.onset_s + shift_s) for e in base.expect.eject)))
    out: list[str] = []
    replay(histtrace.histogram_lines(tracegen.generate(s, 1)), DetectorSettings(), out.append)
    records = tuple(json.loads(line) for line in out)
    res = outcome.check(s, records)
    assert res.ok, "\n".join(res.problems) + "\n" + _explain(records)
