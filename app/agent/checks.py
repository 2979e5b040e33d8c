"""Running the check suite: each tool in a subprocess with its own timeout.

:class:`Suite` runs, for one node, in this order (GPU-heavy checks last and
alone, so they do not disturb each other's numbers):

1. ``nvidia_smi`` — ``nvidia-smi --query-gpu`` (asked again without each field
   this driver does not know);
2. at once: ``compute_apps`` (stray processes), ``xid`` (``dmesg``, else
   ``journalctl -k``) and the user checks from the config file;
3. ``gemm`` — :mod:`tailguard.agent.gemm` in a subprocess (needs torch with CUDA);
4. ``dcgmi`` — ``dcgmi diag -r <level>`` when DCGM is installed.

Guarantees: a check whose tool is absent (or not permitted) is ``skipped``
with a note; a check that exceeds its timeout is ``timeout`` and its process
group is killed (a process stuck in the kernel is abandoned after a 2-s
grace, never waited for); a check that fails in any other way is ``error``.
:meth:`Suite.run` therefore returns within the sum of the timeouts plus a
few seconds, and never raises for anything a tool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.agent import parse
from tailguard.agent.config import AgentConfig, NodeSpec, UserCheck
from tailguard.agent.findings import CheckOutcome, CheckStatus, Finding
from tailguard.kafka_security import SECRET_VARS

log = logging.getLogger(__name__)
KILL_GRACE_S = 2.0
MAX_FIELD_RETRIES = 8          # nvidia-smi names one unknown field per try
OUTPUT_LIMIT = 4 * 1024 * 1024   # bytes of a tool's stdout kept (dmesg can be large)


@dataclass(frozen=True, slots=True)
class ToolRun:
    """One finished (or abandoned) subprocess."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    missing: bool = False
    duration_s: float = 0.0

    def tail(self, n: int = 200) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[-1][:n] if text else ""


async def run_tool(argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None,
                   which: Callable[[str], str | None] = shutil.which) -> ToolRun:
    """Run ``argv`` with a timeout; ``missing`` when its program is not on PATH."""
    t0 = time.monotonic()
    exe = which(argv[0]) if env is None else shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if exe is None:
        return ToolRun(None, missing=True)
    try:
        proc = await asyncio.create_subprocess_exec(
            exe, *argv[1:], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True, env=env)
    except OSError as e:
        return ToolRun(None, stderr=f"{type(e).__name__}: {e}", duration_s=time.monotonic() - t0)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
        return ToolRun(None, timed_out=True, duration_s=time.monotonic() - t0)
    return ToolRun(proc.returncode, out[:OUTPUT_LIMIT].decode(errors="replace"),
                   err[-65536:].decode(errors="replace"), duration_s=time.monotonic() - t0)


@dataclass
class SuiteReport:
    """Every check's outcome, and the GPU rows nvidia-smi printed (for the result's evidence)."""

    outcomes: list[CheckOutcome] = field(default_factory=list)
    gpus: list[dict[str, str]] = field(default_factory=list)


def _outcome(name: str, run: ToolRun, timeout_s: float, tool: str) -> CheckOutcome | None:
    """The outcome of a run that did not produce output to parse, else None."""
    if run.missing:
        return CheckOutcome(name, "skipped", 0.0, f"{tool} not found on PATH")
    if run.timed_out:
        return CheckOutcome(name, "timeout", run.duration_s, f"{tool} did not finish in {timeout_s:g} s")
    return None


class Suite:
    """The check suite of one agent (``cfg``); ``clock`` is wall time (for XID recency)."""

    def __init__(self, cfg: AgentConfig, clock: Callable[[], float] = time.time,
                 env: dict[str, str] | None = None) -> None:
        self.cfg, self.clock = cfg, clock
        # The tools and user checks never see the Kafka passwords the agent itself uses.
        secret = {*SECRET_VARS, *(v + "_FILE" for v in SECRET_VARS)}
        self.env = {k: v for k, v in (os.environ if env is None else env).items() if k not in secret}

    async def run(self, node: NodeSpec, model: str = "", peer_tflops: float | None = None) -> SuiteReport:
        rep = SuiteReport()
        smi, rows = await self.nvidia_smi(node)
        rep.outcomes.append(smi)
        rep.gpus = [r.to_dict() for r in rows]
        labels = {parse.bus_key(r.get("pci.bus_id") or ""): r.index for r in rows}
        only = ({b for b, i in labels.items() if i in node.gpus} if node.gpus is not None else None)
        parallel = [self.compute_apps(node, labels, only), self.xid(labels, only),
                    *(self.user_check(c, node, model) for c in self.cfg.user_checks)]
        rep.outcomes.extend(await asyncio.gather(*parallel))
        rep.outcomes.append(await self.gemm(node, peer_tflops))
        rep.outcomes.append(await self.dcgmi(node))
        return rep

    def _gpu_args(self, node: NodeSpec) -> list[str]:
        return ["-i", ",".join(str(g) for g in node.gpus)] if node.gpus is not None else []

    async def nvidia_smi(self, node: NodeSpec) -> tuple[CheckOutcome, list[parse.GpuRow]]:
        name, timeout = "nvidia_smi", self.cfg.timeout("nvidia_smi")
        fields = list(parse.GPU_FIELDS)
        t0 = time.monotonic()
        for _ in range(MAX_FIELD_RETRIES + 1):
            argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                    *self._gpu_args(node)]
            run = await run_tool(argv, max(0.1, timeout - (time.monotonic() - t0)), self.env)
            early = _outcome(name, run, timeout, "nvidia-smi")
            if early is not None:
                return early, []
            bad = parse.invalid_fields(run.stdout + run.stderr)
            if not bad or not set(bad) & set(fields):
                break
            fields = [f for f in fields if f not in bad]  # an older driver: ask without them
        took = time.monotonic() - t0
        rows = parse.parse_gpu_rows(run.stdout, fields)
        findings = parse.gpu_findings(rows, name, self.cfg.expected_gpus)
        lost = parse.gpu_lost_message(run.stdout + "\n" + run.stderr)
        if lost and not any(f.kind == "gpu_lost" for f in findings):
            findings.insert(0, Finding("gpu_lost", name, f"nvidia-smi: {lost}"))
        if run.exit_code != 0 and not findings:
            return CheckOutcome(name, "error", took,
                                f"nvidia-smi exited {run.exit_code}: {run.tail()}"), rows
        note = "" if run.exit_code == 0 else f"nvidia-smi exited {run.exit_code}"
        if len(fields) < len(parse.GPU_FIELDS):
            note = (note + "; " if note else "") + "not reported by this driver: " + ", ".join(
                f for f in parse.GPU_FIELDS if f not in fields)
        return CheckOutcome(name, "ok", took, note, tuple(findings)), rows

    async def compute_apps(self, node: NodeSpec, labels: dict[str, int | None],
                           only: set[str] | None) -> CheckOutcome:
        name, timeout = "compute_apps", self.cfg.timeout("compute_apps")
        run = await run_tool(["nvidia-smi", f"--query-compute-apps={','.join(parse.COMPUTE_FIELDS)}",
                              "--format=csv,noheader,nounits"], timeout, self.env)
        early = _outcome(name, run, timeout, "nvidia-smi")
        if early is not None:
            return early
        if run.exit_code != 0:
            return CheckOutcome(name, "error", run.duration_s, f"nvidia-smi exited {run.exit_code}: {run.tail()}")
        procs = parse.parse_compute_apps(run.stdout)
        if only is not None:
            procs = [p for p in procs if parse.bus_key(p.bus) in only]
        found = parse.process_findings(procs, labels, self.cfg.expected_processes, name)
        return CheckOutcome(name, "ok", run.duration_s, f"{len(procs)} compute processes",
                            tuple(found))

    async def xid(self, labels: dict[str, int | None], only: set[str] | None) -> CheckOutcome:
        name, timeout = "xid", self.cfg.timeout("xid")
        now = self.clock()
        notes = []
        for argv in (["dmesg", "--time-format=iso"],
                     ["journalctl", "-k", "-o", "short-iso", "--no-pager",
                      f"--since=@{int(now - self.cfg.xid_lookback_s)}"]):
            run = await run_tool(argv, timeout, self.env)
            if run.missing:
                notes.append(f"{argv[0]} not found")
                continue
            if run.timed_out:
                return CheckOutcome(name, "timeout", run.duration_s, f"{argv[0]} did not finish in {timeout:g} s")
            if run.exit_code != 0:
                notes.append(f"{argv[0]} exited {run.exit_code}: {run.tail()}")
                continue
            events = parse.parse_xids(run.stdout)
            if only is not None:
                events = [e for e in events if e.bus in only]
            found = parse.xid_findings(events, now, self.cfg.xid_lookback_s, labels,
                                       self.cfg.fatal_xids, name)
            return CheckOutcome(name, "ok", run.duration_s, f"read with {argv[0]}", tuple(found))
        return CheckOutcome(name, "skipped", 0.0, "kernel log unreadable: " + "; ".join(notes)
                            + " (the agent needs CAP_SYSLOG, root, or kernel.dmesg_restrict=0)")

    async def dcgmi(self, node: NodeSpec) -> CheckOutcome:
        name, timeout = "dcgmi", self.cfg.timeout("dcgmi")
        argv = ["dcgmi", "diag", "-r", str(self.cfg.dcgmi_level)]
        if node.gpus is not None:
            argv += ["-i", ",".join(str(g) for g in node.gpus)]
        run = await run_tool(argv, timeout, self.env)
        early = _outcome(name, run, timeout, "dcgmi")
        if early is not None:
            return early
        if not parse.dcgmi_ran(run.stdout):
            return CheckOutcome(name, "error", run.duration_s,
                                f"dcgmi exited {run.exit_code} without results: {run.tail()} "
                                "(is nv-hostengine running?)")
        return CheckOutcome(name, "ok", run.duration_s, f"dcgmi diag -r {self.cfg.dcgmi_level}",
                            tuple(parse.dcgmi_findings(run.stdout, name)))

    async def gemm(self, node: NodeSpec, peer_tflops: float | None) -> CheckOutcome:
        name, timeout = "gemm", self.cfg.timeout("gemm")
        argv = list(self.cfg.gemm_command) or [sys.executable, "-m", "tailguard.agent.gemm"]
        argv += ["--size", str(self.cfg.gemm_size), "--iters", str(self.cfg.gemm_iters)]
        if node.gpus is not None:
            argv += ["--gpus", ",".join(str(g) for g in node.gpus)]
        run = await run_tool(argv, timeout, self.env)
        early = _outcome(name, run, timeout, argv[0])
        if early is not None:
            return early
        doc: Any = None
        with contextlib.suppress(ValueError):
            doc = json.loads(run.stdout.strip().splitlines()[-1]) if run.stdout.strip() else None
        if isinstance(doc, dict) and isinstance(doc.get("skip"), str):
            return CheckOutcome(name, "skipped", run.duration_s, doc["skip"])
        res = doc.get("tflops") if isinstance(doc, dict) else None
        if run.exit_code != 0 or not isinstance(res, dict):
            return CheckOutcome(name, "error", run.duration_s, f"GEMM exited {run.exit_code}: {run.tail()}")
        measured = {int(k): float(v) for k, v in res.items()}
        history = self._gemm_history(node)
        found = parse.gemm_findings(measured, history, peer_tflops, self.cfg.gemm_min_ratio, name)
        slow = {f.gpu for f in found}
        self._save_gemm_history(node, {g: t for g, t in measured.items() if g not in slow}, history)
        text = ", ".join(f"GPU {g}: {t:.1f} TFLOP/s" for g, t in sorted(measured.items()))
        return CheckOutcome(name, "ok", run.duration_s, text, tuple(found))

    def _history_file(self, node: NodeSpec) -> Any:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node.node_id)
        return self.cfg.state_path / f"gemm-{safe}.json"

    def _gemm_history(self, node: NodeSpec) -> dict[int, list[float]]:
        try:
            doc = json.loads(self._history_file(node).read_text())
            return {int(k): [float(x) for x in v] for k, v in doc.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _save_gemm_history(self, node: NodeSpec, new: dict[int, float],
                           history: dict[int, list[float]]) -> None:
        """Keep the last ``gemm_history`` normal results per GPU (slow ones would drag the median)."""
        if not new:
            return
        for g, t in new.items():
            history[g] = [*history.get(g, []), t][-self.cfg.gemm_history:]
        path = self._history_file(node)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({str(k): v for k, v in history.items()}))
            tmp.replace(path)
        except OSError as e:
            log.warning("cannot keep GEMM history in %s: %s", path, e)

    async def user_check(self, c: UserCheck, node: NodeSpec, model: str) -> CheckOutcome:
        name = f"user:{c.name}"
        env = {**self.env, "TAILGUARD_NODE_ID": node.node_id, "TAILGUARD_MODEL": model,
               "TAILGUARD_GPUS": ",".join(str(g) for g in node.gpus or ())}
        run = await run_tool(c.command, c.timeout_s, env)
        early = _outcome(name, run, c.timeout_s, c.command[0])
        if early is not None:
            return early
        if run.exit_code is None:
            return CheckOutcome(name, "error", run.duration_s, run.tail())
        found = parse.user_check_findings(c.name, run.exit_code, run.stdout, c.on_fail)
        status: CheckStatus = "ok"
        return CheckOutcome(name, status, run.duration_s, f"exit {run.exit_code}", tuple(found))
