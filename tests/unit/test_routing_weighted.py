"""Routing weights on the read side: parsing the hash, and nginx's smooth weighted round-robin."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.routing.weighted import SmoothWeighted, all_full, parse_weight, parse_weights, weight_units


@pytest.mark.parametrize(("raw", "expected"), [
    (b"0.625", 0.625), ("1", 1.0), ("1.0", 1.0), (b"0.1", 0.1), ("1e-3", 0.001),
    (b"0", None), ("-0.5", None), ("1.01", None), ("nan", None), ("inf", None), (b"", None),
    ("heavy", None), (b"\xff", None),
])
def test_parse_weight_accepts_only_numbers_in_0_1(raw: bytes | str, expected: float | None) -> None:
    assert parse_weight(raw) == expected


def test_parse_weights_names_bad_fields_and_keeps_good_ones() -> None:
    weights, bad = parse_weights({b"a": b"0.5", b"b": b"2", b"c": b"1", b"d": b"x"})
    assert weights == {"a": 0.5, "c": 1.0}
    assert bad == ["b", "d"]


def test_nginx_example_sequence() -> None:
    # nginx's ngx_http_upstream_round_robin.c comment: weights 5, 1, 1 give a a b a c a a.
    swrr = SmoothWeighted(["a", "b", "c"], {"a": 1.0, "b": 0.2, "c": 0.2})
    assert [swrr.next() for _ in range(14)] == list("aabacaa") * 2


def test_equal_weights_are_plain_rotation_in_the_given_order() -> None:
    swrr = SmoothWeighted(["n2", "n0", "n1"], {"n0": 0.5, "n1": 0.5, "n2": 0.5})
    assert [swrr.next() for _ in range(6)] == ["n2", "n0", "n1"] * 2


@given(st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]),
                       st.floats(min_value=0.001, max_value=1.0), min_size=1),
       st.integers(min_value=1, max_value=3))
def test_each_cycle_gives_every_node_exactly_its_units(weights: dict[str, float], cycles: int) -> None:
    nodes = sorted(weights)
    swrr = SmoothWeighted(nodes, weights)
    total = sum(swrr.units)
    got = Counter(swrr.next() for _ in range(total * cycles))
    assert got == {n: weight_units(weights[n]) * cycles for n in nodes}


def test_picks_are_spread_not_bursts() -> None:
    # A node of weight 0.5 among 1.0s never gets two picks in a row.
    swrr = SmoothWeighted(["a", "b", "c", "d"], {"c": 0.5})
    seq = [swrr.next() for _ in range(700)]
    assert not any(x == y == "c" for x, y in itertools.pairwise(seq))
    assert Counter(seq)["c"] == 100


def test_absent_weights_count_as_full_and_all_full() -> None:
    swrr = SmoothWeighted(["a", "b"], {"b": 0.25})
    assert swrr.units == (1000, 250)
    assert all_full(["a", "b"], {}) and all_full(["a"], {"b": 0.25})
    assert not all_full(["a", "b"], {"b": 0.25})
    with pytest.raises(ValueError, match="at least one node"):
        SmoothWeighted([], {})
