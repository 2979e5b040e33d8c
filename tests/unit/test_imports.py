"""The import picture of the package: the core's rooms in stage order, and no module circles.

- ``tailguard.core`` is four rooms, each importing only from the rooms before it:
  contract <- window (stage 1) <- judge (stage 2) <- replay. A judge module that
  imports the window room, or a contract module that imports a stage, fails here.
- No import circle anywhere in the package: the graph of which module imports which has no
  cycle (:func:`test_the_package_has_no_import_circle` names every one it finds).
- No ``app/`` source imports the old package name ``app`` (the import package is ``tailguard``).

Imports are read from the sources as syntax trees, and every import counts: module-level,
under ``if TYPE_CHECKING:`` (a type-only circle is still two modules that need each other)
and inside functions (a lazy import that closes a circle only hides it). Importing
``a.b.c`` also runs the packages ``a.b`` and ``a`` (their ``__init__``), so those count as
imported too, except a module's own packages. When two modules need each other, the piece
they share moves to where its name says it belongs (a command line to its ``*_cli`` module,
the settings a check reads to a Protocol beside the check).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
ROOMS = ("contract", "window", "judge", "replay")


def module_name(path: Path) -> str:
    parts = path.relative_to(APP).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("tailguard", *parts))


def imports_of(path: Path, source: str | None = None) -> set[str]:
    """Absolute module names ``path`` (or ``source`` placed at ``path``) imports anywhere,
    relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8") if source is None else source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["tailguard", "core"] and len(parts) > 2 and parts[2] in ROOMS:
        return parts[2]
    return None


def test_every_core_module_lives_in_a_room() -> None:
    loose = [p.name for p in (APP / "core").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"app/core/ modules outside the rooms {ROOMS}: {loose}"
    for room in ROOMS:
        assert ast.get_docstring(ast.parse((APP / "core" / room / "__init__.py").read_text(encoding="utf-8"))), room


def test_no_room_imports_a_later_room() -> None:
    bad: dict[str, list[str]] = {}
    for path in sorted((APP / "core").rglob("*.py")):
        mine = room_of(module_name(path))
        if mine is None:
            continue
        later = sorted({m for m in imports_of(path)
                        if (r := room_of(m)) is not None and ROOMS.index(r) > ROOMS.index(mine)})
        if later:
            bad[str(path.relative_to(ROOT))] = later
    assert bad == {}, f"a room imports a later stage's room (order: {' <- '.join(ROOMS)}): {bad}"


def test_the_room_rule_sees_a_backward_import() -> None:
    """The check can fail: a window module importing the judge room is caught, relative or absolute."""
    probe = APP / "core" / "window" / "probe.py"  # never written: the source is passed in
    for source in ("from tailguard.core.judge import health\n", "from ..judge.rules import Judgement\n",
                   "def f():\n    import tailguard.core.replay.detector\n"):
        assert {room_of(m) for m in imports_of(probe, source)} & {"judge", "replay"}, source


def test_no_source_imports_the_old_package_name() -> None:
    bad = sorted(str(p.relative_to(ROOT)) for p in APP.rglob("*.py")
                 if any(m == "app" or m.startswith("app.") for m in imports_of(p)))
    assert bad == [], f"these import `app…`; the package is `tailguard` : {bad}"


def test_the_core_calls_no_garbage_collector() -> None:
    """Pausing the collector is the caller's choice (tailguard.collector), never the core's."""
    bad = sorted(str(p.relative_to(ROOT)) for p in (APP / "core").rglob("*.py")
                 if any(m == "gc" or m.startswith("gc.") for m in imports_of(p)))
    assert bad == [], f"core modules import gc: {bad}"


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    return cycles


def packages_of(module: str) -> set[str]:
    """``a.b.c`` -> ``{"a", "a.b"}``: the packages that importing the module runs first."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its source, with the packages
    an import runs first, other than the module's own)."""
    paths = {module_name(p): p for p in APP.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for m, p in paths.items():
        named = {i for i in imports_of(p) if i in paths}
        ran = {q for i in named for q in packages_of(i) if q in paths} - packages_of(m)
        graph[m] = (named | ran) - {m}
    return graph


def test_routing_and_security_import_no_circle() -> None:
    """Security turns settings into client options; routing builds its clients on it, never
    the other way round (check_redis lives in tailguard.routing.client)."""
    graph = module_graph()
    assert not {m for m in graph["tailguard.security"] if m.startswith("tailguard.routing")}
    involved = [c for c in import_cycles(graph)
                if any(m == "tailguard.security" or m.startswith(("tailguard.routing", "tailguard.core"))
                       for m in c)]
    assert involved == [], f"import circles through security, routing or the core: {involved}"


def test_the_package_has_no_import_circle() -> None:
    cycles = import_cycles(module_graph())
    assert cycles == [], ("modules that import each other (directly or round a circle); move what they "
                          f"share to where it belongs: {cycles}")


def test_type_only_and_lazy_imports_count() -> None:
    """The graph sees an import under TYPE_CHECKING, one inside a function and a package run first."""
    probe = APP / "k8s" / "probe.py"  # never written: the source is passed in
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tailguard.settings import Settings\n"
    lazy = "def f():\n    from tailguard.sim.fleet import Fleet\n"
    assert "tailguard.settings" in imports_of(probe, typed)
    assert "tailguard.sim.fleet" in imports_of(probe, lazy)
    assert packages_of("tailguard.sim.fleet") == {"tailguard", "tailguard.sim"}


def test_the_cycle_finder_finds_a_circle() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
