"""The agent's verdict table and parsers: pure, no subprocess (tailguard.agent.verdict, tailguard.agent.parse)."""

from __future__ import annotations

import pytest

from tailguard.agent import parse
from tailguard.agent.findings import CheckOutcome, Finding
from tailguard.agent.verdict import KIND_CLASS, decide


def _o(*kinds: str, status: str = "ok", name: str = "c") -> CheckOutcome:
    return CheckOutcome(name, status, 0.1, "", tuple(Finding(k, name, k) for k in kinds))  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "outcomes", "verdict", "reasons"), [
    ("nothing found", [_o()], "inconclusive", ("no fault found",)),
    ("thermal throttling", [_o("thermal_throttle")], "recoverable", ("thermal_throttle",)),
    ("power cap", [_o("power_throttle")], "recoverable", ("power_throttle",)),
    ("stray process", [_o("stray_process")], "recoverable", ("stray_process",)),
    ("transient xid", [_o("xid_transient")], "recoverable", ("xid_transient",)),
    ("uncorrectable ecc", [_o("ecc_uncorrectable")], "not_recoverable", ("ecc_uncorrectable",)),
    ("fatal xid", [_o("xid_fatal")], "not_recoverable", ("xid_fatal",)),
    ("off the bus", [_o("gpu_lost")], "not_recoverable", ("gpu_lost",)),
    ("pcie degraded", [_o("pcie_degraded")], "not_recoverable", ("pcie_degraded",)),
    ("not recoverable beats recoverable",
     [_o("thermal_throttle"), _o("ecc_uncorrectable", "stray_process")], "not_recoverable",
     ("ecc_uncorrectable",)),
    ("evidence alone decides nothing", [_o("gemm_slow", "clocks_low", "xid_other")], "inconclusive",
     ("clocks_low", "gemm_slow", "xid_other")),
    ("explained slowness", [_o("gemm_slow"), _o("power_throttle")], "recoverable", ("power_throttle",)),
    ("unknown kind never retires", [_o("made_up_kind")], "inconclusive", ("made_up_kind",)),
    ("a timeout is reported", [_o(), _o(status="timeout", name="dcgmi")], "inconclusive",
     ("no fault found", "did not finish: dcgmi")),
    ("nothing could run", [_o(status="skipped", name="nvidia_smi"), _o(status="timeout", name="xid")],
     "inconclusive", ("no check could run: nvidia_smi skipped; xid timeout",)),
    ("no checks", [], "inconclusive", ("no checks configured",)),
])
def test_verdict_table(name: str, outcomes: list[CheckOutcome], verdict: str,
                       reasons: tuple[str, ...]) -> None:
    v = decide(outcomes)
    assert (v.verdict, v.reasons) == (verdict, reasons), name
    assert v.recoverable is (verdict != "not_recoverable")
    # The deciding findings come first in the evidence, and nothing is dropped.
    assert len(v.evidence) == sum(len(o.findings) for o in outcomes)
    if verdict != "inconclusive":
        assert KIND_CLASS[v.evidence[0].kind] == verdict


ROW = ("0, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 100, 81920, {util}, 40, {sm}, 1410, 1593, 1593, "
       "{mask}, 60.0, 400.00, {vol}, {agg}, No, {pend}, {fail}, {gen}, 4, {width}, 16")


def _row(**kw: object) -> list[parse.GpuRow]:
    vals: dict[str, object] = {"util": 0, "sm": 1410, "mask": "0x0000000000000000", "vol": 0, "agg": 0,
                               "pend": "No", "fail": "No", "gen": 4, "width": 16}
    vals.update(kw)
    return parse.parse_gpu_rows(ROW.format(**vals))


@pytest.mark.parametrize(("kw", "kinds"), [
    ({}, []),
    ({"mask": "0x0000000000000001"}, []),                        # idle: not a throttle
    ({"mask": "0x0000000000000040"}, ["thermal_throttle"]),
    ({"mask": "0x0000000000000004"}, ["power_throttle"]),
    ({"mask": "0x0000000000000088"}, ["power_throttle", "hw_slowdown"]),
    ({"vol": 0, "agg": 1}, ["ecc_uncorrectable"]),
    ({"vol": "[N/A]", "agg": "[N/A]"}, []),                      # ECC off: not reported, not a fault
    ({"pend": "Yes"}, ["page_retirement_pending"]),
    ({"fail": "Yes"}, ["row_remap_failure"]),
    ({"gen": 1}, []),                                            # idle GPUs downshift the link
    ({"gen": 1, "util": 90}, ["pcie_degraded"]),
    ({"width": 8}, ["pcie_degraded"]),
    ({"sm": 600, "util": 90}, ["clocks_low"]),
    ({"vol": "[GPU requires reset]"}, ["gpu_lost"]),
])
def test_gpu_row_findings(kw: dict[str, object], kinds: list[str]) -> None:
    assert [f.kind for f in parse.gpu_findings(_row(**kw))] == kinds


def test_xid_lines_are_timed_filtered_by_lookback_and_counted() -> None:
    text = "\n".join([
        "2026-12-03T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        "2026-12-03T10:00:01,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        "2026-11-20T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:07:00): 48, pid=1, DBE",   # too old
        "2026-12-03T10:00:00+0000 host kernel: NVRM: Xid (PCI:0000:07:00): 13, pid=9, Graphics Exception",
        "[ 123.456] NVRM: Xid (PCI:0000:07:00): 31, pid=9, MMU Fault",                    # no time: counts
        "unrelated line",
    ])
    events = parse.parse_xids(text)
    assert [(e.xid, e.bus) for e in events] == [(79, "3b:00"), (79, "3b:00"), (48, "07:00"), (13, "07:00"),
                                                (31, "07:00")]
    now = events[0].ts + 600  # type: ignore[operator]
    found = parse.xid_findings(events, now, 86400.0, {"07:00": 0})
    assert [(f.kind, f.gpu, f.data["xid"], f.data["count"]) for f in found] == [
        ("xid_transient", 0, 13, 1), ("xid_transient", 0, 31, 1), ("xid_fatal", None, 79, 2)]


def test_dcgmi_rows() -> None:
    text = "| Page Retirement/Row Remap | Fail |\n| Graphics Processes | Fail |\n| Persistence Mode | Fail |\n" \
           "| Inforom | Pass |\n| Denylist | Skip |"
    assert [f.kind for f in parse.dcgmi_findings(text)] == ["dcgm_hardware_fail", "stray_process", "dcgm_fail"]


def test_gemm_against_peers_only() -> None:
    (f,) = parse.gemm_findings({0: 90.0, 1: 200.0}, {}, peer_tflops=200.0, min_ratio=0.7)
    assert (f.gpu, f.data["peers"]) == (0, 200.0)
    assert parse.gemm_findings({0: 90.0}, {}, None, 0.7) == []    # nothing to compare with


@pytest.mark.parametrize(("code", "out", "kinds"), [
    (0, "", []),
    (1, "", ["user_inconclusive"]),
    (1, '{"ok": true}', []),                                    # JSON wins over the exit code
    (0, '{"verdict": "recoverable", "detail": "restart me"}', ["user_recoverable"]),
    (0, '{"ok": false}', ["user_inconclusive"]),
    (2, "{not json", ["user_inconclusive"]),
])
def test_user_check_findings(code: int, out: str, kinds: list[str]) -> None:
    assert [f.kind for f in parse.user_check_findings("c", code, out, "inconclusive")] == kinds
