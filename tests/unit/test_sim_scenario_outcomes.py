"""Every shipped non-LLM scenario meets its own ``[expect]`` through the real detector.

Runs ``scenarios/*.toml`` (the issue-3 list; the LLM ones are in
``tests/scenarios/test_llm_scenarios.py``) through the ``tailguard replay``
code path with default settings plus the scenario's ``[detector]`` table
(single event form; the batch form for one fault scenario) and checks the
outcome with :func:`tailguard.sim.outcome.check`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tailguard.core.contract.config import parse_overrides
from tailguard.core.replay.replay import replay
from tailguard.sim import outcome, tracegen
from tailguard.sim import scenario as sc

ROOT = Path(__file__).resolve().parents[2]
PLAIN = sorted(p for p in (ROOT / "scenarios").glob("*.toml") if not p.stem.startswith("llm_"))


pytestmark = pytest.mark.slow

CASES = [pytest.param(p, "single", id=p.stem) for p in PLAIN] + [
    pytest.param(ROOT / "scenarios" / "tail_fault.toml", "batch", id="tail_fault-batch")]


@pytest.mark.parametrize(("path", "fmt"), CASES)
def test_shipped_scenario_meets_its_expectations(path: Path, fmt: tracegen.Format) -> None:
    s = sc.load(path)
    settings = parse_overrides(dict(s.detector))
    out: list[str] = []
    replay(tracegen.lines(tracegen.generate(s), fmt=fmt), settings, out.append)
    res = outcome.check(s, [json.loads(line) for line in out])
    assert res.ok, f"{s.name} ({fmt}): " + "; ".join(res.problems)
    for e in s.expect.eject:          # an expected ejection is a real one, not a coincidence
        assert res.ejected_at_s[(e.node_id, e.model)] >= e.onset_s
