"""``tailguard status``: the table, the JSON shape, and the unreachable-Redis message."""

from __future__ import annotations

import io
import socket

import pytest

from tailguard.routing import status
from tailguard.routing.status import ModelStatus, format_table

NOW = 10_000.0


def sample() -> ModelStatus:
    return ModelStatus(
        model="llama-3-70b",
        version=4,
        routing=frozenset({"gpu-1", "gpu-3"}),
        quarantine={"gpu-2": NOW + 90},
        nodes={
            "gpu-1": {"state": "healthy", "since": NOW - 3725, "reason": "normal",
                      "p50_us": 180000, "p99_us": 410500, "ratio": 2.2805, "samples": 1000},
            # Written by a version whose "ratio" was the signal's: the table shows the raw one.
            "gpu-2": {"state": "quarantined", "since": NOW - 30, "reason": "quarantine",
                      "p50_us": 181000, "p99_us": 910000, "ratio": 1.2, "samples": 990},
        },
    )


def test_table_has_one_row_per_node_with_routing_from_the_set() -> None:
    text = format_table([sample()], NOW)
    lines = text.splitlines()
    assert lines[0] == "model llama-3-70b  version 4  routed 2/3  quarantined 1"
    assert lines[1].split() == ["node", "state", "routed", "p50", "ms", "p99", "ms", "p99/p50",
                                "samples", "since", "probe", "in", "reason"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["gpu-1"] == ["gpu-1", "healthy", "yes", "180.0", "410.5", "2.28", "1000",
                             "1h02m", "-", "normal"]
    assert rows["gpu-2"] == ["gpu-2", "quarantined", "no", "181.0", "910.0", "5.03", "990",
                             "30s", "1m30s", "quarantine"]
    # In the routing set but without a status (e.g. written by an older tailguard).
    assert rows["gpu-3"] == ["gpu-3", "?", "yes", "-", "-", "-", "-", "-", "-", "-"]


def test_the_title_says_when_the_worker_last_wrote_and_flags_a_stale_table() -> None:
    ms = sample()
    ms.nodes["gpu-1"]["updated"] = NOW - 12
    ms.nodes["gpu-2"]["updated"] = NOW - 40
    assert format_table([ms], NOW, 90.0).splitlines()[0].endswith("  written 12s ago")
    stale = format_table([ms], NOW + 200, 90.0).splitlines()[0]
    assert stale.endswith("written 3m32s ago (stale: is tailguard worker running?)")


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (59.9, "59s"), (60, "1m00s"), (3599, "59m59s"), (3600, "1h00m"),
    (86399, "23h59m"), (90000, "1d01h"), (-5, "0s"),
])
def test_age(seconds: float, text: str) -> None:
    assert status._age(seconds) == text


def test_json_marks_set_membership() -> None:
    d = sample().to_dict()
    assert d["routing"] == ["gpu-1", "gpu-3"]
    assert d["nodes"]["gpu-2"]["in_routing_set"] is False
    assert d["nodes"]["gpu-3"] == {"in_routing_set": True}
    assert d["quarantine"] == {"gpu-2": NOW + 90}


def test_unreachable_redis_exits_1_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TAILGUARD_REDIS_URL", f"redis://u:secret@127.0.0.1:{port}/0")
    out, err = io.StringIO(), io.StringIO()
    assert status.main([], out=out, err=err) == 1
    assert "TAILGUARD_REDIS_URL" in err.getvalue() and str(port) in err.getvalue()
    # The message names the URL with its password redacted.
    assert "secret" not in err.getvalue() and f"u:***@127.0.0.1:{port}" in err.getvalue()
    assert out.getvalue() == ""


def test_the_title_names_the_model_s_signal_and_when_a_worker_chose_it_alone() -> None:
    ms = sample()
    ms.nodes["gpu-1"]["signal"] = ms.nodes["gpu-2"]["signal"] = "latency"
    assert format_table([ms], NOW).splitlines()[0].endswith("quarantined 1  signal latency")
    ms.nodes["gpu-2"].update(signal="tpot", signal_local=True)
    assert format_table([ms], NOW).splitlines()[0].endswith(
        "signal latency/tpot (chosen per worker: no stage-2 choice yet)")
