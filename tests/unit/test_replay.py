"""``tailguard replay``: event-time ticks, output format, errors and exit codes."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from app import replay_cli
from app.core import replay as core_replay
from app.core.config import DetectorSettings
from app.core.replay import replay
from app.core.types import HealthState, NodeStatus
from app.replay_cli import main

T0 = 1_764_680_000.0   # 20 s past a multiple of 30 (1764679980)


def lines(nodes: int = 5, seconds: float = 600.0, rate: float = 20.0, *, slow: str | None = None,
          onset: float = 300.0, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(int(seconds * rate)):
        ts = T0 + k / rate
        for i in range(nodes):
            lat = 100_000.0 * float(np.exp(rng.normal(0, 0.3)))
            if f"n{i}" == slow and ts >= T0 + onset:
                lat *= 3.0
            out.append(json.dumps({"node_id": f"n{i}", "model": "m", "latency_us": lat,
                                   "ts": ts}).encode())
    return out


def run(ls: list[bytes], **settings: object) -> tuple[list[dict[str, object]], core_replay.ReplayStats]:
    out: list[str] = []
    _, stats = replay(ls, DetectorSettings().replace(**settings), out.append)
    return [json.loads(x) for x in out], stats


def test_ticks_are_at_multiples_of_the_interval_including_empty_ones() -> None:
    ls = [json.dumps({"type": "heartbeat", "node_id": "a", "model": "m", "ts": T0}).encode(),
          json.dumps({"type": "heartbeat", "node_id": "a", "model": "m", "ts": T0 + 200}).encode()]
    recs, stats = run(ls)
    # boundaries 1764680010 … 1764680190 (7 crossed), then the final one after the last event
    assert stats.ticks == 8
    # heartbeats are no evidence: the node stays warming, out of routing (admission by evidence)
    assert [r["ts"] for r in recs] == [T0 + 10]
    assert [(r["from"], r["to"], r["routed"]) for r in recs] == [("unknown", "warming", False)]


def test_output_keys_and_types() -> None:
    recs, stats = run(lines(slow="n2"))
    assert stats.events == 5 * 12_000 and not stats.bad
    out = [r for r in recs if r["type"] == "transition" and r["routed"] is False
           and r["to"] != "warming"]
    assert out and out[0]["node_id"] == "n2"
    for r in recs:
        assert {"ts", "node_id", "model", "from", "to", "routed", "reason", "event_id"} <= r.keys()
        assert float(r["ts"]) % 30.0 == 0.0        # type: ignore[arg-type]
    assert out[0]["ts"] - (T0 + 300) <= 120     # type: ignore[operator]


def test_slightly_out_of_order_events_give_the_same_verdicts() -> None:
    ordered = lines(slow="n1", seed=3)
    rng = np.random.default_rng(1)
    shuffled = list(ordered)
    for i in range(0, len(shuffled) - 20, 20):         # local disorder within ~0.2 s
        block = shuffled[i:i + 20]
        rng.shuffle(block)
        shuffled[i:i + 20] = block
    a, _ = run(ordered)
    b, _ = run(shuffled)
    key = [(r["ts"], r["node_id"], r["to"]) for r in a]
    assert key == [(r["ts"], r["node_id"], r["to"]) for r in b]


def test_late_events_still_join_the_window() -> None:
    ls = lines(nodes=3, seconds=100)
    late = json.dumps({"node_id": "late", "model": "m", "latency_us": 5.0, "ts": T0 + 1}).encode()
    _, stats = run([*ls, late])
    assert stats.events == len(ls) + 1 and not stats.bad


def test_bad_lines_are_counted_with_line_numbers() -> None:
    ls = lines(nodes=2, seconds=10)
    ls[3:3] = [b"{", b"[]", b'{"node_id": "a", "model": "m", "latency_us": 0, "ts": 1}', b"  "]
    _recs, stats = run(ls)
    assert stats.bad == {"bad_json": 1, "not_object": 1, "bad_latency": 1}
    assert [ln for ln, _, _ in stats.first_bad] == [4, 5, 6]
    assert "3 bad lines skipped" in stats.summary() and "line 4 bad_json" in stats.summary()


def test_a_far_future_timestamp_does_not_run_forever() -> None:
    ls = lines(nodes=3, seconds=60)
    for i in range(3):   # a confirmed jump (several lines), not one skewed clock
        ls.append(json.dumps({"node_id": "n0", "model": "m", "latency_us": 9.0,
                              "ts": T0 + 3e9 + i}).encode())      # ~95 years later
    _recs, stats = run(ls)
    assert stats.skipped_ticks > 1_000_000 and stats.ticks < 100
    assert stats.last_ts == T0 + 3e9 + 2
    assert not stats.bad


def test_blank_lines_between_the_lines_of_a_jump_neither_count_nor_break_it() -> None:
    ls = lines(nodes=3, seconds=60)
    for i in range(3):
        ls += [b"\n", b" \t ", json.dumps({"node_id": "n0", "model": "m", "latency_us": 9.0,
                                           "ts": T0 + 3e9 + i}).encode()]
    _recs, stats = run([*ls, b""])
    assert stats.last_ts == T0 + 3e9 + 2 and stats.events == 3 * 60 * 20 + 3
    assert not stats.bad


def test_one_skewed_timestamp_is_rejected_and_does_not_blind_the_replay() -> None:
    clean = lines(nodes=6, seconds=600, slow="n1", onset=200.0, seed=7)
    skewed = list(clean)
    d = json.loads(skewed[3000])
    d["ts"] += 3600.0                                  # one event from a clock an hour ahead
    skewed.insert(3001, json.dumps(d).encode())
    ref, _ = run(clean)
    got, stats = run(skewed)
    assert stats.bad == {"future_ts": 1}
    assert [(r["ts"], r["node_id"], r["to"]) for r in got] == \
        [(r["ts"], r["node_id"], r["to"]) for r in ref]
    assert any(r["node_id"] == "n1" and r["routed"] is False for r in got)


@pytest.mark.parametrize("ts", [1e300, (T0 + 100.0) * 1000.0])
def test_absurd_or_millisecond_timestamps_are_bad_input(ts: float) -> None:
    ls = lines(nodes=3, seconds=60)
    ls += [json.dumps({"node_id": "n0", "model": "m", "latency_us": 9.0, "ts": ts}).encode()] * 4
    _recs, stats = run(ls)
    assert stats.bad == {"bad_ts": 4}
    assert stats.last_ts is not None and stats.last_ts < T0 + 100


def test_quiet_gap_skipping_changes_no_output() -> None:
    a = lines(nodes=4, seconds=400, slow="n1", onset=200.0, seed=4)
    gap = [json.loads(x) for x in lines(nodes=4, seconds=400, seed=5)]
    for d in gap:
        d["ts"] += 5000.0
    b = a + [json.dumps(d).encode() for d in gap]
    full, stats = run(b)
    assert stats.skipped_ticks > 0
    # the same with every boundary evaluated (skipping disabled by a huge age bound)
    ref, ref_stats = run(b, max_sample_age_s=86_400.0)
    assert ref_stats.skipped_ticks == 0
    assert [(r["ts"], r["node_id"], r["to"]) for r in full if r["ts"] < T0 + 400] == \
        [(r["ts"], r["node_id"], r["to"]) for r in ref if r["ts"] < T0 + 400]


# ---- the command ----------------------------------------------------------------------


def test_main_reads_a_file_and_writes_json_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                 ) -> None:
    f = tmp_path / "trace.jsonl"
    f.write_bytes(b"\n".join(lines(slow="n4")) + b"\nnot json\n")
    assert main([str(f), "--summary"]) == 0
    out, err = capsys.readouterr()
    recs = [json.loads(x) for x in out.splitlines()]
    assert any(r["node_id"] == "n4" and r["routed"] is False for r in recs)
    assert "1 bad lines skipped (bad_json: 1)" in err
    assert "n4" in err and "quarantined" in err            # the --summary table


def test_main_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = b"\n".join(lines(nodes=3, seconds=200))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["-"]) == 0
    out, _ = capsys.readouterr()
    assert len(out.splitlines()) == 6          # first_seen + warmup_done for 3 nodes


def test_set_overrides_change_the_detector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"\n".join(lines(nodes=3, seconds=100)))
    assert main([str(f), "--set", "tick_interval_s=10", "--set", "warmup_s=0"]) == 0
    out, _ = capsys.readouterr()
    recs = [json.loads(x) for x in out.splitlines()]
    assert recs[0]["ts"] == T0 + 10 and recs[0]["to"] == "warming"
    admitted = [r for r in recs if r["node_id"] == recs[0]["node_id"] and r["to"] == "healthy"]
    assert admitted[0]["ts"] == T0 + 10 and admitted[0]["reason"] == "admitted"


@pytest.mark.parametrize(
    ("arg", "needle"),
    [("nope=1", "--set nope"), ("window_size=abc", "--set window_size"),
     ("ratio_threshold=0.5", "ratio_threshold"), ("signal=fast", "one of auto"), ("novalue", "KEY=VALUE")],
)
def test_bad_set_exits_2_naming_the_key(arg: str, needle: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"")
    assert main([str(f), "--set", arg]) == 2
    assert needle in capsys.readouterr().err


def test_unreadable_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "cannot read" in err and "missing.jsonl" in err
    assert main([str(tmp_path)]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_empty_file_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_bytes(b"")
    assert main([str(f)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "0 events" in err


def test_progress_lines_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_replay, "PROGRESS_EVERY_LINES", 1000)
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"\n".join(lines(nodes=2, seconds=100)))
    assert main([str(f), "--progress"]) == 0
    assert capsys.readouterr().err.count("replay: ") == 4 + 1


def test_cli_dispatch_knows_replay() -> None:
    from app.cli import COMMANDS

    assert COMMANDS["replay"][0] == "app.replay_cli"


def test_main_reads_a_gzip_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip
    data = b"\n".join(lines(slow="n4")) + b"\n"
    (tmp_path / "t.jsonl").write_bytes(data)
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress(data))
    assert main([str(tmp_path / "t.jsonl")]) == 0
    plain = capsys.readouterr().out
    assert main([str(tmp_path / "t.jsonl.gz")]) == 0
    assert capsys.readouterr().out == plain and '"routed": false' in plain


class _Statuses:
    def __init__(self, *statuses: NodeStatus) -> None:
        self._s = list(statuses)

    def statuses(self) -> list[NodeStatus]:
        return self._s


def _status(node: str, signal: str, p50: float, p99: float) -> NodeStatus:
    return NodeStatus(node_id=node, model="m", state=HealthState.HEALTHY, routed=True,
                      since_ts=100.0, reason="normal", p50=p50, p99=p99, ratio=p99 / p50,
                      samples=1000, latency_p50_us=200000.0, latency_p99_us=920000.0,
                      signal=signal)


def test_summary_table_labels_the_signal_with_units_beside_raw_latency() -> None:
    text = replay_cli._status_table(_Statuses(_status("n1", "tpot", 40.0, 48.0)))  # type: ignore[arg-type]
    head, row = (line.split("  ") for line in text.splitlines())
    cols = dict(zip([h.strip() for h in head if h], [c.strip() for c in row if c], strict=True))
    assert cols["signal"] == "tpot"
    assert (cols["signal p50 (µs/token)"], cols["signal p99 (µs/token)"]) == ("40.0", "48.0")
    assert cols["signal p99/p50"] == "1.20"
    assert (cols["p50 µs"], cols["p99 µs"], cols["p99/p50"]) == ("200000", "920000", "4.60")


def test_summary_table_with_mixed_signals_puts_the_unit_in_each_row() -> None:
    text = replay_cli._status_table(_Statuses(  # type: ignore[arg-type]
        _status("n1", "latency", 200000.0, 920000.0), _status("n2", "normalized", 1.0, 2.5)))
    head, *rows = text.splitlines()
    assert "signal p50  " in head and "(µs" not in head
    assert "latency (µs)" in rows[0] and "normalized (× expected)" in rows[1] and "2.50" in rows[1]
