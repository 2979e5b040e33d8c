"""``tailguard.core`` stays pure: no Kafka, Redis or faust, no clock, no environment.

ruff's TID251 bans the imports by name; this test catches what a linter
cannot: a core module that imports some non-core module which pulls faust,
aiokafka or redis in. It imports every ``tailguard.core`` module in a fresh
interpreter and reports which module dragged in what. It also reads the
sources (as syntax trees, so docstrings may mention them) for wall-clock and
environment reads: time is a parameter in the core (docs/code-map.md).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tailguard.core

CORE_DIR = Path(tailguard.core.__file__).parent
BANNED_MODULES = ("faust", "mode", "aiokafka", "kafka", "redis")
# (module, attribute) reads that bring the wall clock or the environment into the core.
BANNED_ATTRS = {
    ("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "monotonic_ns"),
    ("time", "perf_counter"), ("time", "sleep"),
    ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
    ("os", "environ"), ("os", "getenv"), ("os", "environb"), ("os", "putenv"),
}


def core_modules() -> list[str]:
    names = ["tailguard.core"]
    names += [m.name for m in pkgutil.walk_packages([str(CORE_DIR)], prefix="tailguard.core.")]
    return sorted(names)


def banned_imports_by_module(modules: list[str]) -> dict[str, list[str]]:
    """Import ``modules`` in order in a fresh interpreter; what banned roots did each add?"""
    probe = textwrap.dedent(
        """
        import importlib, json, sys
        banned = set(sys.argv[1].split(","))
        seen, out = set(), {}
        for name in sys.argv[2:]:
            importlib.import_module(name)
            now = {m.split(".")[0] for m in sys.modules} & banned
            out[name] = sorted(now - seen)
            seen |= now
        print(json.dumps(out))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, ",".join(BANNED_MODULES), *modules],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"importing tailguard.core failed:\n{proc.stderr}"
    result: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_there_are_core_modules_to_check() -> None:
    assert {"tailguard.core", "tailguard.core.contract.config", "tailguard.core.contract.types"} <= set(core_modules())


def test_importing_the_core_pulls_in_no_kafka_redis_or_faust() -> None:
    offenders = {m: b for m, b in banned_imports_by_module(core_modules()).items() if b}
    assert offenders == {}, f"tailguard.core modules import I/O libraries: {offenders}"


def test_the_import_probe_can_see_a_banned_import() -> None:
    """The check above is not vacuous: the probe reports a module that pulls redis in."""
    assert banned_imports_by_module(["json", "redis"]) == {"json": [], "redis": ["redis"]}


def banned_reads(source: str) -> list[str]:
    """``module.attr`` wall-clock / environment reads in ``source``, with line numbers."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            base = node.value
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if (base_name, node.attr) in BANNED_ATTRS:
                found.append(f"line {node.lineno}: {base_name}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "os", "datetime"):
            for alias in node.names:
                if (node.module, alias.name) in BANNED_ATTRS:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    return found


@pytest.mark.parametrize("path", sorted(CORE_DIR.rglob("*.py")), ids=lambda p: p.name)
def test_core_source_reads_no_clock_and_no_environment(path: Path) -> None:
    assert banned_reads(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "hit"),
    [
        ("import time\nx = time.time()", "time.time"),
        ("import datetime\nx = datetime.datetime.now()", "datetime.now"),
        ("from datetime import datetime\nx = datetime.now()", "datetime.now"),
        ("import os\nx = os.environ['A']", "os.environ"),
        ("import os\nx = os.getenv('A')", "os.getenv"),
        ("from os import environ", "from os import environ"),
        ("from time import monotonic", "from time import monotonic"),
    ],
)
def test_the_source_check_catches_clock_and_environment_reads(source: str, hit: str) -> None:
    found = banned_reads(source)
    assert len(found) == 1 and hit in found[0]


def test_the_source_check_allows_time_as_a_parameter() -> None:
    source = '"""Never calls time.time(); now_s is passed in."""\ndef f(now_s: float) -> float:\n    return now_s + 1\n'
    assert banned_reads(source) == []
