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
