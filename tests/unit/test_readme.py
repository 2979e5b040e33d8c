"""The README is the user's contract: it must document every setting the code knows
and name only commands that exist."""

from __future__ import annotations

import re
from pathlib import Path

from app.cli import COMMANDS
from app.settings import SCRIPT_ONLY, Settings, env_names, secret_file_names

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def test_every_setting_is_documented_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(TAILGUARD_[A-Z0-9_]+)` \| ([^|]+) \|", README, re.M))
    missing = sorted(set(env_names()) - set(rows))
    assert not missing, f"README Configuration lacks {missing}"
    for name, default in env_names().items():
        shown = rows[name].strip().strip("`")
        assert shown == default or (default == "" and shown == "(empty)"), (name, shown, default)


def test_readme_names_no_unknown_setting() -> None:
    known = set(env_names()) | set(SCRIPT_ONLY) | set(secret_file_names())
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
    assert f"`{s.kafka_bootstrap}`" in README and f"`{s.redis_url}`" in README
