"""Sizes the project keeps: no module in app/ over 500 lines, no function over 100, and every
module's docstring there and at most 20 lines.

A module does one job and a function one step (the project's standards); past these sizes
they are doing more. Each test names every offender with its size, so the fix is a split
by job, not a guess. Counted on the source as written (docstrings and comments included).

A module's docstring says what it owns and guarantees; rationale and measurements go to
docs/. Its lines are the docstring's own (a closing quote on a line of its own is not one).
An ``__init__.py`` with no statement at all is a package marker and needs none; any other
module, an ``__init__.py`` with imports or code included, has one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100
MAX_DOCSTRING_LINES = 20


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


def docstring_lines(source: str, *, init: bool = False) -> int | None:
    """Lines of the module docstring of ``source``; None when it has none (0 for an empty
    ``__init__.py``, which needs none)."""
    tree = ast.parse(source)
    doc = ast.get_docstring(tree, clean=False)
    if doc is None:
        return 0 if init and not tree.body else None
    return len(doc.strip("\n").splitlines())


def long_or_missing_docstrings(root: Path = APP, limit: int = MAX_DOCSTRING_LINES) -> dict[str, int | None]:
    """``module: lines`` of every module whose docstring is over ``limit`` lines or missing (None)."""
    out: dict[str, int | None] = {}
    for p in sorted(root.rglob("*.py")):
        n = docstring_lines(p.read_text(encoding="utf-8"), init=p.name == "__init__.py")
        if n is None or n > limit:
            out[str(p.relative_to(root))] = n
    return out


def test_no_module_is_over_500_lines() -> None:
    assert long_modules() == {}, f"split these modules by job (limit {MAX_MODULE_LINES} lines)"


def test_no_function_is_over_100_lines() -> None:
    offenders = {f"{p.relative_to(ROOT)}:{name}": n for p in sorted(APP.rglob("*.py"))
                 for name, n in long_functions(p.read_text(encoding="utf-8")).items()}
    assert offenders == {}, f"split these functions into steps (limit {MAX_FUNCTION_LINES} lines)"


def test_every_module_says_what_it_owns_in_at_most_20_lines() -> None:
    offenders = long_or_missing_docstrings()
    assert offenders == {}, (f"module docstrings over {MAX_DOCSTRING_LINES} lines or missing (None): say what "
                             "the module owns and guarantees; rationale and measurements go to docs/")


def test_the_docstring_check_finds_an_offender(tmp_path: Path) -> None:
    long_doc = '"""One.\n' + "".join(f"line {i}\n" for i in range(20)) + '"""\n'
    assert docstring_lines(long_doc) == 21
    assert docstring_lines('"""One.\n\nTwo.\n"""\nx = 1\n') == 3
    assert docstring_lines("x = 1\n") is None
    assert docstring_lines("", init=True) == 0
    assert docstring_lines("from a import b\n", init=True) is None
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "loose.py").write_text("x = 1\n")
    (tmp_path / "wordy.py").write_text(long_doc)
    (tmp_path / "fine.py").write_text('"""Fine."""\n')
    assert long_or_missing_docstrings(tmp_path) == {"pkg/loose.py": None, "wordy.py": 21}


def test_the_checks_find_an_offender(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(101))
    source = f"class C:\n    @staticmethod\n    def long():\n{body}"
    assert long_functions("def short():\n    return 1\n") == {}
    assert long_functions(source) == {"C.long": 103}
    (tmp_path / "big.py").write_text("\n" * 501, encoding="utf-8")
    assert list(long_modules(tmp_path).values()) == [501]
