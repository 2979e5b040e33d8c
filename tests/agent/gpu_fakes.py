"""The fake GPU tools of tests/fixtures/gpu: an environment that puts them first on PATH.

``fake_env(case)`` → os.environ with ``tests/fixtures/gpu/bin`` first on PATH and
``TAILGUARD_FAKE_GPU_CASE`` pointing at ``tests/fixtures/gpu/cases/<case>`` (see its README).
"""

from __future__ import annotations

import os
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
CASES = ("healthy", "thermal", "ecc", "xid79", "stray", "hung", "old_driver")


def fake_env(case: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{FIXTURES / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["TAILGUARD_FAKE_GPU_CASE"] = str(FIXTURES / "cases" / case)
    return env
