"""Pure parsers: tool output (text) → findings. No subprocess, no clock, no environment.

Each function takes what a tool printed (and, where a judgement needs it,
the node's configuration or the time as an argument) and returns
:class:`~tailguard.agent.findings.Finding` objects. The tools' formats:

* ``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits`` — one
  CSV line per GPU; ``[N/A]``/``[Not Supported]`` mean "not reported"; a GPU
  that fell off the bus shows ``[GPU requires reset]`` or ``Unknown Error``.
* ``nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_bus_id
  --format=csv,noheader,nounits`` — one line per process holding GPU memory.
* the kernel log (``dmesg --time-format=iso`` or ``journalctl -k -o short-iso``):
  ``NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the bus.``
* ``dcgmi diag -r 1`` — a table of ``| test | Pass/Fail/Skip/Warn |`` rows.
* the GEMM program (:mod:`tailguard.agent.gemm`) and user checks — JSON.

Guarantee: no parser raises on malformed text; what cannot be read is left
out (and a check with nothing readable reports it in its note).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tailguard.agent.findings import Finding

GPU_FIELDS: tuple[str, ...] = (
    "index", "name", "pci.bus_id", "memory.used", "memory.total", "utilization.gpu",
    "temperature.gpu", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
    "clocks_throttle_reasons.active", "power.draw", "power.limit",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
)
COMPUTE_FIELDS: tuple[str, ...] = ("pid", "process_name", "used_memory", "gpu_bus_id")

# clocks_throttle_reasons.active bits (NVML nvmlClocksThrottleReasons*).
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

# XIDs that mean the GPU needs a reset or replacement (the list):
# 48 double-bit ECC, 63/64 page retirement or row remapping event/failure,
# 79 fallen off the bus, 94/95 contained/uncontained ECC error.
FATAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 79, 94, 95})
# XIDs an application restart clears (exceptions and faults of the process, not the GPU).
TRANSIENT_XIDS: frozenset[int] = frozenset({13, 31, 43, 45})

BUSY_UTILIZATION_PCT = 50.0     # above this, a PCIe gen below max is a fault (idle GPUs downshift)
LOW_CLOCK_FRACTION = 0.6        # SM clock below this × max while busy: noted as evidence
STRAY_MIN_MIB = 256.0           # a process holding less GPU memory is not worth a finding

_LOST_MARKERS = ("gpu is lost", "unknown error", "requires reset", "fallen off the bus",
                 "unable to determine the device handle")
_UNSET = ("[n/a]", "n/a", "[not supported]", "not supported", "")


def _num(v: str | None) -> float | None:
    if v is None or v.strip().lower() in _UNSET:
        return None
    try:
        return float(v.strip().split()[0])
    except (ValueError, IndexError):
        return None


def _hex(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v.strip(), 16) if v.strip().lower().startswith("0x") else None
    except ValueError:
        return None


def _yes(v: str | None) -> bool:
    return v is not None and v.strip().lower() == "yes"


def bus_key(bus_id: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00`` → ``3b:00`` (bus:device), for matching XID lines."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) < 2:
        return bus_id.strip().lower()
    return f"{parts[-2][-2:]}:{parts[-1].split('.')[0]}"


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU line of ``--query-gpu`` as field → raw text (values stay text until judged)."""

    values: dict[str, str]

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def num(self, name: str) -> float | None:
        return _num(self.values.get(name))

    @property
    def index(self) -> int | None:
        n = self.num("index")
        return None if n is None else int(n)

    def lost(self) -> bool:
        return any(m in v.lower() for v in self.values.values() for m in _LOST_MARKERS)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)


def parse_gpu_rows(text: str, fields: Sequence[str] = GPU_FIELDS) -> list[GpuRow]:
    """The CSV lines of ``--query-gpu`` with ``fields``; lines of another width are left out."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(fields):
            rows.append(GpuRow(dict(zip(fields, cells, strict=True))))
    return rows


def invalid_fields(text: str) -> list[str]:
    """Field names nvidia-smi refused (``Field "x" is not a valid field to query.``)."""
    return re.findall(r'Field "([^"]+)" is not a valid field', text)


def gpu_lost_message(text: str) -> str | None:
    """nvidia-smi's own words when a GPU is lost or its handle cannot be read, else None."""
    for line in text.splitlines():
        low = line.lower()
        if any(m in low for m in _LOST_MARKERS):
            return line.strip()[:300]
    return None


def gpu_findings(rows: Sequence[GpuRow], check: str = "nvidia_smi",
                 expected_gpus: int | None = None) -> list[Finding]:
    """What the GPU state says: ECC, remapping, throttling, clocks, PCIe, lost GPUs."""
    out: list[Finding] = []
    if expected_gpus is not None and len(rows) < expected_gpus:
        out.append(Finding("gpu_missing", check, f"{len(rows)} GPUs visible, {expected_gpus} "
                           "expected: a GPU fell off the bus or its driver lost it",
                           data={"visible": len(rows), "expected": expected_gpus}))
    for r in rows:
        gpu = r.index
        if r.lost():
            out.append(Finding("gpu_lost", check, "nvidia-smi cannot read this GPU: "
                               + ", ".join(f"{k}={v}" for k, v in r.values.items()
                                           if any(m in v.lower() for m in _LOST_MARKERS))[:200],
                               gpu=gpu))
            continue
        vol = r.num("ecc.errors.uncorrected.volatile.total")
        agg = r.num("ecc.errors.uncorrected.aggregate.total")
        if (vol or 0) > 0 or (agg or 0) > 0:
            out.append(Finding("ecc_uncorrectable", check,
                               f"uncorrectable ECC errors: volatile {vol:g}, aggregate {agg:g}"
                               if vol is not None and agg is not None else
                               f"uncorrectable ECC errors: volatile {vol}, aggregate {agg}",
                               gpu=gpu, data={"volatile": vol, "aggregate": agg}))
        if _yes(r.get("remapped_rows.failure")):
            out.append(Finding("row_remap_failure", check, "row remapping failed", gpu=gpu))
        if _yes(r.get("remapped_rows.pending")) or _yes(r.get("retired_pages.pending")):
            out.append(Finding("page_retirement_pending", check,
                               "retired pages or remapped rows pending: the GPU needs a reset",
                               gpu=gpu))
        out.extend(_throttle(r, check, gpu))
        out.extend(_pcie(r, check, gpu))
    return out


def _throttle(r: GpuRow, check: str, gpu: int | None) -> list[Finding]:
    mask = _hex(r.get("clocks_throttle_reasons.active"))
    sm, sm_max = r.num("clocks.sm"), r.num("clocks.max.sm")
    clocks = {"clocks_sm_mhz": sm, "clocks_max_sm_mhz": sm_max,
              "temperature_c": r.num("temperature.gpu"), "power_w": r.num("power.draw"),
              "power_limit_w": r.num("power.limit"), "throttle_reasons": r.get("clocks_throttle_reasons.active")}
    clock_text = f"SM {sm:g}/{sm_max:g} MHz" if sm is not None and sm_max else "SM clock unknown"
    out = []
    if mask is not None and mask & (THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL):
        out.append(Finding("thermal_throttle", check,
                           f"thermal slowdown active ({r.get('clocks_throttle_reasons.active')}), "
                           f"{r.num('temperature.gpu')} C, {clock_text}", gpu=gpu, data=clocks))
    if mask is not None and mask & (THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE):
        out.append(Finding("power_throttle", check,
                           f"power cap/brake active ({r.get('clocks_throttle_reasons.active')}), "
                           f"{r.num('power.draw')}/{r.num('power.limit')} W, {clock_text}",
                           gpu=gpu, data=clocks))
    if mask is not None and mask & THROTTLE_HW_SLOWDOWN and not mask & THROTTLE_HW_THERMAL:
        out.append(Finding("hw_slowdown", check, f"hardware slowdown active, {clock_text}",
                           gpu=gpu, data=clocks))
    util = r.num("utilization.gpu")
    if (not out and sm is not None and sm_max and util is not None
            and util >= BUSY_UTILIZATION_PCT and sm < LOW_CLOCK_FRACTION * sm_max):
        out.append(Finding("clocks_low", check, f"{clock_text} at {util:g}% utilization, "
                           "no throttle reason reported", gpu=gpu, data=clocks))
    return out


def _pcie(r: GpuRow, check: str, gpu: int | None) -> list[Finding]:
    gen, gen_max = r.num("pcie.link.gen.current"), r.num("pcie.link.gen.max")
    width, width_max = r.num("pcie.link.width.current"), r.num("pcie.link.width.max")
    util = r.num("utilization.gpu") or 0.0
    data = {"gen": gen, "gen_max": gen_max, "width": width, "width_max": width_max}
    if width is not None and width_max is not None and width < width_max:
        return [Finding("pcie_degraded", check, f"PCIe link x{width:g} of x{width_max:g}",
                        gpu=gpu, data=data)]
    if gen is not None and gen_max is not None and gen < gen_max and util >= BUSY_UTILIZATION_PCT:
        # Idle GPUs lower their link generation to save power; busy ones must not.
        return [Finding("pcie_degraded", check, f"PCIe gen {gen:g} of {gen_max:g} at "
                        f"{util:g}% utilization", gpu=gpu, data=data)]
    return []


@dataclass(frozen=True, slots=True)
class ComputeProc:
    pid: int
    name: str
    used_mib: float | None
    bus: str


def parse_compute_apps(text: str) -> list[ComputeProc]:
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(COMPUTE_FIELDS) or not cells[0].isdigit():
            continue
        out.append(ComputeProc(int(cells[0]), cells[1], _num(cells[2]), cells[3]))
    return out


def process_findings(procs: Sequence[ComputeProc], gpus_by_bus: dict[str, int | None],
                     expected: Sequence[str], check: str = "compute_apps") -> list[Finding]:
    """Stray processes holding GPU memory.

    With ``expected`` (regular expressions of the inference server's process
    names), any other process holding at least ``STRAY_MIN_MIB`` is stray.
    Without it, a GPU with more than one such process has strays (every one
    but the largest). ``gpus_by_bus`` (``bus_key`` → index) labels the findings.
    """
    big = [p for p in procs if (p.used_mib or 0.0) >= STRAY_MIN_MIB]
    pats = [re.compile(e) for e in expected]
    stray: list[ComputeProc] = []
    if pats:
        stray = [p for p in big if not any(x.search(p.name) for x in pats)]
    else:
        by_gpu: dict[str, list[ComputeProc]] = {}
        for p in big:
            by_gpu.setdefault(bus_key(p.bus), []).append(p)
        for ps in by_gpu.values():
            ps.sort(key=lambda p: -(p.used_mib or 0.0))
            stray.extend(ps[1:])
    return [Finding("stray_process", check,
                    f"pid {p.pid} ({p.name}) holds {p.used_mib:g} MiB"
                    + ("" if pats else " next to a larger process on the same GPU"),
                    gpu=gpus_by_bus.get(bus_key(p.bus)),
                    data={"pid": p.pid, "process": p.name, "used_mib": p.used_mib})
            for p in stray]


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\):\s*(\d+)(.*)")
_ISO_TS = re.compile(r"^\s*(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})[,.]?\d*([+-]\d{2}:?\d{2}|Z)?")


@dataclass(frozen=True, slots=True)
class XidEvent:
    xid: int
    bus: str
    ts: float | None
    text: str


def parse_xids(text: str) -> list[XidEvent]:
    """Every ``NVRM: Xid`` line, with its time when the line starts with an ISO timestamp."""
    out = []
    for line in text.splitlines():
        m = _XID.search(line)
        if not m:
            continue
        ts = None
        t = _ISO_TS.match(line)
        if t:
            stamp = t.group(1) + (t.group(2) or "+00:00").replace("Z", "+00:00")
            try:
                ts = datetime.fromisoformat(stamp).timestamp()
            except ValueError:
                ts = None
        out.append(XidEvent(int(m.group(2)), bus_key(m.group(1)), ts, line.strip()[:300]))
    return out


def xid_findings(events: Iterable[XidEvent], now_s: float, lookback_s: float,
                 gpus_by_bus: dict[str, int | None], fatal: frozenset[int] = FATAL_XIDS,
                 check: str = "xid") -> list[Finding]:
    """XIDs in the last ``lookback_s`` (lines without time: since boot).

    One finding per (XID, GPU), with the count and the latest line; ``gpus_by_bus``
    (``bus_key`` → index) only labels them: a GPU that fell off the bus is no
    longer listed by nvidia-smi, and its XID must count all the same.
    """
    seen: dict[tuple[int, str], tuple[int, XidEvent]] = {}
    for e in events:
        if e.ts is not None and now_s - e.ts > lookback_s:
            continue
        n, _ = seen.get((e.xid, e.bus), (0, e))
        seen[(e.xid, e.bus)] = (n + 1, e)
    out = []
    for (xid, bus), (n, e) in sorted(seen.items()):
        kind = ("xid_fatal" if xid in fatal else
                "xid_transient" if xid in TRANSIENT_XIDS else "xid_other")
        out.append(Finding(kind, check, f"XID {xid} x{n} on PCI {bus}: {e.text}",
                           gpu=gpus_by_bus.get(bus), data={"xid": xid, "count": n, "bus": bus}))
    return out


# dcgmi diag rows whose failure is the GPU's hardware, and those that mean a stray process.
DCGM_HARDWARE = ("page retirement", "row remap", "inforom", "pcie", "memory", "diagnostic",
                 "targeted stress", "targeted power", "sm stress", "memory bandwidth", "nvlink")
DCGM_PROCESSES = ("graphics processes", "compute processes")


def dcgmi_findings(text: str, check: str = "dcgmi") -> list[Finding]:
    """``Fail`` rows of ``dcgmi diag``: hardware, stray processes, or anything else."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[1].lower().startswith("fail"):
            continue
        test = cells[0]
        low = test.lower()
        kind = ("stray_process" if any(k in low for k in DCGM_PROCESSES) else
                "dcgm_hardware_fail" if any(k in low for k in DCGM_HARDWARE) else "dcgm_fail")
        out.append(Finding(kind, check, f"dcgmi diag: {test}: {cells[1]}"[:300],
                           data={"test": test}))
    return out


def dcgmi_ran(text: str) -> bool:
    """Whether dcgmi printed a result table at all."""
    return any(line.strip().startswith("|") and line.count("|") >= 3 for line in text.splitlines())


def gemm_findings(measured: dict[int, float], history: dict[int, list[float]],
                  peer_tflops: float | None, min_ratio: float,
                  check: str = "gemm") -> list[Finding]:
    """A GPU whose GEMM TFLOP/s is below ``min_ratio`` × its own median or the peers' figure."""
    out = []
    for gpu, tflops in sorted(measured.items()):
        past = history.get(gpu, [])
        refs = {}
        if past:
            refs["own median"] = statistics.median(past)
        if peer_tflops is not None and peer_tflops > 0:
            refs["peers"] = peer_tflops
        low = {name: ref for name, ref in refs.items() if tflops < min_ratio * ref}
        if low:
            text = ", ".join(f"{tflops / ref:.2f}x {name} ({ref:.1f})" for name, ref in low.items())
            out.append(Finding("gemm_slow", check, f"GEMM {tflops:.1f} TFLOP/s: {text}",
                               gpu=gpu, data={"tflops": tflops, **{k.replace(" ", "_"): v
                                                                   for k, v in refs.items()}}))
    return out


USER_VERDICTS = ("ok", "recoverable", "not_recoverable", "inconclusive")


def user_check_findings(name: str, exit_code: int, stdout: str, on_fail: str) -> list[Finding]:
    """A user check: JSON ``{"verdict": …, "detail": …}`` (or ``{"ok": bool}``) wins over the exit code.

    ``verdict`` ``ok`` means nothing found; otherwise the finding's kind is
    ``user_<verdict>``. Without JSON, exit code 0 is ok and anything else is
    ``user_<on_fail>``.
    """
    check = f"user:{name}"
    doc: Any = None
    text = stdout.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
    if isinstance(doc, dict):
        v = doc.get("verdict")
        if v is None and isinstance(doc.get("ok"), bool):
            v = "ok" if doc["ok"] else on_fail
        if v in USER_VERDICTS:
            if v == "ok":
                return []
            detail = str(doc.get("detail", ""))[:300] or f"{name} reported {v}"
            return [Finding(f"user_{v}", check, detail, data={"exit_code": exit_code})]
    if exit_code == 0:
        return []
    tail = text.splitlines()[-1][:200] if text else ""
    return [Finding(f"user_{on_fail}", check, f"{name} exited {exit_code}" + (f": {tail}" if tail else ""),
                    data={"exit_code": exit_code})]
