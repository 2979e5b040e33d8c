"""Trace generation: deterministic, contract-valid JSON lines that show the scenario's faults."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from tailguard.core.contract.events import Heartbeat, SampleBatch, decode
from tailguard.sim import cli, outcome, spec, tracegen
from tailguard.sim import scenario as sc
from tailguard.sim.latency import RequestSizes

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
duration_s = 300
rate_per_s = 10
[[models]]
name = "m"
p50_ms = 100
sigma = 0.3
[nodes]
count = 3
[[faults]]
node = "gpu-node-02"
kind = "slowdown"
onset_s = 150
factor = 3
"""

LLM_SMALL = """
duration_s = 200
rate_per_s = 10
emit_tokens = true
emit_ttft = true
[[models]]
name = "chat"
kind = "llm"
[nodes]
count = 2
"""


@pytest.fixture
def fake_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    table = np.stack([rng.integers(10, 3000, 2000), rng.integers(2, 500, 2000)], axis=1).astype(np.int64)
    monkeypatch.setattr(spec, "request_sizes", lambda trace: RequestSizes(trace, table))


def render(s: sc.Scenario, **kw: object) -> str:
    buf = io.StringIO()
    tracegen.write(tracegen.generate(s, kw.pop("seed", None)), buf, **kw)  # type: ignore[arg-type]
    return buf.getvalue()


def decoded(text: str) -> list[SampleBatch | Heartbeat]:
    return [decode(line) for line in text.splitlines()]


def test_same_seed_gives_identical_bytes_and_another_seed_does_not() -> None:
    s = sc.loads(SMALL, source="t.toml")
    assert render(s) == render(s)
    assert render(s) != render(s, seed=2)


def test_every_line_is_a_valid_contract_event_in_event_time_order() -> None:
    s = sc.loads(SMALL, source="t.toml")
    events = decoded(render(s))
    ts = [float(e.ts) if isinstance(e, Heartbeat) else float(e.ts[0]) for e in events]
    assert ts == sorted(ts)
    assert ts[0] >= sc.EPOCH_S and ts[-1] < sc.EPOCH_S + s.duration_s
    batches = [e for e in events if isinstance(e, SampleBatch)]
    heartbeats = [e for e in events if isinstance(e, Heartbeat)]
    assert len(heartbeats) == 3 * 30              # every 10 s per (node, model)
    assert {b.hardware for b in batches} == {"A100"}
    # Poisson arrivals at 10/s for 300 s on 3 nodes (minus the last in-flight requests)
    assert sum(len(b.ts) for b in batches) == pytest.approx(9000, rel=0.05)


def test_batch_form_carries_the_same_requests_as_single_form() -> None:
    s = sc.loads(SMALL, source="t.toml")
    single = [e for e in decoded(render(s)) if isinstance(e, SampleBatch)]
    batch = [e for e in decoded(render(s, fmt="batch", batch_s=2.0)) if isinstance(e, SampleBatch)]
    assert len(batch) < len(single) / 10
    def lat(evs: list[SampleBatch]) -> np.ndarray:
        return np.sort(np.concatenate([e.latency_us for e in evs]))
    assert np.array_equal(lat(single), lat(batch))


def test_the_fault_is_visible_in_the_trace() -> None:
    s = sc.loads(SMALL, source="t.toml")
    tr = tracegen.generate(s)
    st = {x.node_id: x for x in tr.streams}["gpu-node-02"]
    before = st.latency_us[st.t_s < 140]
    after = st.latency_us[st.t_s > 160]
    assert np.median(after) / np.median(before) == pytest.approx(3.0, rel=0.1)
    ok = {x.node_id: x for x in tr.streams}["gpu-node-01"]
    assert np.median(ok.latency_us) == pytest.approx(100_000.0, rel=0.05)


def test_adding_a_fault_elsewhere_does_not_change_a_node_s_samples() -> None:
    a = tracegen.generate(sc.loads(SMALL, source="t.toml"))
    b = tracegen.generate(sc.loads(SMALL.replace("gpu-node-02", "gpu-node-03"), source="t.toml"))
    assert np.array_equal(a.streams[0].latency_us, b.streams[0].latency_us)


def test_traffic_fault_raises_the_request_rate_inside_its_window() -> None:
    s = sc.loads(SMALL + """
[[faults]]
node = "*"
kind = "traffic"
onset_s = 100
end_s = 200
rate_factor = 3
""", source="t.toml")
    st = tracegen.generate(s).streams[0]
    inside = np.sum((st.t_s >= 110) & (st.t_s < 190))
    outside = np.sum((st.t_s >= 10) & (st.t_s < 90))
    assert inside / outside == pytest.approx(3.0, rel=0.15)


def test_probe_and_failed_requests_are_flagged() -> None:
    s = sc.loads(SMALL.replace("rate_per_s = 10", "rate_per_s = 10\nprobe_rate_per_s = 2") + """
[[faults]]
node = "gpu-node-01"
kind = "errors"
share = 0.5
""", source="t.toml")
    for fmt in ("single", "batch"):
        evs = [e for e in decoded(render(s, fmt=fmt)) if isinstance(e, SampleBatch)]
        probe = sum(int(e.probe.sum()) for e in evs)
        failed = sum(int((~e.ok).sum()) for e in evs if e.node_id == "gpu-node-01")
        failed_other = sum(int((~e.ok).sum()) for e in evs if e.node_id != "gpu-node-01")
        assert probe == pytest.approx(3 * 2 * 300, rel=0.15)
        assert failed == pytest.approx(0.5 * 12 * 300, rel=0.1) and failed_other == 0


@pytest.mark.usefixtures("fake_sizes")
@pytest.mark.parametrize(("tokens", "ttft"), [(True, True), (True, False), (False, False)])
def test_llm_token_fields_follow_the_emit_flags(tokens: bool, ttft: bool) -> None:
    text = LLM_SMALL.replace("emit_tokens = true", f"emit_tokens = {str(tokens).lower()}")
    text = text.replace("emit_ttft = true", f"emit_ttft = {str(ttft).lower()}")
    s = sc.loads(text, source="t.toml")
    for fmt in ("single", "batch"):
        evs = [e for e in decoded(render(s, fmt=fmt)) if isinstance(e, SampleBatch)]
        has_tokens = all(e.output_tokens is not None and not np.isnan(e.output_tokens).any() for e in evs)
        has_ttft = all(e.ttft_us is not None and not np.isnan(e.ttft_us).any() for e in evs)
        no_tokens = all(e.output_tokens is None or np.isnan(e.output_tokens).all() for e in evs)
        no_ttft = all(e.ttft_us is None or np.isnan(e.ttft_us).all() for e in evs)
        assert (has_tokens if tokens else no_tokens) and (has_ttft if ttft else no_ttft), fmt


def test_single_line_json_is_exactly_the_contract_shape() -> None:
    s = sc.loads(SMALL, source="t.toml")
    line = next(ln for ln in render(s).splitlines() if '"latency_us"' in ln)
    d = json.loads(line)
    assert set(d) == {"node_id", "model", "hardware", "latency_us", "ts", "ok"}
    assert isinstance(d["latency_us"], int) and d["latency_us"] > 0 and d["ok"] is True


def test_cli_writes_the_trace_and_reports_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "s.toml"
    scen.write_text(SMALL)
    out = tmp_path / "t.jsonl"
    assert cli.main(["trace", str(scen), "-o", str(out), "--seed", "3", "--format", "batch"]) == 0
    assert out.read_text() == render(sc.load(scen), seed=3, fmt="batch")
    assert "s: " in capsys.readouterr().err
    scen.write_text(SMALL.replace("factor = 3", "factor = -3"))
    assert cli.main(["trace", str(scen)]) == 2
    err = capsys.readouterr().err
    assert "s.toml: faults[0].factor = -3 is not allowed" in err


def test_cli_check_judges_replay_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "scenarios" / "slowdown_3x.toml"
    out = tmp_path / "replay.jsonl"
    t = sc.EPOCH_S + 370
    out.write_text(json.dumps({"type": "transition", "ts": t, "node_id": "gpu-node-05", "model": "llama-3-70b",
                               "from": "suspect", "to": "unhealthy", "routed": False}) + "\n")
    assert cli.main(["check", str(path), str(out)]) == 0
    assert "ejected gpu-node-05/llama-3-70b at 370.0 s" in capsys.readouterr().out
    out.write_text("")
    assert cli.main(["check", str(path), str(out)]) == 1
    assert "never taken out" in capsys.readouterr().out


def _rec(t_s: float, node: str, routed: bool, model: str = "llama-3-70b") -> dict[str, object]:
    return {"type": "transition", "ts": sc.EPOCH_S + t_s, "node_id": node, "model": model, "routed": routed}


def test_outcome_check_finds_late_early_missing_and_extra_ejections() -> None:
    s = sc.load(ROOT / "scenarios" / "fault_recovery.toml")
    good = outcome.check(s, [_rec(370, "gpu-node-04", False), _rec(700, "gpu-node-04", True)])
    assert good.ok and good.ejected_at_s[("gpu-node-04", "llama-3-70b")] == 370.0
    late = outcome.check(s, [_rec(430, "gpu-node-04", False), _rec(900, "gpu-node-04", True)])
    assert [p.split(" was ")[1][:12] for p in late.problems] == ["taken out 13", "re-admitted "]
    early = outcome.check(s, [_rec(200, "gpu-node-04", False), _rec(700, "gpu-node-04", True)])
    assert "BEFORE" in early.problems[0]
    missing = outcome.check(s, [_rec(100, "gpu-node-01", False)])
    assert len(missing.problems) == 2 and "never taken out" in missing.problems[0]
    assert "expects it to stay" in missing.problems[1]


def test_outcome_check_takes_a_refused_admission_as_out_all_along() -> None:
    """A faulty node still warming at its fault's onset is refused admission, never routed: it
    was out of routing all along, whenever the refusal comes (it was reported 'taken out 159 s
    after onset' in a backtest of a scraped fleet). Refused before the onset it is still early."""
    s = sc.load(ROOT / "scenarios" / "fault_recovery.toml")
    refused = {**_rec(460, "gpu-node-04", False), "from": "warming", "to": "unhealthy"}
    back = _rec(700, "gpu-node-04", True)
    assert outcome.check(s, [refused, back]).ok
    routed_then_late = outcome.check(s, [{**refused, "from": "suspect"}, back])
    assert "taken out 160.0 s after onset" in routed_then_late.problems[0]
    early = outcome.check(s, [{**refused, "ts": sc.EPOCH_S + 200}, back])
    assert "BEFORE" in early.problems[0]
    healthy = outcome.check(s, [{**refused, "node_id": "gpu-node-01"}])
    assert "expects it to stay" in healthy.problems[-1]


def test_outcome_check_requires_the_fleet_event_a_scenario_expects() -> None:
    s = sc.load(ROOT / "scenarios" / "traffic_peak.toml")
    assert not outcome.check(s, []).ok
    assert outcome.check(s, [{"type": "fleet", "ts": sc.EPOCH_S + 330, "kind": "load_event"}]).ok
