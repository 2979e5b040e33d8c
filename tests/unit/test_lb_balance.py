"""Balancer: round-robin over the backends not held out, probe share, fallback, retry exclusion.

Not routed and not held out is a node tailguard has not judged yet (admission by evidence):
it gets its share. The tests that check "routed only" hold the other nodes out, as tailguard
does for nodes it took out."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.lb.balance import Balancer, Pick

URLS = {f"n{i}": f"http://127.0.0.1:{9000 + i}" for i in range(5)}

node_ids = st.sampled_from([*sorted(URLS), "ghost-1", "ghost-2"])


def held_but(routed: frozenset[str]) -> frozenset[str]:
    return frozenset(URLS) - routed


def test_round_robin_visits_each_routed_node_once_per_cycle() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n1", "n3", "n4"})
    picks = [b.pick("m", routed, held_out=held_but(routed)) for _ in range(9)]
    assert [p.node_id for p in picks if p] == ["n1", "n3", "n4"] * 3
    assert all(p is not None and not p.fallback and not p.probe for p in picks)
    assert picks[0] == Pick("n1", URLS["n1"])


def test_rotation_is_per_model() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n0", "n1"})
    held = held_but(routed)
    assert [b.pick("a", routed, held_out=held).node_id for _ in range(2)] == ["n0", "n1"]  # type: ignore[union-attr]
    assert b.pick("b", routed, held_out=held).node_id == "n0"  # type: ignore[union-attr]


def test_a_backend_neither_routed_nor_held_out_gets_its_share() -> None:
    # n4 is new: tailguard has not judged it (not routed, not held out); n2 was taken out
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n0", "n1", "n3"})
    picks = [b.pick("m", routed, held_out=frozenset({"n2"})) for _ in range(8)]
    assert [p.node_id for p in picks if p] == ["n0", "n1", "n3", "n4"] * 2
    assert all(p is not None and not p.fallback for p in picks)
    # a model with no routing set yet (nobody admitted) but a node held out: not fallback
    picks = [b.pick("new", frozenset(), held_out=frozenset({"n2"})) for _ in range(4)]
    assert [p.node_id for p in picks if p] == ["n0", "n1", "n3", "n4"]
    assert all(p is not None and not p.fallback for p in picks)


@pytest.mark.parametrize(("routed", "held"), [(None, frozenset()), (frozenset(), frozenset()),
                                              (frozenset({"ghost"}), frozenset(URLS))])
def test_unknown_routing_set_falls_back_to_all_known_backends(routed: frozenset[str] | None,
                                                              held: frozenset[str]) -> None:
    b = Balancer(URLS, probe_share=0.0)
    picks = [b.pick("m", routed, held_out=held) for _ in range(len(URLS))]
    assert sorted(p.node_id for p in picks if p) == sorted(URLS)
    assert all(p is not None and p.fallback for p in picks)


def test_request_without_model_or_set_falls_back() -> None:
    b = Balancer(URLS, probe_share=0.0)
    p = b.pick(None, None)
    assert p is not None and p.fallback


def test_exclude_retries_elsewhere_and_falls_back_when_routed_set_is_exhausted() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n2", "n3"})
    for _ in range(4):
        p = b.pick("m", routed, exclude=frozenset({"n2"}), held_out=held_but(routed))
        assert p is not None and p.node_id == "n3" and not p.fallback
    p = b.pick("m", frozenset({"n2"}), exclude=frozenset({"n2"}), held_out=held_but(frozenset({"n2"})))
    assert p is not None and p.fallback and p.node_id != "n2"
    assert b.pick("m", None, exclude=frozenset(URLS)) is None


@pytest.mark.parametrize(("share", "n", "expected"), [(0.02, 50, 1), (0.02, 1000, 20), (0.1, 95, 9), (0.5, 7, 3),
                                                      (0.0, 1000, 0)])
def test_probe_due_gives_exactly_floor_n_times_share(share: float, n: int, expected: int) -> None:
    b = Balancer(URLS, probe_share=share)
    assert sum(b.probe_due("m") for _ in range(n)) == expected


def test_probe_slots_are_spread_not_bunched() -> None:
    b = Balancer(URLS, probe_share=0.25)
    slots = [i for i in range(20) if b.probe_due("m")]
    assert slots == [3, 7, 11, 15, 19]


def test_pick_probe_only_due_known_unrouted_quarantined_nodes_in_rotation() -> None:
    b = Balancer(URLS, probe_share=0.02)
    quarantined = {"n1": 100.0, "n2": 50.0, "n3": 10.0, "ghost": 0.0, "n4": 0.0}
    routed = frozenset({"n0", "n4"})   # n4 in both: routed wins, never probed
    picks = [b.pick_probe("m", routed, quarantined, now_s=60.0) for _ in range(4)]
    assert [p.node_id for p in picks if p] == ["n2", "n3", "n2", "n3"]
    assert all(p is not None and p.probe and not p.fallback for p in picks)
    assert b.pick_probe("m", routed, quarantined, now_s=5.0) is None
    assert b.pick_probe("m", routed, {}, now_s=1e12) is None


@pytest.mark.parametrize("share", [-0.01, 0.51, float("nan")])
def test_bad_probe_share_is_rejected_naming_it(share: float) -> None:
    with pytest.raises(ValueError, match="probe_share"):
        Balancer(URLS, probe_share=share)


def test_no_backends_is_rejected() -> None:
    with pytest.raises(ValueError, match="backends"):
        Balancer({})


@given(routed=st.frozensets(node_ids), held=st.frozensets(node_ids), exclude=st.frozensets(node_ids),
       n=st.integers(1, 40))
def test_pick_never_returns_excluded_or_held_out_unless_fallback(
    routed: frozenset[str], held: frozenset[str], exclude: frozenset[str], n: int
) -> None:
    b = Balancer(URLS, probe_share=0.0)
    usable = set(URLS) - held - exclude if routed or held else set()
    for _ in range(n):
        p = b.pick("m", routed, exclude=exclude, held_out=held)
        if p is None:
            assert set(URLS) <= exclude
            continue
        assert p.node_id not in exclude and p.url == URLS[p.node_id]
        assert p.fallback == (not usable)
        if usable:
            assert p.node_id in usable


@given(routed=st.frozensets(st.sampled_from(sorted(URLS)), min_size=1), cycles=st.integers(1, 5))
def test_round_robin_is_exactly_fair_over_whole_cycles(routed: frozenset[str], cycles: int) -> None:
    b = Balancer(URLS, probe_share=0.0)
    held = held_but(routed)
    counts = Counter(b.pick("m", routed, held_out=held).node_id  # type: ignore[union-attr]
                     for _ in range(cycles * len(routed)))
    assert counts == dict.fromkeys(routed, cycles)


@given(share=st.floats(0.0, 0.5), n=st.integers(0, 2000))
def test_probe_due_count_matches_share(share: float, n: int) -> None:
    b = Balancer(URLS, probe_share=share)
    got = sum(b.probe_due("m") for _ in range(n))
    assert abs(got - n * share) <= 1.0


# -- routing weights: smooth weighted round-robin ------------------------------------------

pick_calls = st.lists(st.tuples(st.sampled_from(["m", "other", None]), st.frozensets(node_ids),
                                st.frozensets(node_ids), st.frozensets(node_ids)), max_size=40)


@given(calls=pick_calls, full=st.sampled_from([{}, {"n0": 1.0}, dict.fromkeys(URLS, 1.0) | {"ghost-1": 0.3}]))
def test_all_weights_full_gives_the_same_sequence_as_no_weights(
    calls: list[tuple[str | None, frozenset[str], frozenset[str], frozenset[str]]], full: dict[str, float]
) -> None:
    # Every candidate at 1.0 (a weight of a node that is not a candidate does not count): byte for
    # byte the plain rotation, retries and fallbacks included.
    plain, weighted = Balancer(URLS, probe_share=0.0), Balancer(URLS, probe_share=0.0)
    for model, routed, held, exclude in calls:
        held = held | (frozenset({"ghost-1"}) & routed)
        routed = routed - held
        assert (plain.pick(model, routed, exclude=exclude, held_out=held)
                == weighted.pick(model, routed, exclude=exclude, held_out=held, weights=full))


def test_weights_give_each_node_its_share_spread_out() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n0", "n1", "n2", "n3"})
    weights = {"n1": 0.625, "n4": 0.1}          # n4 is held out: its weight does not count
    picks = [b.pick("m", routed, held_out=held_but(routed), weights=weights) for _ in range(3625 * 2)]
    assert all(p is not None and not p.fallback and not p.probe for p in picks)
    got = Counter(p.node_id for p in picks if p)
    assert got == {"n0": 2000, "n1": 1250, "n2": 2000, "n3": 2000}
    seq = [p.node_id for p in picks if p]
    assert not any(x == y == "n1" for x, y in itertools.pairwise(seq))


def test_a_node_not_judged_yet_weighs_full_beside_weighted_ones() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n0", "n1"})            # n2 not routed and not held: 1.0
    picks = [b.pick("m", routed, held_out=frozenset({"n3", "n4"}), weights={"n1": 0.5}) for _ in range(2500)]
    assert Counter(p.node_id for p in picks if p) == {"n0": 1000, "n1": 500, "n2": 1000}


def test_new_weights_or_candidates_start_a_new_cycle() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n0", "n1"})
    held = held_but(routed)
    first = [b.pick("m", routed, held_out=held, weights={"n1": 0.5}).node_id for _ in range(3)]  # type: ignore[union-attr]
    assert first == ["n0", "n1", "n0"]
    # n1 now 0.25: a fresh cycle of 5 picks, 4 n0 and 1 n1.
    again = [b.pick("m", routed, held_out=held, weights={"n1": 0.25}).node_id for _ in range(5)]  # type: ignore[union-attr]
    assert Counter(again) == {"n0": 4, "n1": 1}


def test_retries_and_fallback_rotate_plainly_whatever_the_weights() -> None:
    b = Balancer(URLS, probe_share=0.0)
    routed = frozenset({"n0", "n1", "n2"})
    held = held_but(routed)
    weights = {"n1": 0.1}
    retries = [b.pick("m", routed, exclude=frozenset({"n2"}), held_out=held, weights=weights) for _ in range(4)]
    assert [p.node_id for p in retries if p] == ["n0", "n1", "n0", "n1"]
    fallback = [b.pick("m", None, weights=weights) for _ in range(len(URLS))]
    assert all(p is not None and p.fallback for p in fallback)
    assert sorted(p.node_id for p in fallback if p) == sorted(URLS)


@given(weights=st.dictionaries(st.sampled_from(sorted(URLS)), st.floats(0.001, 1.0)),
       routed=st.frozensets(st.sampled_from(sorted(URLS)), min_size=1))
def test_weighted_pick_never_returns_a_held_out_node(weights: dict[str, float], routed: frozenset[str]) -> None:
    b = Balancer(URLS, probe_share=0.0)
    held = held_but(routed)
    for _ in range(30):
        p = b.pick("m", routed, held_out=held, weights=weights)
        assert p is not None and p.node_id in routed and not p.fallback
