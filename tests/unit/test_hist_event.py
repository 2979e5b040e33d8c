"""The histogram form of the latency-event contract (docs/contracts.md): decode, refuse, pass on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import REASONS, decode, parse_event
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.window.accumulate import decode_many

GOOD: dict[str, Any] = {
    "type": "histogram", "node_id": "vllm-3", "model": "meta-llama/Llama-3.1-8B-Instruct",
    "hardware": "H100", "metric": "e2e", "ts": 1764680010.0, "interval_s": 10.0,
    "bounds_s": [0.3, 0.5, 0.8, 1.0], "counts": [12, 30, 5, 2, 0], "sum_s": 25.1,
    "requests": 49, "failed": 0, "instance": "vllm-3#0"}


def test_the_briefings_example_decodes() -> None:
    ev = decode(json.dumps(GOOD).encode())
    assert isinstance(ev, HistogramBatch)
    assert ev.key == ("vllm-3", "meta-llama/Llama-3.1-8B-Instruct")
    assert ev.bounds_s == (0.3, 0.5, 0.8, 1.0) and ev.counts == (12, 30, 5, 2, 0)
    assert ev.observations == 49 and ev.requests == 49 and ev.failed == 0
    assert (ev.metric, ev.ts, ev.interval_s, ev.sum_s) == ("e2e", 1764680010.0, 10.0, 25.1)
    assert (ev.hardware, ev.instance) == ("H100", "vllm-3#0")


def test_optional_fields_and_a_bucketless_mean() -> None:
    minimal = {k: GOOD[k] for k in ("type", "node_id", "model", "metric", "ts", "interval_s",
                                    "bounds_s", "counts")}
    ev = parse_event(minimal)
    assert isinstance(ev, HistogramBatch) and ev.sum_s is None and ev.requests is None
    mean = {**minimal, "bounds_s": [], "counts": [30], "sum_s": 1.5}
    ev = parse_event(mean)
    assert isinstance(ev, HistogramBatch) and ev.bounds_s == () and ev.counts == (30,)


@pytest.mark.parametrize(("change", "reason"), [
    ({"metric": "p99"}, "bad_metric"),
    ({"metric": None}, "missing_field"),
    ({"interval_s": 0}, "bad_interval"),
    ({"interval_s": "10"}, "bad_interval"),
    ({"interval_s": None}, "missing_field"),
    ({"bounds_s": [0.5, 0.3, 0.8, 1.0]}, "bad_histogram"),          # not ascending
    ({"bounds_s": [0.3, 0.3, 0.8, 1.0]}, "bad_histogram"),          # not strictly
    ({"bounds_s": [0.0, 0.5, 0.8, 1.0]}, "bad_histogram"),          # not > 0
    ({"bounds_s": [0.3, 0.5, 0.8, True]}, "bad_histogram"),         # a bool is no number
    ({"counts": [12, 30, 5, 2]}, "bad_histogram"),                  # +Inf bucket missing
    ({"counts": [12, 30, -5, 2, 0]}, "bad_histogram"),
    ({"counts": [12, 30, 5.5, 2, 0]}, "bad_histogram"),
    ({"counts": "12,30"}, "bad_histogram"),
    ({"bounds_s": None}, "missing_field"),
    ({"bounds_s": [float(i + 1) for i in range(300)], "counts": [0] * 301}, "too_long"),
    ({"sum_s": -1.0}, "bad_histogram"),
    ({"requests": 3, "failed": 4}, "bad_histogram"),
    ({"requests": 1.5}, "bad_histogram"),
    ({"bounds_s": [], "counts": [3], "sum_s": None}, "missing_field"),
    ({"node_id": "bad id"}, "bad_node_id"),
    ({"ts": 1764680010000.0}, "bad_ts"),
    ({"hardware": 3}, "bad_type"),
])
def test_a_bad_histogram_is_refused_with_its_reason(change: dict[str, Any], reason: str) -> None:
    assert reason in REASONS
    with pytest.raises(BadEvent) as info:
        decode(json.dumps({**GOOD, **change}).encode())
    assert info.value.reason == reason, str(info.value)


def test_a_bad_histogram_does_not_take_the_good_lines_around_it() -> None:
    good = json.dumps(GOOD).encode()
    bad = json.dumps({**GOOD, "counts": [1]}).encode()
    single = json.dumps({"node_id": "vllm-3", "model": "m", "latency_us": 1000, "ts": 1764680011.0}).encode()
    events, errors = decode_many([good, bad, single, good])
    assert [i for i, _ in errors] == [1] and errors[0][1].reason == "bad_histogram"
    assert sum(isinstance(e, HistogramBatch) for e in events) == 2
    assert sum(not isinstance(e, HistogramBatch) for e in events) == 1
