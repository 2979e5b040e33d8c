"""The installed import package is ``tailguard``, its source is app/: pyproject.toml maps one onto the other.

setuptools gets an explicit package list (a renamed package cannot be found by
``packages.find``), so a new directory under app/ must be listed there or a wheel
(``pip install tailguard[emitter]``, the Docker image) silently leaves it out.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_directory_is_a_listed_package() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert tool["package-dir"] == {"tailguard": "app"}
    on_disk = {
        ".".join(("tailguard", *d.relative_to(ROOT / "app").parts))
        for d in [ROOT / "app", *(ROOT / "app").rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(f.is_file() for f in d.iterdir())
    }
    missing = sorted(on_disk - set(tool["packages"]))
    assert missing == [], f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert sorted(set(tool["packages"]) - on_disk) == [], "pyproject.toml lists packages that app/ does not have"


def test_the_console_script_and_the_typecheck_path_name_tailguard() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["tailguard"] == "tailguard.cli:main"
    link = ROOT / "scripts" / "lib" / "typecheck" / "tailguard"
    assert link.is_symlink() and link.resolve() == (ROOT / "app").resolve()
    assert project["tool"]["mypy"]["packages"] == ["tailguard"]
