"""``tailguard replay``: event-time ticks, output format, errors and exit codes."""

from __future__ import annotations

import copy
import io
import json
import math
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailguard import replay_cli
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.events import Heartbeat, SampleBatch
from tailguard.core.contract.types import HealthState, NodeStatus, TickResult
from tailguard.core.replay import replay as core_replay
from tailguard.core.replay.detector import Detector
from tailguard.core.replay.replay import replay
from tailguard.core.window.accumulate import Accumulator
from tailguard.replay_cli import main

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
    for i in range(3):   # a confirmed jump (several nodes' lines), not one skewed clock
        ls.append(json.dumps({"node_id": f"n{i}", "model": "m", "latency_us": 9.0,
                              "ts": T0 + 3e9 + i}).encode())      # ~95 years later
    _recs, stats = run(ls)
    assert stats.skipped_ticks > 1_000_000 and stats.ticks < 100
    assert stats.last_ts == T0 + 3e9 + 2
    assert not stats.bad


def test_blank_lines_between_the_lines_of_a_jump_neither_count_nor_break_it() -> None:
    ls = lines(nodes=3, seconds=60)
    for i in range(3):
        ls += [b"\n", b" \t ", json.dumps({"node_id": f"n{i}", "model": "m", "latency_us": 9.0,
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
    from tailguard.cli import COMMANDS

    assert COMMANDS["replay"][0] == "tailguard.replay_cli"


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


# ---- the chunked path against the line-by-line one -----------------------------------

class _Recording(Detector):
    """A detector that records what it is fed and when it is asked, in order."""

    def __init__(self, settings: DetectorSettings) -> None:
        super().__init__(settings)
        self.fed: list[object] = []

    def observe(self, events: Iterable[SampleBatch | Heartbeat]) -> None:
        events = list(events)
        self.fed.append([(type(e).__name__, e.node_id, e.model, e.hardware, e.instance, e.ts)
                         if isinstance(e, Heartbeat) else
                         (e.node_id, e.model, e.hardware, e.instance, e.ts.tolist(),
                          e.latency_us.tolist(), e.ok.tolist(), e.probe.tolist(),
                          *(None if c is None else np.nan_to_num(c, nan=-1.0).tolist()
                            for c in (e.input_tokens, e.output_tokens, e.ttft_us)),
                          e.rejected, e.parts) for e in events])
        super().observe(events)

    def evaluate(self, now_s: float, **kw: Any) -> TickResult:
        self.fed.append(now_s)
        return super().evaluate(now_s, **kw)


def _replayed(ls: Iterable[bytes | str], settings: DetectorSettings, chunk_lines: int,
              progress_every: int | None = None,
              ) -> tuple[list[str], list[core_replay.ReplayStats], object, str, list[object]]:
    """Everything replay() gives: output lines, the stats at each progress call (every
    ``progress_every`` lines; None: no progress callback), the final stats (every bad line
    in first_bad) and the detector's statuses, or the exception it raised (a held line that
    turns out bad for another reason when a jump is taken raises, on main too); and what
    the detector was fed, in order."""
    out: list[str] = []
    seen: list[core_replay.ReplayStats] = []
    every = progress_every or core_replay.PROGRESS_EVERY_LINES
    det = _Recording(settings)
    try:
        with mock.patch.object(core_replay, "PROGRESS_EVERY_LINES", every), \
                mock.patch.object(core_replay, "FIRST_BAD_LINES", 10**9):
            _, stats = replay(ls, settings, out.append, chunk_lines=chunk_lines, detector=det,
                              progress=None if progress_every is None
                              else lambda st: seen.append(copy.deepcopy(st)))
    except Exception as e:   # compared, not hidden
        return out, seen, repr(e), "", det.fed
    return out, seen, stats, repr(det.statuses()), det.fed


KINDS = (["plain"] * 12 + ["late"] * 3
         + ["probe", "failed", "sized", "bad_ttft", "typed", "unknown_key", "heartbeat", "batch",
            "batch_some_bad", "batch_all_bad", "binary", "bad_json", "not_object", "no_model",
            "bad_latency", "too_slow", "slowest", "bad_id", "blank", "future", "jump", "gap",
            "on_tick", "crlf", "spaced", "new_instance", "ms_ts", "ahead", "ahead_jump"])


def _trace(kinds: list[str], seed: int) -> list[bytes | str]:
    """A trace of the given line kinds: 6 nodes x 2 models (n5 slow after a while),
    slightly out of order, with every kind of odd line the contract knows."""
    from tailguard.core.contract import binary
    rng = np.random.default_rng(seed)
    t = T0
    out: list[bytes | str] = []

    def ev(node: int | None = None, **extra: object) -> dict[str, object]:
        i = int(rng.integers(0, 6)) if node is None else node
        lat = 1e4 * float(np.exp(rng.normal(0, 0.3))) * (4.0 if i == 5 and t > T0 + 40 else 1.0)
        d: dict[str, object] = {"node_id": f"n{i}", "model": f"m{i % 2}", "latency_us": lat,
                                "ts": t, "hardware": "A100" if i % 3 else None}
        d.update(extra)
        return d

    def dump(d: object) -> bytes:
        return orjson.dumps(d) if rng.uniform() < 0.5 else json.dumps(d).encode()

    for kind in kinds:
        t += float(rng.uniform(0.0, 0.4))
        if kind == "plain":
            out.append(dump(ev()))
        elif kind == "late":
            out.append(dump(ev(ts=t - float(rng.uniform(0.5, 5.0)))))
        elif kind == "probe":
            out.append(dump(ev(probe=True)))
        elif kind == "failed":
            out.append(dump(ev(ok=False)))
        elif kind == "sized":
            d = ev(input_tokens=int(rng.integers(1, 999)), output_tokens=int(rng.integers(1, 99)))
            d["ttft_us"] = float(d["latency_us"]) / 3       # type: ignore[arg-type]
            out.append(dump(d))
        elif kind == "bad_ttft":
            d = ev()
            d["ttft_us"] = float(d["latency_us"]) * 2       # type: ignore[arg-type]
            out.append(dump(d))
        elif kind == "typed":
            out.append(dump(ev(type="single")))
        elif kind == "unknown_key":
            out.append(dump(ev(request_id="r-1", samples=None)))
        elif kind == "heartbeat":
            out.append(dump({"type": "heartbeat", "node_id": "n1", "model": "m1", "ts": t}))
        elif kind.startswith("batch"):
            samples: list[list[float | None]] = [[t - 0.1 * j, 1e4 + j] for j in range(4)]
            if kind == "batch_some_bad":
                samples[1] = [t, -5.0]
            elif kind == "batch_all_bad":
                samples = [[t, 0.0]]
            else:
                samples.append([t, 2e4, 10, None, 5e3])
            out.append(dump({"node_id": "n2", "model": "m0", "samples": samples}))
        elif kind == "binary":
            out.append(binary.encode("n3", "m1", None, np.array([t - 0.2, t]), np.array([1e4, 2e4])))
        elif kind == "bad_json":
            out.append(b'{"node_id": "n0", "model"')
        elif kind == "not_object":
            out.append(b"[1, 2]")
        elif kind == "no_model":
            out.append(b'{"node_id": "gpu-x", "latency_us": -1}')
        elif kind == "bad_latency":
            out.append(dump(ev(latency_us=0)))
        elif kind == "too_slow":
            out.append(dump(ev(latency_us=SMALL.max_latency_us * float(rng.choice([1.01, 1e3])))))
        elif kind == "slowest":
            out.append(dump(ev(latency_us=SMALL.max_latency_us)))
        elif kind == "bad_id":
            out.append(dump(ev(node_id="n|0")))
        elif kind == "blank":
            out.append([b"", b"\n", b"  \t"][int(rng.integers(0, 3))])
        elif kind == "future":            # one skewed clock (a future_ts line, or two)
            for _ in range(int(rng.integers(1, 3))):
                out.append(dump(ev(ts=t + 30.0 + float(rng.uniform(0, 600)))))
        elif kind == "jump":              # a real gap: enough far lines in a row
            t += 200.0
            for _ in range(core_replay.JUMP_CONFIRM_LINES):
                out.append(dump(ev()))
        elif kind == "gap":               # quiet ticks to skip
            t += 60.0
        elif kind == "on_tick":           # exactly on a boundary of SMALL's ticks
            out.append(dump(ev(ts=math.ceil(t / SMALL.tick_interval_s) * SMALL.tick_interval_s)))
        elif kind == "crlf":
            out.append(dump(ev()) + b"\r\n")
        elif kind == "spaced":
            out.append(b"  " + dump(ev()) + b" \n")
        elif kind == "new_instance":
            out.append(dump(ev(instance=f"pid-{int(rng.integers(0, 2))}")))
        elif kind == "ms_ts":
            out.append(dump(ev(ts=t * 1000)))
        elif kind == "ahead":             # n4's clock ahead: beyond 2 ticks, within AHEAD's skew
            for _ in range(int(rng.integers(1, 4))):
                out.append(dump(ev(4, ts=t + 12.0 + float(rng.uniform(0, 2)))))
        elif kind == "ahead_jump":        # a gap shorter than the skew bound: early lines taken
            t += 12.0
            for _ in range(core_replay.JUMP_CONFIRM_LINES + int(rng.integers(-3, 3))):
                out.append(dump(ev()))
    return out


SMALL = DetectorSettings(tick_interval_s=2.0, min_samples=5, warmup_s=4.0, max_sample_age_s=20.0,
                         max_future_skew_s=3.0, probe_min_samples=2)
# Lines more than AHEAD_TICKS ticks ahead of the fleet and within the skew bound: early lines.
AHEAD = SMALL.replace(max_future_skew_s=30.0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 80)), min_size=1, max_size=30),
       seed=st.integers(0, 2**16), chunk_lines=st.sampled_from([2, 3, 5, 16, 64, 150]),
       progress_every=st.sampled_from([None, None, 1, 7, 100]),
       as_str=st.sampled_from([None, None, None, 0, 5, 70]), skew=st.sampled_from([SMALL, AHEAD]))
def test_chunked_replay_is_the_line_by_line_replay(runs: list[tuple[str, int]], seed: int,
                                                   chunk_lines: int, progress_every: int | None,
                                                   as_str: int | None, skew: DetectorSettings) -> None:
    # Runs of one kind: long ones of plain lines, up to 4 of any other kind in a row.
    ls = _trace([kind for kind, n in runs
                 for _ in range(n if kind in ("plain", "late") else 1 + n % 4)], seed)
    if as_str is not None and as_str < len(ls):      # a str line: its chunk goes line by line
        raw = ls[as_str]
        ls[as_str] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    ref = _replayed(ls, skew, 1, progress_every)
    assert _replayed(ls, skew, chunk_lines, progress_every) == ref


@pytest.mark.parametrize("kinds", [
    ["plain"] * 30 + ["future"] + ["plain"] * 3 + ["no_model"] + ["plain"] * 10,   # held, then a run
    ["plain"] * 30 + ["future", "future"] + ["plain"] * 3 + ["blank", "bad_id", "plain"],
    ["plain"] * 30 + ["gap"] + ["plain"] * 2 + ["bad_json"] + ["plain"] * 5,      # a gap: held lines
    ["plain"] * 30 + ["future"] + ["plain"] * 3,                                  # ends after a run
    ["plain"] * 30 + ["on_tick", "plain", "late", "on_tick"] * 5,
    ["plain"] * 12 + ["jump"] + ["late", "plain"] * 8,
])
@pytest.mark.parametrize("chunk_lines", [2, 4, 9, 64])
def test_chunked_replay_around_held_lines_and_boundaries(kinds: list[str], chunk_lines: int) -> None:
    for seed in range(4):
        ls = _trace(kinds, seed)
        assert _replayed(ls, SMALL, chunk_lines) == _replayed(ls, SMALL, 1)


@pytest.mark.parametrize("kinds", [
    ["plain"] * 40 + ["ahead", "plain"] * 30,                         # n4 ahead throughout
    ["plain"] * 40 + ["ahead"] * 3 + ["heartbeat", "batch", "bad_json", "binary", "plain"] * 4,
    ["plain"] * 40 + ["ahead_jump"] + ["plain"] * 10,                 # a jump within the bound
    ["plain"] * 40 + ["ahead", "ahead_jump", "future", "heartbeat"] + ["plain"] * 10,
    ["plain"] * 40 + ["ahead"] * 4,                                   # the trace ends early
])
@pytest.mark.parametrize("chunk_lines", [2, 5, 64])
def test_chunked_replay_around_early_lines(kinds: list[str], chunk_lines: int) -> None:
    for seed in range(4):
        ls = _trace(kinds, seed)
        assert _replayed(ls, AHEAD, chunk_lines) == _replayed(ls, AHEAD, 1)


def test_chunked_replay_of_a_long_trace_takes_the_fast_path_and_changes_nothing() -> None:
    kinds = ["plain"] * 20 + ["late"] * 5 + ["no_model", "sized", "probe", "blank", "heartbeat"]
    rng = np.random.default_rng(11)
    ls = _trace([kinds[i] for i in rng.integers(0, len(kinds), 30_000)], 11)
    added = 0
    add_decoded = Accumulator.add_decoded

    def counting(self: Accumulator, *args: Any) -> tuple[int, float]:
        nonlocal added
        i, latest = add_decoded(self, *args)
        added += i - args[1]
        return i, latest

    ref = _replayed(ls, SMALL, 1, 1000)
    assert added == 0
    with mock.patch.object(Accumulator, "add_decoded", counting):
        got = _replayed(ls, SMALL, core_replay.CHUNK_LINES, 1000)
    assert got == ref
    _, seen, stats, _, _ = got
    assert isinstance(stats, core_replay.ReplayStats)
    assert len(seen) > 25 and stats.transitions > 10 and stats.bad and stats.ticks > 100
    assert added > 0.7 * stats.events        # the comparison is of the fast path (not ticks, odd lines)


def test_a_read_error_comes_after_the_lines_read_before_it() -> None:
    ls = _trace(["plain"] * 3000, 5)

    def failing() -> Iterator[bytes | str]:
        yield from ls
        raise OSError("disk")

    for chunk_lines in (1, 64, core_replay.CHUNK_LINES):
        out: list[str] = []
        with pytest.raises(OSError, match="disk"):
            replay(failing(), SMALL, out.append, chunk_lines=chunk_lines)
        assert out == _replayed(ls[:3000], SMALL, 1)[0][:len(out)] and out
        if chunk_lines == 1:
            first = out
        assert out == first


def _jumps(at: float, n: int, *, step_s: float = 5000.0, **extra: object) -> list[bytes]:
    """``n`` lines of n0, n1, n2, …, each ``step_s`` past the one before: every one of them is
    in the future of the last, also after the one before it is taken."""
    return [json.dumps({"node_id": f"n{i % 3}", "model": "m", "latency_us": 9.0,
                        "ts": at + step_s * (i + 1), **extra}).encode() for i in range(n)]


@pytest.mark.parametrize("tail", [0, 1], ids=["at_the_end", "followed_by_more"])
def test_held_lines_that_jump_again_among_themselves_are_taken(tail: int) -> None:
    n_held = core_replay.JUMP_CONFIRM_LINES - 1 if tail == 0 else core_replay.JUMP_CONFIRM_LINES
    ls = lines(nodes=3, seconds=60) + _jumps(T0 + 60.0, n_held)
    last = T0 + 60.0 + 5000.0 * n_held
    if tail:
        ls.append(json.dumps({"node_id": "n1", "model": "m", "latency_us": 9.0,
                              "ts": last + 1.0}).encode())
    _recs, stats = run(ls)
    assert not stats.bad
    assert stats.events == 3 * 60 * 20 + n_held + tail
    assert stats.last_ts == last + tail


def test_a_held_line_with_another_defect_is_counted_bad_not_a_crash() -> None:
    ls = lines(nodes=3, seconds=60) + _jumps(T0 + 60.0, core_replay.JUMP_CONFIRM_LINES - 1)
    ls += _jumps(T0 + 60.0 + 5000.0 * core_replay.JUMP_CONFIRM_LINES, 1, latency_us=-1.0)
    _recs, stats = run(ls)
    assert sum(stats.bad.values()) == 1 and "future_ts" not in stats.bad
    assert stats.events == 3 * 60 * 20 + core_replay.JUMP_CONFIRM_LINES - 1


def test_a_held_line_bad_only_once_taken_is_counted_bad() -> None:
    ls = [json.dumps({"node_id": "n1", "model": "m", "latency_us": 100.0, "ts": T0}).encode(),
          json.dumps({"node_id": "n1", "model": "m", "latency_us": 100.0, "ts": T0 + 9000.0,
                      "ttft_us": 500.0}).encode()]        # far ahead, and ttft above latency
    _recs, stats = run(ls)
    assert stats.events == 1 and sum(stats.bad.values()) == 1 and "future_ts" not in stats.bad


@pytest.mark.parametrize("skewed", [("n5",), ("n4", "n5")], ids=["one_node", "a_rack"])
def test_clocks_an_hour_ahead_do_not_move_event_time(skewed: tuple[str, ...]) -> None:
    # Nodes in random order, so a skewed node's lines often come several in a row.
    rng = np.random.default_rng(11)
    clean: list[bytes] = []
    trace: list[bytes] = []
    for k in range(12_000):
        node = f"n{int(rng.integers(0, 6))}"
        lat = 100_000.0 * float(np.exp(rng.normal(0, 0.3))) * (3.0 if node == "n1" and k > 6000 else 1.0)
        ts = T0 + k / 20.0
        if node in skewed:
            trace.append(json.dumps({"node_id": node, "model": "m", "latency_us": lat,
                                     "ts": ts + 3600.0}).encode())
        else:
            clean.append(json.dumps({"node_id": node, "model": "m", "latency_us": lat,
                                     "ts": ts}).encode())
            trace.append(clean[-1])
    ref, ref_stats = run(clean)
    got, stats = run(trace)
    assert stats.bad == {"future_ts": len(trace) - len(clean)}
    assert stats.last_ts == ref_stats.last_ts
    assert [(r["ts"], r["node_id"], r["to"]) for r in got] == \
        [(r["ts"], r["node_id"], r["to"]) for r in ref]
    assert any(r["node_id"] == "n1" and r["routed"] is False for r in got)


def _fleet(nodes: int, seconds: float, *, ahead: dict[str, float], slow: str, onset: float,
           rate: float = 4.0, seed: int = 3, heartbeat_s: float = 0.0) -> list[bytes]:
    """Nodes in random order at ``rate`` events/s each; ``ahead``: node -> seconds its clock
    runs ahead; ``slow`` 3x slower from ``onset``; ``heartbeat_s``: each node's heartbeat
    every so often (as the emitter sends them), 0: none."""
    rng = np.random.default_rng(seed)
    out = []
    every = int(heartbeat_s * rate * nodes)
    for k in range(int(seconds * rate * nodes)):
        ts = T0 + k / (rate * nodes)
        if every and k % every == 0:
            out.extend(json.dumps({"type": "heartbeat", "node_id": f"n{i:02d}", "model": "m",
                                   "ts": ts + ahead.get(f"n{i:02d}", 0.0)}).encode() for i in range(nodes))
        node = f"n{int(rng.integers(0, nodes)):02d}"
        lat = 1e6 * float(np.exp(rng.normal(0, 0.3))) * (3.0 if node == slow and ts > T0 + onset else 1.0)
        out.append(json.dumps({"node_id": node, "model": "m", "latency_us": lat,
                               "ts": ts + ahead.get(node, 0.0) + float(rng.uniform(0, 0.5))}).encode())
    return out


@pytest.mark.parametrize("heartbeat_s", [0.0, 5.0], ids=["events", "heartbeats"])
@pytest.mark.parametrize("ahead_s", [100.0, 200.0, 290.0])
def test_a_node_whose_clock_runs_ahead_does_not_move_the_ticks(ahead_s: float, heartbeat_s: float) -> None:
    # One node of 12 with its clock minutes ahead (within max_future_skew_s): the ticks follow
    # the fleet, so nobody else looks silent and a slow node is caught as on a clean trace.
    # With heartbeats (every 5 s per node, as the emitter sends them), the skewed node's
    # heartbeats ran the ticks (2026-12-05 backtest: every other node flapped gone/returned at
    # every tick and the slow node stayed routed).
    kw: dict[str, Any] = {"nodes": 12, "seconds": 1500.0, "slow": "n07", "onset": 900.0,
                          "heartbeat_s": heartbeat_s}
    skewed, _ = run(_fleet(ahead={"n03": ahead_s}, **kw))
    clean, _ = run(_fleet(ahead={}, **kw))

    def story(recs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(r["ts"], r["node_id"], r["to"], r["reason"]) for r in recs
                if r.get("type") == "transition" and r["node_id"] != "n03"]

    assert not [r for r in skewed if r.get("reason") in ("silent", "returned", "restarted")]
    assert not [r for r in skewed if r.get("type") == "fleet"]
    out = [r for r in story(skewed) if r[1] == "n07" and r[2] == "unhealthy"]
    assert out and out[0][0] <= T0 + 900.0 + 120.0, story(skewed)
    # the others' story is the clean trace's, give or take the skewed node as a peer
    assert {r[1] for r in story(skewed) if r[3] == "admitted"} == \
        {r[1] for r in story(clean) if r[3] == "admitted"} - {"n03"}


@pytest.mark.parametrize(("ahead", "heartbeat_s"), [
    ({"n03": 35.0}, 0.0), ({"n03": 45.0}, 5.0), ({"n03": 59.0}, 0.0), ({"n03": 40.0, "n05": 55.0}, 5.0),
], ids=["35s", "45s_heartbeats", "59s", "two_pods_heartbeats"])
def test_a_node_a_tick_or_more_ahead_does_not_move_the_ticks(ahead: dict[str, float],
                                                             heartbeat_s: float) -> None:
    # One or two nodes 31-60 s ahead (more than a tick, within the 2 ticks the median rule
    # allows) ran the ticks while the fleet was that far behind: its newest samples reached
    # each tick late, and the slow node left 150 s later than on the clean trace (2026-12-05
    # backtest). A boundary needs the fleet's word: a node more than a tick past all but one
    # of the others waits. The others' story is the clean trace's, tick for tick.
    kw: dict[str, Any] = {"nodes": 12, "seconds": 1500.0, "slow": "n07", "onset": 900.0,
                          "heartbeat_s": heartbeat_s}
    skewed, skewed_stats = run(_fleet(ahead=ahead, **kw))
    clean, clean_stats = run(_fleet(ahead={}, **kw))

    def story(recs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(r["ts"], r["node_id"], r["to"], r["reason"]) for r in recs
                if r.get("type") == "transition" and r["node_id"] not in ahead]

    assert story(skewed) == story(clean)
    assert skewed_stats.ticks == clean_stats.ticks
    assert any(r[1] == "n07" and r[2] == "unhealthy" for r in story(skewed))


def test_the_summary_names_routed_pairs_too_thin_to_be_judged() -> None:
    # 0.2 requests/s per node: admitted once 100 samples came in since warm-up, then never
    # 100 within the 300 s age bound again: the summary says so and what to change.
    _, thin = run(lines(nodes=4, seconds=1500.0, rate=0.2))
    assert thin.thin_pairs == 4
    assert "4 routed (node, model) pairs ended with fewer than min_samples=100" in thin.summary()
    assert "below about 0.33 requests/s" in thin.summary()
    _, judged = run(lines(nodes=4, seconds=1500.0, rate=0.2), max_sample_age_s=900.0)
    assert judged.thin_pairs == 0 and "routed (node, model) pairs" not in judged.summary()


def test_a_trace_not_in_time_order_is_counted_and_named_in_the_summary() -> None:
    # The same events written node after node instead of in time order: the later nodes'
    # samples arrive after their ticks passed and are never judged; the summary says so.
    ordered = lines(nodes=3, seconds=600.0, rate=5.0)
    by_node = sorted(ordered, key=lambda raw: json.loads(raw)["node_id"])
    s = DetectorSettings()
    _, ok = replay(ordered, s, lambda _: None)
    _, late = replay(by_node, s, lambda _: None)
    assert ok.late_samples == 0 and "sorted by time" not in ok.summary()
    # the first node's events are in order; most of the other two's are read too late
    per_node = len(ordered) // 3
    assert per_node < late.late_samples < 2 * per_node
    assert f"{late.late_samples} samples read after the ticks" in late.summary()
    assert "Is the trace sorted by time?" in late.summary()


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_main_reads_a_trace_that_starts_with_a_utf8_bom(gz: bool, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Windows tools (PowerShell's Out-File -Encoding utf8, Notepad) write a byte-order mark;
    # it made --format auto read the trace as a capture and stop (exit 1, "not valid
    # Prometheus text format"; 2026-12-05 backtest), and cost line 1 with --format events.
    import gzip
    data = b"\n".join(lines(slow="n4")) + b"\n"
    (tmp_path / "t.jsonl").write_bytes(data)
    bom = b"\xef\xbb\xbf" + data
    (tmp_path / "bom.jsonl").write_bytes(gzip.compress(bom) if gz else bom)
    assert main([str(tmp_path / "t.jsonl")]) == 0
    plain = capsys.readouterr()
    for fmt in ("auto", "events"):
        assert main([str(tmp_path / "bom.jsonl"), "--format", fmt]) == 0
        got = capsys.readouterr()
        assert got.out == plain.out and '"routed": false' in got.out
        assert got.err == plain.err


def test_each_batch_and_heartbeat_line_is_decoded_once() -> None:
    # Past the first tick every batch and heartbeat line goes line by line (its time is read
    # to tell an early line); it was decoded twice there: once for its time, once to add it.
    from tailguard.core.contract import events
    from tailguard.core.contract.events_fast import FastDecoder
    from tailguard.core.window import accumulate
    ls = []
    for k in range(300):
        ts = T0 + k / 5.0
        for n in ("n0", "n1", "n2"):
            if k % 10 == 0:
                ls.append(json.dumps({"type": "heartbeat", "node_id": n, "model": "m", "ts": ts}).encode())
            ls.append(json.dumps({"node_id": n, "model": "m",
                                  "samples": [[ts, 1e5], [ts + 0.1, 1.1e5]]}).encode())
    calls = {"batch": 0, "parse_event": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kw)
        return wrapper

    with mock.patch.object(FastDecoder, "batch", counted("batch", FastDecoder.batch)), \
            mock.patch.object(events, "parse_event", counted("parse_event", events.parse_event)), \
            mock.patch.object(accumulate, "parse_event", counted("parse_event", accumulate.parse_event)):
        _recs, stats = run(ls)
    assert stats.events == len(ls) and stats.ticks > 1 and not stats.bad
    heartbeats = sum(1 for raw in ls if b"heartbeat" in raw)
    assert calls == {"batch": len(ls) - heartbeats, "parse_event": heartbeats}


def test_a_bad_line_of_a_node_ahead_is_counted_where_it_is_read() -> None:
    # A bad batch line of a node ahead of the fleet waited among its early lines and was
    # counted after the bad lines read behind it; it is no event, so it is counted at once.
    ls = _fleet(12, 300.0, ahead={"n03": 100.0}, slow="n07", onset=900.0)
    at = next(i for i in range(len(ls) // 2, len(ls)) if b'"n03"' in ls[i])
    ts = json.loads(ls[at])["ts"]
    ls[at + 1:at + 1] = [json.dumps({"node_id": "n03", "model": "m", "samples": [[ts, -1.0]]}).encode(),
                         b"{not json"]
    _recs, stats = run(ls)
    assert stats.bad == {"bad_latency": 1, "bad_json": 1}
    assert [(ln, r) for ln, r, _ in stats.first_bad] == [(at + 2, "bad_latency"), (at + 3, "bad_json")]
