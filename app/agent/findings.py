"""The agent's small frozen types: findings, check outcomes and the verdict.

A *finding* is one fact a check observed that bears on the verdict
(``kind`` names it, e.g. ``ecc_uncorrectable`` or ``thermal_throttle``); the
verdict table (:mod:`tailguard.agent.verdict`) says what each kind means. A
*check outcome* is what one check did: ``ok`` (ran, findings or not),
``skipped`` (its tool is absent or not permitted: ``note`` says why),
``timeout`` or ``error``. Everything here is plain data with ``to_dict()`` for
the result message; nothing reads a clock or runs a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

CheckStatus = Literal["ok", "skipped", "timeout", "error"]
VerdictName = Literal["recoverable", "not_recoverable", "inconclusive"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One observed fact: ``kind`` (see ``verdict.KIND_CLASS``), where, and the numbers."""

    kind: str
    check: str
    detail: str
    gpu: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "check": self.check, "detail": self.detail}
        if self.gpu is not None:
            d["gpu"] = self.gpu
        if self.data:
            d["data"] = self.data
        return d


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """What one check did and found; ``duration_s`` is wall time spent on it."""

    name: str
    status: CheckStatus
    duration_s: float = 0.0
    note: str = ""
    findings: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "status": self.status,
                             "duration_s": round(self.duration_s, 3)}
        if self.note:
            d["note"] = self.note
        return d


@dataclass(frozen=True, slots=True)
class Verdict:
    """The suite's answer: ``verdict``, the finding kinds that decided it, all evidence."""

    verdict: VerdictName
    reasons: tuple[str, ...]
    evidence: tuple[Finding, ...]

    @property
    def recoverable(self) -> bool:
        """The contract's boolean: only ``not_recoverable`` retires a node."""
        return self.verdict != "not_recoverable"
