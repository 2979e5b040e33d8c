"""The import picture keeps its rules (the core's own purity is in test_core_purity.py).

- ``tailguard.emitter`` imports neither ``tailguard.core`` nor ``tailguard.streaming`` (nor any other
  ``tailguard`` package), and needs nothing beyond aiokafka and orjson; only
  ``middleware_aiohttp`` may import aiohttp, and ``tailguard.emitter`` loads it on demand.
- ``tailguard.routing`` does not import ``tailguard.streaming`` (or faust).
- The base dependencies in pyproject.toml are the emitter's: ``pip install
  tailguard[emitter]`` brings aiokafka and orjson, nothing else.

Two checks per rule: the sources' import statements (function-level imports
included, read as syntax trees), and what a fresh interpreter actually loads.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
STDLIB = sys.stdlib_module_names


def imported_roots(source: str, package: str) -> set[str]:
    """Top-level names (``tailguard.core`` counts as ``tailguard.core``) that ``source`` imports anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [package] if node.level else [node.module or ""]  # relative: inside the package
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.add(".".join(parts[:2]) if parts[0] == "tailguard" else parts[0])
    return found


def package_imports(package: str) -> dict[str, set[str]]:
    """File name → non-stdlib roots imported by each module of ``tailguard.<package>``."""
    out: dict[str, set[str]] = {}
    for path in sorted((APP / package).rglob("*.py")):
        roots = imported_roots(path.read_text(encoding="utf-8"), f"tailguard.{package}")
        out[path.name] = {r for r in roots if r not in STDLIB}
    return out


def loaded_by(modules: list[str]) -> set[str]:
    """Modules a fresh interpreter holds after importing ``modules``."""
    probe = textwrap.dedent(
        """
        import importlib, json, sys
        for name in sys.argv[1:]:
            importlib.import_module(name)
        print(json.dumps(sorted(sys.modules)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", probe, *modules], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_static_check_sees_every_kind_of_import() -> None:
    source = ("import faust\nfrom tailguard.core.contract.types import X\nfrom . import wire\n"
              "def f():\n    import redis.asyncio\n")
    assert imported_roots(source, "tailguard.emitter") == {"faust", "tailguard.core", "tailguard.emitter", "redis"}


def test_emitter_sources_import_only_aiokafka_orjson_and_themselves() -> None:
    allowed = {"tailguard.emitter", "aiokafka", "orjson"}
    bad = {name: roots - allowed for name, roots in package_imports("emitter").items()
           if name != "middleware_aiohttp.py" and roots - allowed}
    assert bad == {}


def test_only_the_aiohttp_middleware_imports_aiohttp() -> None:
    assert package_imports("emitter")["middleware_aiohttp.py"] == {"aiohttp", "tailguard.emitter"}


def test_importing_the_emitter_loads_no_core_streaming_or_service_library() -> None:
    loaded = loaded_by(["tailguard.emitter", "tailguard.emitter.sync", "tailguard.emitter.middleware",
                        "tailguard.emitter.wire"])
    assert "tailguard.emitter" in loaded
    app_packages = {".".join(m.split(".")[:2]) for m in loaded if m.startswith("tailguard.")}
    assert app_packages == {"tailguard.emitter"}
    roots = {m.split(".")[0] for m in loaded}
    assert not roots & {"faust", "mode", "redis", "numpy", "aiohttp", "fastdigest", "prometheus_client"}


def test_the_aiohttp_names_load_on_demand() -> None:
    from tailguard.emitter import AIOHTTP_INFO_KEY, aiohttp_middleware, middleware_aiohttp

    assert aiohttp_middleware is middleware_aiohttp.aiohttp_middleware
    assert AIOHTTP_INFO_KEY is middleware_aiohttp.AIOHTTP_INFO_KEY
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = __import__("tailguard.emitter").emitter.no_such_name


def test_routing_does_not_import_streaming() -> None:
    bad = {name: roots for name, roots in package_imports("routing").items()
           if roots & {"tailguard.streaming", "faust", "mode"}}
    assert bad == {}
    modules = ["tailguard.routing"] + [f"tailguard.routing.{p.stem}" for p in sorted((APP / "routing").glob("*.py"))
                                 if p.stem != "__init__"]
    loaded = loaded_by(modules)
    assert not {m for m in loaded if m.startswith("tailguard.streaming") or m.split(".")[0] in ("faust", "mode")}


def test_core_sources_import_no_other_app_package() -> None:
    """The core is the bottom layer: it imports no app package above it (streaming, routing, …)."""
    bad = {name: {r for r in roots if r.startswith("tailguard.") and r != "tailguard.core"}
           for name, roots in package_imports("core").items()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_base_dependencies_are_the_emitters() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {req.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for req in project["dependencies"]}
    assert base == {"aiokafka", "orjson"}
    extras = project["optional-dependencies"]
    assert extras["emitter"] == []
    worker = {req.split(">")[0].split("[")[0].strip() for req in extras["worker"]}
    assert {"faust-streaming", "redis", "numpy", "aiohttp", "fastdigest"} <= worker
    assert "tailguard[worker]" in extras["dev"]


def test_the_replay_command_loads_no_streaming_or_redis() -> None:
    """``tailguard replay`` is the core plus a command line: no faust, Kafka client or Redis."""
    loaded = loaded_by(["tailguard.cli", "tailguard.replay_cli"])
    assert "tailguard.core.replay.replay" in loaded
    assert not {m for m in loaded if m.startswith(("tailguard.streaming", "tailguard.routing"))}
    assert not {m.split(".")[0] for m in loaded} & {"faust", "mode", "aiokafka", "redis"}
