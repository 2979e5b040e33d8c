"""The check suite against fake nvidia-smi/dmesg/dcgmi replaying recorded cases (no GPU).

Each case is a directory of tests/fixtures/gpu/cases; the suite runs the real
subprocess path (PATH lookup, timeouts, parsing) and the pure verdict decides.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gpu_fakes import fake_env

from tailguard.agent.checks import Suite, run_tool
from tailguard.agent.config import AgentConfig, NodeSpec, UserCheck
from tailguard.agent.verdict import decide

pytestmark = pytest.mark.timeout(60)


def _cfg(tmp_path: Path, **kw: object) -> AgentConfig:
    base: dict[str, object] = {"state_dir": str(tmp_path),
                               "gemm_command": ("false",)}  # no torch here: GEMM errors, never decides
    base.update(kw)
    return AgentConfig((NodeSpec("gpu-node-07"),), **base)  # type: ignore[arg-type]


async def _run(case: str, tmp_path: Path, node: NodeSpec | None = None, **kw: object):  # type: ignore[no-untyped-def]
    suite = Suite(_cfg(tmp_path, **kw), env=fake_env(case))
    rep = await suite.run(node or NodeSpec("gpu-node-07"), "llm")
    return rep, decide(rep.outcomes), {o.name: o for o in rep.outcomes}


@pytest.mark.parametrize(("case", "verdict", "reasons"), [
    ("healthy", "inconclusive", ("no fault found", "did not finish: gemm")),
    ("thermal", "recoverable", ("thermal_throttle",)),
    ("ecc", "not_recoverable", ("dcgm_hardware_fail", "ecc_uncorrectable", "page_retirement_pending",
                                "xid_fatal")),
    ("xid79", "not_recoverable", ("gpu_lost", "xid_fatal")),
    ("stray", "recoverable", ("stray_process",)),
    ("old_driver", "not_recoverable", ("pcie_degraded",)),
])
async def test_recorded_cases(case: str, verdict: str, reasons: tuple[str, ...], tmp_path: Path) -> None:
    _, v, by = await _run(case, tmp_path)
    assert (v.verdict, v.reasons) == (verdict, reasons), [f.to_dict() for f in v.evidence]
    assert v.recoverable is (verdict != "not_recoverable")
    assert by["nvidia_smi"].status == "ok" and by["xid"].status == "ok", by


async def test_thermal_evidence_names_gpu_temperature_and_clocks(tmp_path: Path) -> None:
    _, v, _ = await _run("thermal", tmp_path)
    (f,) = v.evidence
    assert (f.gpu, f.data["temperature_c"], f.data["clocks_sm_mhz"], f.data["clocks_max_sm_mhz"]) == (
        0, 89.0, 1080.0, 1410.0)


async def test_xid79_finds_the_lost_gpu_by_its_bus_and_dcgmi_without_host_engine_is_an_error(
        tmp_path: Path) -> None:
    rep, v, by = await _run("xid79", tmp_path, expected_gpus=2)
    xid = next(f for f in v.evidence if f.kind == "xid_fatal")
    assert xid.data == {"xid": 79, "count": 1, "bus": "0f:00"}
    assert "gpu_missing" in v.reasons                 # 1 of the 2 expected GPUs visible
    assert by["dcgmi"].status == "error" and "nv-hostengine" in by["dcgmi"].note
    assert len(rep.gpus) == 1


async def test_stray_process_is_the_smaller_one_sharing_the_gpu(tmp_path: Path) -> None:
    _, v, _ = await _run("stray", tmp_path)
    (f,) = v.evidence
    assert (f.gpu, f.data["pid"], f.data["used_mib"]) == (0, 51877, 9216.0)
    # With the server's process names configured, the same process is stray on its own.
    _, v2, _ = await _run("stray", tmp_path, expected_processes=("/opt/vllm/",))
    assert [f.data["pid"] for f in v2.evidence] == [51877]


async def test_old_driver_is_asked_again_without_the_fields_it_does_not_know(tmp_path: Path) -> None:
    _, v, by = await _run("old_driver", tmp_path)
    assert "remapped_rows.pending" in by["nvidia_smi"].note
    (f,) = v.evidence
    assert (f.gpu, f.data["width"], f.data["width_max"]) == (1, 8.0, 16.0)


async def test_hung_tools_time_out_and_the_suite_still_answers(tmp_path: Path) -> None:
    t0 = time.monotonic()
    _, v, by = await _run("hung", tmp_path, timeouts_s={"nvidia_smi": 1.0, "compute_apps": 1.0, "xid": 5.0,
                                                         "dcgmi": 1.0, "gemm": 5.0})
    took = time.monotonic() - t0
    assert by["nvidia_smi"].status == "timeout" and by["dcgmi"].status == "timeout", by
    assert v.verdict == "inconclusive" and any("did not finish" in r for r in v.reasons), v.reasons
    assert took < 8.0, took  # two 1-s timeouts plus the compute-apps one, not an hour


async def test_gpu_subset_of_a_node_only_sees_its_gpus(tmp_path: Path) -> None:
    _, v, _ = await _run("ecc", tmp_path, node=NodeSpec("gpu-node-07", (0,)))
    # GPU 1's ECC and XIDs belong to another node id on this host; DCGM runs on GPU 0 only
    # in reality, and the fake answers for the host, so only its finding remains.
    assert {f.kind for f in v.evidence} == {"dcgm_hardware_fail"}


async def test_missing_tools_are_skipped_with_a_note(tmp_path: Path) -> None:
    suite = Suite(_cfg(tmp_path), env={"PATH": str(tmp_path)})
    rep = await suite.run(NodeSpec("n"), "m")
    by = {o.name: o for o in rep.outcomes}
    assert by["nvidia_smi"].status == "skipped" and "not found" in by["nvidia_smi"].note
    assert by["xid"].status == "skipped" and "dmesg not found" in by["xid"].note
    assert by["dcgmi"].status == "skipped"
    v = decide(rep.outcomes)
    assert v.verdict == "inconclusive" and v.reasons[0].startswith("no check could run")


async def test_user_checks_json_and_exit_code(tmp_path: Path) -> None:
    checks = (UserCheck("nccl", ("/bin/sh", "-c", 'printf \'{"verdict": "not_recoverable", '
                                  '"detail": "NVLink 3 down on %s"}\' "$TAILGUARD_NODE_ID"')),
              UserCheck("disk", ("/bin/sh", "-c", "echo full; exit 1"), on_fail="recoverable"),
              UserCheck("slow", ("/bin/sh", "-c", "sleep 30"), timeout_s=0.5))
    _, v, by = await _run("healthy", tmp_path, user_checks=checks)
    assert v.verdict == "not_recoverable" and v.reasons == ("user_not_recoverable",)
    kinds = {f.check: (f.kind, f.detail) for f in v.evidence}
    assert kinds["user:nccl"] == ("user_not_recoverable", "NVLink 3 down on gpu-node-07")
    assert kinds["user:disk"] == ("user_recoverable", "disk exited 1: full")
    assert by["user:slow"].status == "timeout"


async def test_gemm_against_own_history_and_peers(tmp_path: Path) -> None:
    fake = tmp_path / "gemm.sh"
    fake.write_text('#!/bin/sh\necho \'{"tflops": {"0": 100.0, "1": 250.0}}\'\n')
    fake.chmod(0o755)
    cfg = {"gemm_command": (str(fake),)}
    (tmp_path / "gemm-gpu-node-07.json").write_text('{"0": [240.0, 245.0, 250.0], "1": [250.0]}')
    _, v, by = await _run("healthy", tmp_path, **cfg)
    (f,) = [f for f in v.evidence if f.kind == "gemm_slow"]
    assert (f.gpu, f.data["own_median"]) == (0, 245.0)
    assert v.verdict == "inconclusive"   # a slow GEMM alone retires nobody
    assert "GPU 0: 100.0 TFLOP/s" in by["gemm"].note
    # The slow result is not kept; the normal one is.
    hist = (tmp_path / "gemm-gpu-node-07.json").read_text()
    assert '"0": [240.0, 245.0, 250.0]' in hist and '"1": [250.0, 250.0]' in hist


async def test_run_tool_kills_the_whole_process_group_on_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run = await run_tool(["/bin/sh", "-c", "sleep 60 & sleep 60; wait"], 0.5)
    assert run.timed_out and time.monotonic() - t0 < 4.0


async def test_xid_falls_back_to_journalctl_when_dmesg_is_not_permitted(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dmesg").write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
                                   "exit 1\n")
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(now - 60))
    (bin_dir / "journalctl").write_text(
        f"#!/bin/sh\necho \"$*\" > {tmp_path}/args\n"
        f"echo '{stamp} gpu-node-07 kernel: NVRM: Xid (PCI:0000:0f:00): 95, pid=1, Uncontained: FBHUB.'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    suite = Suite(_cfg(tmp_path), env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, clock=lambda: now)
    out = await suite.xid({}, None)
    assert out.status == "ok" and out.note == "read with journalctl", out
    (f,) = out.findings
    assert (f.kind, f.data["xid"]) == ("xid_fatal", 95)
    assert (tmp_path / "args").read_text().split() == ["-k", "-o", "short-iso", "--no-pager",
                                                       f"--since=@{int(now - 86400)}"]
    # Neither readable: skipped, saying what to grant.
    (bin_dir / "journalctl").write_text("#!/bin/sh\necho 'No journal files were found.' >&2\nexit 1\n")
    out = await suite.xid({}, None)
    assert out.status == "skipped" and "CAP_SYSLOG" in out.note and "Operation not permitted" in out.note


async def test_user_checks_do_not_see_the_agents_kafka_passwords(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TAILGUARD_KAFKA_SASL_PASSWORD": "kafka-s3cret",
           "TAILGUARD_KAFKA_SSL_KEY_PASSWORD_FILE": "/run/secrets/key", "KEEP": "kept"}
    check = UserCheck("env", ("/bin/sh", "-c",
                              'echo "${TAILGUARD_KAFKA_SASL_PASSWORD:-none} '
                              '${TAILGUARD_KAFKA_SSL_KEY_PASSWORD_FILE:-none} $KEEP"; exit 1'))
    suite = Suite(_cfg(tmp_path, user_checks=(check,)), env=env)
    rep = await suite.run(NodeSpec("gpu-node-07"), "llm")
    (f,) = [f for o in rep.outcomes for f in o.findings if f.check == "user:env"]
    assert f.detail == "env exited 1: none none kept", f.detail
