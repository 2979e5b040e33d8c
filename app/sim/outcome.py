"""Judge a detector's verdicts on a scenario against the scenario's ``[expect]``.

:func:`check` takes the lines ``tailguard replay`` writes (transitions with
``ts``, ``node_id``, ``model``, ``to``, ``routed``; fleet events with
``"type": "fleet"``; routing-weight changes with ``"type": "weight"``) as parsed
dicts and returns an :class:`Outcome` listing every broken expectation in words,
with numbers (seconds after onset). A scenario whose other nodes stay
(``others_stay``) also expects every node without a fault to keep a weight of at
least :data:`HEALTHY_MIN_WEIGHT`. A faulty pair refused admission (``from`` warming) after its
fault's onset was out of routing all along: it meets its ``within_s`` whenever the refusal
comes. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tailguard.sim.scenario import Scenario

# No node without a fault is weighted below this (no false down-weighting; docs/rules.md).
HEALTHY_MIN_WEIGHT = 0.95


@dataclass(frozen=True, slots=True)
class Outcome:
    problems: tuple[str, ...]
    #: (node, model) -> seconds after the scenario's start when it first left routing
    ejected_at_s: Mapping[tuple[str, str], float]
    #: (node, model) -> seconds after the start when it first came back after its ejection
    readmitted_at_s: Mapping[tuple[str, str], float]
    fleet_events: int
    #: (node, model) -> seconds after the start when it first left routing as gone (silent)
    gone_at_s: Mapping[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    #: (node, model) -> (lowest routing weight, seconds after the start when it first got it)
    lowest_weight: Mapping[tuple[str, str], tuple[float, float]] = dataclasses.field(
        default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(scenario: Scenario, records: Iterable[Mapping[str, Any]]) -> Outcome:
    ejected: dict[tuple[str, str], float] = {}
    readmitted: dict[tuple[str, str], float] = {}
    gone: dict[tuple[str, str], float] = {}
    fleet = 0
    kinds: set[str] = set()
    low: dict[tuple[str, str], tuple[float, float]] = {}
    refused: set[tuple[str, str]] = set()
    for rec in records:
        if rec.get("type") == "weight":
            key = (str(rec["node_id"]), str(rec["model"]))
            w = float(rec["weight"])
            if w < low.get(key, (1.0, 0.0))[0]:
                low[key] = (w, float(rec["ts"]) - scenario.epoch_s)
            continue
        if rec.get("type") == "fleet":
            fleet += 1
            kinds.add(str(rec.get("kind")))
            continue
        if "routed" not in rec or "node_id" not in rec:
            continue
        key = (str(rec["node_id"]), str(rec["model"]))
        t = float(rec["ts"]) - scenario.epoch_s
        if rec["routed"] is False and rec.get("reason") == "silent":
            gone.setdefault(key, t)
            continue
        if rec.get("reason") == "forgotten":      # dropped after a long silence: out already
            continue
        if rec["routed"] is False and rec.get("to") == "warming":   # awaiting admission: never in
            continue
        if rec["routed"] is False and key not in ejected:
            ejected[key] = t
            if rec.get("from") == "warming":        # admission refused: out of routing all along
                refused.add(key)
        elif rec["routed"] is True and key in ejected and key not in readmitted:
            readmitted[key] = t

    problems: list[str] = []
    expected = {(e.node_id, e.model): e for e in scenario.expect.eject}
    for key, e in expected.items():
        name = f"{key[0]}/{key[1]}"
        if key not in ejected:
            problems.append(f"{name} was never taken out of routing (fault onset {e.onset_s:g} s, "
                            f"expected within {e.within_s:g} s)")
            continue
        after = ejected[key] - e.onset_s
        if after < 0:
            problems.append(f"{name} was taken out {-after:.1f} s BEFORE its fault's onset ({e.onset_s:g} s)")
        elif after > e.within_s and key not in refused:     # never admitted: out at onset already
            problems.append(f"{name} was taken out {after:.1f} s after onset; expected within {e.within_s:g} s")
        if e.readmit_within_s is not None and e.end_s is not None:
            back = readmitted.get(key)
            if back is None:
                problems.append(f"{name} was never re-admitted (fault ended at {e.end_s:g} s, "
                                f"expected within {e.readmit_within_s:g} s)")
            elif back - e.end_s > e.readmit_within_s:
                problems.append(f"{name} was re-admitted {back - e.end_s:.1f} s after its fault ended; "
                                f"expected within {e.readmit_within_s:g} s")
    expected_gone = {(g.node_id, g.model): g for g in scenario.expect.gone}
    for key, g in expected_gone.items():
        name = f"{key[0]}/{key[1]}"
        at = gone.get(key)
        if at is None:
            problems.append(f"{name} stopped reporting at {g.at_s:g} s but never left routing as gone "
                            f"(expected within {g.within_s:g} s)")
        elif not 0 <= at - g.at_s <= g.within_s:
            problems.append(f"{name} left routing as gone {at - g.at_s:.1f} s after it stopped reporting; "
                            f"expected within {g.within_s:g} s")
    if scenario.expect.others_stay:
        for key, t in sorted(gone.items()):
            if key not in expected_gone:
                problems.append(f"{key[0]}/{key[1]} left routing as gone at {t:.1f} s "
                                "but the scenario expects it to stay")
        for key, t in sorted(ejected.items()):
            if key not in expected:
                problems.append(f"{key[0]}/{key[1]} was taken out of routing at {t:.1f} s "
                                "but the scenario expects it to stay")
        faulty = {(n, m.name) for f in scenario.faults for n in f.nodes for m in scenario.models
                  if f.applies(n, m.name)}
        for key, (w, t) in sorted(low.items()):
            if key not in faulty and key not in expected and w < HEALTHY_MIN_WEIGHT:
                problems.append(f"{key[0]}/{key[1]} has no fault but was weighted down to {w:g} "
                                f"at {t:.1f} s (at least {HEALTHY_MIN_WEIGHT:g} expected)")
    if scenario.expect.fleet_event is True and fleet == 0:
        problems.append("no fleet-level event was reported; the scenario expects one")
    if scenario.expect.fleet_event is False and fleet > 0:
        problems.append(f"{fleet} fleet-level event(s) were reported; the scenario expects none")
    for kind in scenario.expect.fleet_kinds:
        if kind not in kinds:
            problems.append(f"no {kind!r} fleet event was reported; the scenario expects one "
                            f"(reported: {', '.join(sorted(kinds)) or 'none'})")
    return Outcome(tuple(problems), ejected, readmitted, fleet, gone, low)
