"""Every module under bench/ imports: a move inside the package (a room, a rename) that a
benchmark still names fails here, in the suite, not on the day someone runs ``scripts/bench``.
Importing runs no benchmark (each one runs from its ``main``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


def test_there_are_benchmarks() -> None:
    assert any(m.startswith("bench_") for m in MODULES), MODULES


@pytest.mark.parametrize("module", MODULES)
def test_the_benchmark_module_imports(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    importlib.import_module(f"bench.{module}")
    assert f"bench.{module}" in sys.modules
