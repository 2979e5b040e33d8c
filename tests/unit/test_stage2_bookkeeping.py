"""Stage 2 bookkeeping: PairTable (ModelState.pairs) indexes equal what a scan of the pairs gives;
the façade's grouping by model equals itertools.groupby's."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState
from tailguard.core.judge import health
from tailguard.core.judge.health import PairState
from tailguard.core.judge.model_state import ModelState, PairTable

ST = DetectorSettings()
STATES = [HealthState.WARMING, HealthState.HEALTHY, HealthState.SUSPECT, HealthState.UNHEALTHY,
          HealthState.QUARANTINED, HealthState.RETIRED, HealthState.GONE]


def _pair(rng: random.Random, node: str) -> PairState:
    return PairState(node_id=node, model="m", state=rng.choice(STATES), since_ts=0.0,
                     first_seen_ts=rng.choice([0.0, 900.0]), reason="r", routed=rng.random() < 0.6,
                     judge_since_ts=rng.choice([None, 100.0, 500.0, 800.0]),
                     abnormal_streak=rng.choice([0, 0, 1, 3]))


def _check(t: PairTable, now_s: float) -> None:
    assert t.rare == {n for n, p in t.items() if not (p.routed and p.state is HealthState.HEALTHY)}
    assert t.unrouted == {n for n, p in t.items() if not p.routed}
    assert t.streaked == {n for n, p in t.items() if p.abnormal_streak}
    assert t.routing() == frozenset(n for n, p in t.items() if p.routed)
    assert t.in_order(set(t.rare)) == [n for n in t if n in t.rare]
    assert t.in_order(set(list(t)[:2])) == list(t)[:2]
    want = {n for n, p in t.items() if health.judge_since(p, now_s, ST) is not None}
    got = t.rare.union(t.cut_candidates(now_s, ST.max_sample_age_s))
    assert want <= got


def test_indexes_follow_every_kind_of_write() -> None:
    rng = random.Random(5)
    t = PairTable()
    now = 0.0
    for i in range(3000):
        node = f"n{rng.randrange(40)}"
        op = rng.random()
        if op < 0.6:
            t[node] = _pair(rng, node)
        elif op < 0.7:
            t.pop(node, None)
        elif op < 0.75 and node in t:
            del t[node]
        elif op < 0.8:
            t.setdefault(node, _pair(rng, node))
        elif op < 0.85:
            t.update({node: _pair(rng, node)})
        elif op < 0.86 and t:
            t.popitem()
        elif op < 0.87:
            t.clear()
        # Time mostly goes on, sometimes back (a query for an earlier tick).
        now = max(0.0, now + rng.choice([30.0, 30.0, 30.0, -400.0]))
        if i % 7 == 0:
            _check(t, now)
    _check(t, now)


def test_restored_and_copied_tables_keep_their_indexes() -> None:
    rng = random.Random(9)
    ms = ModelState()
    for i in range(30):
        ms.pairs[f"n{i}"] = _pair(rng, f"n{i}")
    for other in (ModelState.from_dict(ms.to_dict()), copy.deepcopy(ms), pickle.loads(pickle.dumps(ms))):
        assert isinstance(other.pairs, PairTable)
        assert other == ms and other.to_dict() == ms.to_dict()
        _check(other.pairs, 600.0)
        node = next(iter(other.pairs.rare))
        other.pairs[node] = dataclasses.replace(other.pairs[node], state=HealthState.HEALTHY,
                                                routed=True)
        _check(other.pairs, 600.0)
    # A plain dict given to ModelState becomes a PairTable.
    plain = ModelState(pairs={"a": _pair(rng, "a")})    # type: ignore[arg-type]
    assert isinstance(plain.pairs, PairTable)
    _check(plain.pairs, 0.0)



def test_summaries_grouped_by_model_as_groupby_does() -> None:
    import itertools

    from tailguard.core.contract.types import WindowSummary
    from tailguard.core.replay.detector import _by_model

    rng = random.Random(1)
    for _ in range(50):
        keys = sorted({(f"m{rng.randrange(6)}", f"n{rng.randrange(9)}") for _ in range(rng.randrange(30))})
        summaries = [WindowSummary(n, m, 0.0, "latency", 1, 1.0, 2.0, 1.0, 2.0) for m, n in keys]
        want = {m: list(g) for m, g in itertools.groupby(summaries, key=lambda s: s.model)}
        got = _by_model(summaries)
        assert got == want and list(got) == list(want)
