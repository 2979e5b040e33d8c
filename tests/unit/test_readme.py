"""The README and docs/ are the user's contract: docs/configuration.md must document every
setting the code knows with its default, and no page may name a setting or command that does
not exist."""

from __future__ import annotations

import re
from pathlib import Path

from tailguard.cli import COMMANDS
from tailguard.settings import HOOK_ENV, PREFIX, SCRIPT_ONLY, Settings, env_names, secret_file_names

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
# The README and every page under docs/, for the checks that apply to all of them.
README = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def test_every_setting_is_documented_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(TAILGUARD_[A-Z0-9_]+)` \| ([^|]+) \|", CONFIGURATION, re.M))
    missing = sorted(set(env_names()) - set(rows))
    assert not missing, f"docs/configuration.md lacks {missing}"
    for name, default in env_names().items():
        shown = rows[name].strip().strip("`")
        assert shown == default or (default == "" and shown == "(empty)"), (name, shown, default)


def test_readme_names_no_unknown_setting() -> None:
    known = set(env_names()) | set(SCRIPT_ONLY) | set(secret_file_names())
    known |= {PREFIX + n for n in HOOK_ENV}          # what the replace hook's command is given
    # `TAILGUARD_TOPIC_<NAME>` is a pattern, not a name.
    named = {t for t in re.findall(r"TAILGUARD_[A-Z0-9_]+<?", README) if not t.endswith("<")}
    assert named <= known, sorted(named - known)


def test_readme_names_only_existing_commands() -> None:
    # Commands as written in code spans and code blocks: `tailguard X` or a line starting with it.
    used = set(re.findall(r"(?:`|^)(?:\$ )?tailguard ([a-z][a-z-]+)", README, re.M))
    assert used, "the README shows no tailguard command at all"
    assert used <= set(COMMANDS), sorted(used - set(COMMANDS))


def test_defaults_in_readme_are_the_code_defaults() -> None:
    s = Settings()
    assert f"`{s.kafka_bootstrap}`" in CONFIGURATION and f"`{s.redis_url}`" in CONFIGURATION


# Pages that other branches add (linked from the README's "More" list before they land).
PAGES_OF_OTHER_BRANCHES: set[str] = set()


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move reference material to docs/"


def relative_links(page: Path) -> list[str]:
    """Targets of the page's markdown links that are files of this repository (anchors dropped)."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
    return [t for t in targets if "://" not in t]


def test_links_between_readme_and_docs_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in relative_links(page):
            path = (page.parent / target).resolve()
            if not path.exists() and str(path.relative_to(ROOT)) not in PAGES_OF_OTHER_BRANCHES:
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
    assert "docs/rules.md" in relative_links(ROOT / "README.md")


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("see [a](a.md#x), [web](https://example.org/) and [b](docs/b.md)\n", encoding="utf-8")
    assert relative_links(page) == ["a.md", "docs/b.md"]
