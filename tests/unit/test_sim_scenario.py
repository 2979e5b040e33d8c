"""Scenario files: the shipped ones parse; bad ones fail naming file, key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.sim import scenario as sc
from tailguard.sim import spec
from tailguard.sim.latency import LLM, Lognormal, Slowdown, TailDegradation, Warmup

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))

MINIMAL = """
duration_s = 600
[[models]]
name = "m"
p50_ms = 100
[nodes]
count = 4
"""


def test_every_issue_scenario_is_shipped() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"steady", "tail_fault", "slowdown_3x", "warmup_join", "traffic_peak", "heterogeneous",
            "multi_model", "spikes", "low_traffic", "fault_recovery", "rack_failure", "llm_conv_healthy",
            "llm_code_healthy", "llm_tpot_2_5x", "llm_tpot_2_5x_no_tokens",
            "llm_tpot_2_5x_tokens_no_ttft"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenarios_parse_and_their_expectations_name_real_faults(path: Path) -> None:
    s = sc.load(path)
    assert s.name == path.stem and s.description
    ids = {n.node_id for n in s.nodes}
    for e in s.expect.eject:
        assert e.node_id in ids
        assert any(f.applies(e.node_id, e.model) for f in s.faults)


def test_minimal_file_gets_documented_defaults() -> None:
    s = sc.loads(MINIMAL, source="t.toml", default_name="t")
    assert s.name == "t" and s.seed == 1 and s.rate_per_s == 20.0
    assert [n.node_id for n in s.nodes] == ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    assert all(n.hardware == "A100" and n.models == ("m",) for n in s.nodes)
    assert not s.emit_tokens and not s.emit_ttft and s.emit_hardware
    assert s.expect == sc.Expect()
    lat = s.latency("gpu-node-01", "m")
    assert isinstance(lat.base, Lognormal) and lat.base.p50_us == 100_000.0 and lat.effects == ()


def test_tail_fault_scenario_reads_as_written() -> None:
    s = sc.load(ROOT / "scenarios" / "tail_fault.toml")
    (f,) = s.faults
    assert (f.kind, f.nodes, f.onset_s, f.end_s) == ("tail", ("gpu-node-03",), 300.0, None)
    assert (f.share, f.factor) == (0.05, 8.0)
    (e,) = s.expect.eject
    assert (e.node_id, e.model, e.onset_s, e.within_s) == ("gpu-node-03", "llama-3-70b", 300.0, 120.0)
    assert s.expect.others_stay
    eff = s.latency("gpu-node-03", "llama-3-70b").effects
    assert eff == (TailDegradation(0.05, 8.0, 300.0, None),)
    assert s.latency("gpu-node-01", "llama-3-70b").effects == ()


def test_hardware_classes_overrides_and_warmup_build_the_node_model() -> None:
    s = sc.loads(MINIMAL + """
[hardware]
A10 = 2.0
[nodes.override.gpu-node-02]
hardware = "A10"
speed = 1.5
join_s = 120
warmup_s = 60
warmup_factor = 6
[[faults]]
node = "*"
kind = "traffic"
onset_s = 100
end_s = 200
rate_factor = 3
factor = 2
""", source="t.toml")
    n2 = s.node("gpu-node-02")
    assert (n2.hardware, n2.join_s, n2.speed) == ("A10", 120.0, 1.5)
    lat = s.latency("gpu-node-02", "m")
    assert isinstance(lat.base, Lognormal) and lat.base.p50_us == pytest.approx(100_000.0 * 2.0 * 1.5)
    assert lat.effects == (Warmup(120.0, 60.0, 6.0), Slowdown(2.0, 100.0, 200.0))
    import numpy as np
    assert s.rate_factor("gpu-node-01", "m", np.array([50.0, 150.0, 250.0])).tolist() == [1.0, 3.0, 1.0]
    assert s.max_rate_factor("gpu-node-01", "m") == 3.0


def test_llm_model_scales_ttft_and_tpot_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from tailguard.sim.latency import RequestSizes

    monkeypatch.setattr(spec, "request_sizes", lambda trace: RequestSizes(trace, np.array([[10, 5]])))
    s = sc.loads("""
duration_s = 60
emit_tokens = true
[[models]]
name = "chat"
kind = "llm"
tpot_ms = 20
[nodes]
ids = ["a", "b"]
[nodes.override.b]
tpot_factor = 2.5
[[faults]]
node = "a"
kind = "tpot"
onset_s = 30
factor = 3
""", source="t.toml")
    a, b = s.latency("a", "chat"), s.latency("b", "chat")
    assert isinstance(a.base, LLM) and isinstance(b.base, LLM)
    assert a.base.tpot_us == 20_000.0 and b.base.tpot_us == 50_000.0
    assert a.effects == (Slowdown(3.0, 30.0, None, channel="tpot"),) and b.effects == ()


def test_expectation_onset_defaults_to_the_first_fault_and_readmission_needs_an_end() -> None:
    s = sc.load(ROOT / "scenarios" / "fault_recovery.toml")
    (e,) = s.expect.eject
    assert (e.onset_s, e.end_s, e.readmit_within_s) == (300.0, 480.0, 300.0)


BAD = [
    ("duration_s = -1", "duration_s", "> 0"),
    ("duration_s = 'long'", "duration_s", "a finite number"),
    ("speling = 1", "speling", "one of the keys"),
    ("seed = 1.5", "seed", "a whole number"),
    ("emit_ttft = true", "emit_ttft", "emit_tokens"),
    ("emit_tokens = true", "emit_tokens", "llm"),
    ("[[models]]\nname = 'x'\nkind = 'gpu'", "models[1].kind", "lognormal, llm"),
    ("[[models]]\nname = 'm'", "models[1].name", "not used by another"),
    ("[[models]]\nname = 'x'\nkind = 'llm'\ntrace = 'chat'", "models[1].trace", "conv, code"),
    ("[[faults]]\nnode = 'gpu-node-09'\nkind = 'slowdown'\nfactor = 2", "faults[0].node", "gpu-node-01"),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'melt'", "faults[0].kind", "slowdown, tail"),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'slowdown'", "faults[0].factor", "a number"),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'tail'\nfactor = 5\nshare = 0.6", "faults[0].share", "<= 0.49"),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'tpot'\nfactor = 2", "faults[0].kind", "not kind = \"llm\""),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'slowdown'\nfactor = 2\nonset_s = 100\nend_s = 50",
     "faults[0].end_s", "after onset_s"),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'spikes'\nfactor = 2\nperiod_s = 5\nspike_s = 5",
     "faults[0].spike_s", "less than period_s"),
    ("[[faults]]\nkind = 'slowdown'\nfactor = 2", "faults[0].node", "exactly one of"),
    ("[[faults]]\nnode = 'gpu-node-01'\nkind = 'slowdown'\nfactor = 2\nshare = 0.1", "faults[0].share",
     "one of the keys"),
    ("[nodes.override.gpu-node-07]\nspeed = 2", "nodes.override.gpu-node-07", "a node id of this fleet"),
    ("[nodes.override.gpu-node-01]\nhardware = 'TPU'", "nodes.override.gpu-node-01.hardware",
     "a hardware class"),
    ("[nodes.override.gpu-node-01]\nmodels = ['n']", "nodes.override.gpu-node-01.models", "names of [[models]]"),
    ("[expect]\n[[expect.eject]]\nnode = 'gpu-node-01'\nwithin_s = 120", "expect.eject[0].onset_s",
     "no [[faults]] entry"),
    ("[expect]\nothers_stay = 'yes'", "expect.others_stay", "true or false"),
]


@pytest.mark.parametrize(("extra", "key", "allowed"), BAD, ids=[b[1] + ":" + b[0][:20] for b in BAD])
def test_bad_files_name_file_key_and_what_is_allowed(extra: str, key: str, allowed: str) -> None:
    if extra.startswith("duration_s"):
        text = MINIMAL.replace("duration_s = 600", extra)
    elif extra.startswith("["):
        text = MINIMAL + "\n" + extra
    else:                                   # a top-level key goes before the first table
        text = extra + "\n" + MINIMAL
    with pytest.raises(sc.ScenarioError) as ei:
        sc.loads(text, source="bad.toml")
    msg = str(ei.value)
    assert msg.startswith("bad.toml: ") and ei.value.key == key and allowed in msg, msg


def test_nodes_need_exactly_one_of_count_and_ids() -> None:
    with pytest.raises(sc.ScenarioError, match=r"exactly one of nodes\.count"):
        sc.loads(MINIMAL.replace("count = 4", "count = 4\nids = ['a']"), source="x.toml")
    with pytest.raises(sc.ScenarioError, match="distinct node ids"):
        sc.loads(MINIMAL.replace("count = 4", "ids = ['a', 'a']"), source="x.toml")


def test_unreadable_and_non_toml_files_are_scenario_errors(tmp_path: Path) -> None:
    with pytest.raises(sc.ScenarioError, match="cannot read it"):
        sc.load(tmp_path / "missing.toml")
    p = tmp_path / "broken.toml"
    p.write_text("x = [")
    with pytest.raises(sc.ScenarioError, match=r"broken\.toml: not valid TOML"):
        sc.load(p)


def test_several_models_need_the_model_named_in_expectations() -> None:
    text = MINIMAL + """
[[models]]
name = "n"
[[faults]]
node = "gpu-node-01"
kind = "slowdown"
factor = 3
[expect]
[[expect.eject]]
node = "gpu-node-01"
within_s = 120
"""
    with pytest.raises(sc.ScenarioError) as ei:
        sc.loads(text, source="x.toml")
    assert ei.value.key == "expect.eject[0].model" and "m, n" in str(ei.value)
