"""Sizes the project keeps: no module in app/ over 500 lines, no function over 100.

A module does one job and a function one step (the project's standards); past these sizes
they are doing more. Each test names every offender with its size, so the fix is a split
by job, not a guess. Counted on the source as written (docstrings and comments included).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100


def long_modules(root: Path = APP, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    sizes = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(root.rglob("*.py"))}
    return {name: n for name, n in sizes.items() if n > limit}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``qualified name: lines`` of every function (nested ones too) longer than ``limit``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    lines = (child.end_lineno or child.lineno) - first + 1
                    if lines > limit:
                        out[name] = lines
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def test_no_module_is_over_500_lines() -> None:
    assert long_modules() == {}, f"split these modules by job (limit {MAX_MODULE_LINES} lines)"


def test_no_function_is_over_100_lines() -> None:
    offenders = {f"{p.relative_to(ROOT)}:{name}": n for p in sorted(APP.rglob("*.py"))
                 for name, n in long_functions(p.read_text(encoding="utf-8")).items()}
    assert offenders == {}, f"split these functions into steps (limit {MAX_FUNCTION_LINES} lines)"


def test_the_checks_find_an_offender(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(101))
    source = f"class C:\n    @staticmethod\n    def long():\n{body}"
    assert long_functions("def short():\n    return 1\n") == {}
    assert long_functions(source) == {"C.long": 103}
    (tmp_path / "big.py").write_text("\n" * 501, encoding="utf-8")
    assert list(long_modules(tmp_path).values()) == [501]
