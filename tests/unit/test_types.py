"""The health-change event's numbers (tailguard.core.contract.types.Transition.to_event)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.core.contract.types import HealthState, Transition, p99_p50_ratio

CONTRACT_KEYS = {"event_id", "ts", "node_id", "model", "from", "to", "routed", "reason",
                 "p50_us", "p99_us", "ratio", "samples"}
positive = st.floats(min_value=1.0, max_value=1e8, allow_nan=False)
maybe = st.one_of(st.none(), positive)


def transition(**kw: object) -> Transition:
    base: dict[str, object] = dict(ts=1764680030.0, node_id="gpu-node-07", model="llama-3-70b",
                                   from_state=HealthState.SUSPECT, to_state=HealthState.UNHEALTHY,
                                   routed=False, reason="p99_p50_ratio")
    base.update(kw)
    return Transition(**base)  # type: ignore[arg-type]


def test_ratio_is_raw_latency_as_in_the_contract_example() -> None:
    # An LLM node judged on tpot: the signal's ratio (1.2) is not the raw one (4.6).
    ev = transition(signal="tpot", p50=40.0, p99=48.0, ratio=1.2, samples=1000,
                    latency_p50_us=200000.0, latency_p99_us=920000.0).to_event()
    assert ev["ratio"] == pytest.approx(4.6)
    assert ev["signal_ratio"] == 1.2 and (ev["signal_p50"], ev["signal_p99"]) == (40.0, 48.0)
    example = transition(latency_p50_us=180000, latency_p99_us=910000).to_event()
    assert round(example["ratio"], 2) == 5.06 and example.keys() >= CONTRACT_KEYS


@given(p50=maybe, p99=maybe, signal_ratio=st.one_of(st.none(), st.floats(0.5, 50.0)))
def test_ratio_consistent_with_p50_us_p99_us(p50: float | None, p99: float | None,
                                             signal_ratio: float | None) -> None:
    ev = transition(ratio=signal_ratio, latency_p50_us=p50, latency_p99_us=p99).to_event()
    if p50 is None or p99 is None:
        assert ev["ratio"] is None
    else:
        assert ev["ratio"] == pytest.approx(ev["p99_us"] / ev["p50_us"])
    assert ev["signal_ratio"] == signal_ratio
    json.dumps(ev, allow_nan=False)


@pytest.mark.parametrize(("p50", "p99"), [(0.0, 5.0), (-1.0, 5.0), (math.nan, 5.0), (5.0, math.inf)])
def test_no_ratio_from_unusable_numbers(p50: float, p99: float) -> None:
    assert p99_p50_ratio(p50, p99) is None


def test_event_id_names_the_change_not_the_tick_that_derived_it() -> None:
    first = transition(ts=1000.0, from_since_ts=940.0)
    assert transition(ts=1030.0, from_since_ts=940.0).event_id == first.event_id
    assert transition(ts=1000.0, from_since_ts=970.0).event_id != first.event_id
    assert transition(ts=1000.0, from_since_ts=940.0, to_state=HealthState.HEALTHY).event_id != first.event_id
    # without the state's start, the tick time names it (operator announcements)
    assert transition(ts=1000.0).event_id != transition(ts=1030.0).event_id
