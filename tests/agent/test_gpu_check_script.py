"""scripts/gpu-check: skips without a GPU; on (fake) GPU tools it runs the agent's real path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_fakes import fake_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "TAILGUARD_PYTHON": sys.executable}
    return subprocess.run([str(ROOT / "scripts" / "gpu-check"), "node-x"], env=env, capture_output=True,
                          text=True, timeout=50)


def test_without_nvidia_smi_it_skips_and_passes(tmp_path: Path) -> None:
    bare = {k: v for k, v in os.environ.items() if k != "PATH"}
    bare["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                   if not (Path(p) / "nvidia-smi").exists())
    out = _run(bare)
    assert out.returncode == 0 and "skip: no nvidia-smi" in out.stdout, out


@pytest.mark.parametrize(("case", "verdict"), [("xid79", "not_recoverable"), ("healthy", "inconclusive")])
def test_with_gpu_tools_it_reports_the_verdict_and_passes(case: str, verdict: str) -> None:
    out = _run(fake_env(case))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"verdict: {verdict}" in out.stdout and "ok: the agent's real path ran" in out.stdout


def test_an_unreadable_nvidia_smi_fails_it(tmp_path: Path) -> None:
    broken = tmp_path / "nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn't communicate with the "
                      "NVIDIA driver.'\nexit 9\n")
    broken.chmod(0o755)
    env = fake_env("healthy")
    env["PATH"] = f"{tmp_path}{os.pathsep}{env['PATH']}"
    out = _run(env)
    assert out.returncode == 1 and "could not read it" in out.stdout, out.stdout
