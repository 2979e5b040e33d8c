"""``tailguard replay`` over captured scrapes (/federate text) and over histogram-event lines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from test_scrape_convert import _federate

from tailguard.replay_cli import main
from tailguard.scrape.convert import events_from_capture

T0_MS = 1_764_680_000_000


def _capture(slow: str | None = "n5:8000", scrapes: int = 60) -> str:
    rng = np.random.default_rng(1)
    vals: dict[str, list[float]] = {f"n{i}:8000": [] for i in range(8)}
    out = []
    for k in range(scrapes):
        for node in vals:
            f = 3.0 if (node == slow and k >= 40) else 1.0
            vals[node] += list(0.18 * f * np.exp(rng.normal(0, 0.3, 200)))
        out.append(_federate(T0_MS + k * 10_000 + 137, vals))    # scrape times off the tick grid
    return "".join(out)


def _out(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_capture_is_detected_and_its_slow_node_leaves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fleet.prom.gz"
    f.write_bytes(gzip.compress(_capture().encode()))
    assert main([str(f)]) == 0
    out = [r for r in _out(capsys) if r["type"] == "transition"]
    ejected = [r for r in out if r["routed"] is False and r["to"] == "unhealthy"]
    assert [r["node_id"] for r in ejected] == ["n5:8000"]
    assert float(ejected[0]["ts"]) - (T0_MS / 1000 + 400) <= 120       # onset at the 40th scrape
    assert ejected[0]["signal"] == "e2e_hist"


def test_histogram_event_lines_replay_like_the_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cap = _capture()
    (tmp_path / "cap.prom").write_text(cap)
    lines = [json.dumps(e) for e in events_from_capture(cap.splitlines(keepends=True))]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    assert main([str(tmp_path / "cap.prom"), "--format", "capture"]) == 0
    from_capture = _out(capsys)
    assert main([str(tmp_path / "events.jsonl")]) == 0
    assert _out(capsys) == from_capture


def test_a_broken_capture_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.prom"
    f.write_text('# TYPE x histogram\nx_bucket{le="1",instance="a"} 3\n')    # no timestamp
    assert main([str(f)]) == 1
    err = capsys.readouterr().err
    assert "not a capture" in err and "no timestamp" in err and "Traceback" not in err


def _healthy_capture(scrapes: int, step_ms: int, offset_ms: int, jitter_ms: int) -> str:
    """A healthy fleet of 8, each target its own block with its own (jittered) ms timestamp."""
    rng = np.random.default_rng(2)
    vals: dict[str, list[float]] = {f"n{i}:8000": [] for i in range(8)}
    out = []
    for k in range(scrapes):
        for node in vals:
            vals[node] += list(0.18 * np.exp(rng.normal(0, 0.3, 2 * step_ms // 100)))
            jit = int(rng.integers(-jitter_ms, jitter_ms + 1)) if jitter_ms else 0
            out.append(_federate(T0_MS + k * step_ms + offset_ms + jit, {node: vals[node]}))
    return "".join(out)


@pytest.mark.parametrize(("scrapes", "step_ms", "offset_ms", "jitter_ms"), [
    (41, 10_000, 0, 0),         # the last scrapes exactly on the final tick (T0 + 10 s is a boundary)
    (41, 10_000, 137, 400),     # jittered, the last scrapes just past a boundary
    (40, 10_000, 0, 400),
    (14, 30_000, 0, 400),       # one scrape a tick, jittered around the boundaries
    (14, 30_000, 29_999, 0)])
def test_a_healthy_capture_gets_no_verdict_at_any_alignment(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], scrapes: int, step_ms: int,
        offset_ms: int, jitter_ms: int) -> None:
    """Scrapes on the tick boundaries or off them, the last one just before or on the final tick:
    before, the node whose scrape opened a tick had no request counted at the next one (its next
    scrape not in yet) and was judged ``stalled``."""
    f = tmp_path / "healthy.prom"
    f.write_text(_healthy_capture(scrapes, step_ms, offset_ms, jitter_ms))
    assert main([str(f)]) == 0
    out = [r for r in _out(capsys) if r["type"] == "transition"]
    assert {r["node_id"] for r in out if r["reason"] == "admitted"} == {f"n{i}:8000" for i in range(8)}
    assert {r["reason"] for r in out} <= {"first_seen", "admitted"}, out
