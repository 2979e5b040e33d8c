"""Running a second copy of a stack script (scripts/kafka, scripts/redis-sentinel) beside the
shared stack: a free port range, and the script run with its own environment."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping

from worker_harness import ROOT


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def free_base(bases: Iterable[int], ports_of: Callable[[int], Iterable[int]], what: str) -> int:
    """The first of ``bases`` whose ports (``ports_of(base)``) are all free on 127.0.0.1."""
    tried = list(bases)
    base = next((b for b in tried if all(port_free(p) for p in ports_of(b))), None)
    assert base is not None, f"no free ports for {what} (tried the ranges at {tried})"
    return base


def run_script(name: str, env: Mapping[str, str], *args: str, timeout_s: float = 300) -> str:
    """``scripts/<name> ARGS…`` with ``env``; its stdout (a failure names its stderr's end)."""
    done = subprocess.run([str(ROOT / "scripts" / name), *args], env=dict(env),
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"scripts/{name} {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout
