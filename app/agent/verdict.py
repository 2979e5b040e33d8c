"""The verdict: check outcomes → ``recoverable`` / ``not_recoverable`` / ``inconclusive``.

Pure and table-driven: :data:`KIND_CLASS` gives each finding kind its class, and
:func:`decide` applies one precedence rule:

1. any finding of class ``not_recoverable`` (uncorrectable ECC, a fatal XID, a lost or
   missing GPU, a degraded PCIe link, a failed row remap or a pending page retirement, a DCGM
   hardware failure, a user check saying so) → ``not_recoverable``: retire the node;
2. else any finding of class ``recoverable`` (thermal or power throttling, a hardware
   slowdown, a stray process holding GPU memory, a transient XID, a user check saying so)
   → ``recoverable``: the cause passes or can be cleared, keep probing;
3. else ``inconclusive`` — no fault found, or the checks could not run. Evidence-only kinds
   (``gemm_slow``, ``clocks_low``, ``xid_other``, …) and timeouts never decide.

An unknown kind counts as evidence only: a node is never retired on a finding the table does
not know. ``reasons`` lists the deciding kinds (sorted, unique), or why nothing decided;
``evidence`` is every finding, deciding ones first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from tailguard.agent.findings import CheckOutcome, Finding, Verdict

Klass = Literal["not_recoverable", "recoverable", "evidence"]

KIND_CLASS: dict[str, Klass] = {
    "ecc_uncorrectable": "not_recoverable",
    "xid_fatal": "not_recoverable",
    "gpu_lost": "not_recoverable",
    "gpu_missing": "not_recoverable",
    "pcie_degraded": "not_recoverable",
    "row_remap_failure": "not_recoverable",
    "page_retirement_pending": "not_recoverable",
    "dcgm_hardware_fail": "not_recoverable",
    "user_not_recoverable": "not_recoverable",
    "thermal_throttle": "recoverable",
    "power_throttle": "recoverable",
    "hw_slowdown": "recoverable",
    "stray_process": "recoverable",
    "xid_transient": "recoverable",
    "user_recoverable": "recoverable",
    "gemm_slow": "evidence",
    "clocks_low": "evidence",
    "xid_other": "evidence",
    "dcgm_fail": "evidence",
    "user_inconclusive": "evidence",
}


def klass(kind: str) -> Klass:
    return KIND_CLASS.get(kind, "evidence")


def decide(outcomes: Sequence[CheckOutcome]) -> Verdict:
    """The verdict over every check's findings (see the module docstring)."""
    findings = [f for o in outcomes for f in o.findings]
    for cls in ("not_recoverable", "recoverable"):
        deciding = [f for f in findings if klass(f.kind) == cls]
        if deciding:
            rest = [f for f in findings if klass(f.kind) != cls]
            return Verdict(cls, tuple(sorted({f.kind for f in deciding})),
                           tuple(deciding + rest))
    ran = [o for o in outcomes if o.status == "ok"]
    if not ran:
        why = "no check could run: " + "; ".join(
            f"{o.name} {o.status}" + (f" ({o.note})" if o.note else "") for o in outcomes)
        return Verdict("inconclusive", (why[:500] if outcomes else "no checks configured",),
                       tuple(findings))
    reasons = sorted({f.kind for f in findings}) or ["no fault found"]
    failed = [o.name for o in outcomes if o.status in ("timeout", "error")]
    if failed:
        reasons.append("did not finish: " + ", ".join(failed))
    return Verdict("inconclusive", tuple(reasons), tuple(findings))


def finding_dicts(v: Verdict) -> list[dict[str, object]]:
    """The evidence as JSON-ready dicts, each with its class."""
    return [{**f.to_dict(), "class": klass(f.kind)} for f in v.evidence]


def summarize(v: Verdict, findings: Sequence[Finding] | None = None) -> str:
    """One line for logs: ``not_recoverable (xid_fatal): XID 79 x1 on PCI 3b:00: …``."""
    first = next(iter(findings if findings is not None else v.evidence), None)
    tail = f": {first.detail}" if first is not None else ""
    return f"{v.verdict} ({', '.join(v.reasons)}){tail}"[:400]
