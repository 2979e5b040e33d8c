"""Running a second copy of a stack script (scripts/kafka, scripts/redis-sentinel,
scripts/redis-cluster) beside the shared stack: a free port range, and the script run with its
own environment."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

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


class ScriptCluster:
    """``scripts/redis-cluster`` beside the shared stack: 3 primaries (and one replica each with
    ``replicas=1``) on the first free port range of ``bases``, its state under ``run_dir``."""

    def __init__(self, run_dir: Path, bases: Iterable[int], replicas: int = 0) -> None:
        nodes = 3 * (1 + replicas)
        base = free_base(bases, lambda b: [p for i in range(nodes) for p in (b + i, b + 10000 + i)],
                         "a Redis Cluster of 3 primaries" + (f" and {nodes - 3} replicas" if replicas else ""))
        self.port = base
        self.ports = [base + i for i in range(nodes)]
        self.url = f"redis://127.0.0.1:{base}/0"
        self.run_dir = run_dir
        self.env = {**os.environ, "TAILGUARD_RUN": str(run_dir), "TAILGUARD_REDIS_CLUSTER_PORT": str(base)}
        if replicas:
            self.env["TAILGUARD_REDIS_CLUSTER_REPLICAS"] = str(replicas)

    def run(self, *args: str) -> str:
        return run_script("redis-cluster", self.env, *args, timeout_s=60)

    def pid(self, port: int) -> int:
        return int((self.run_dir / "redis-cluster" / f"node-{port}.pid").read_text().strip())
