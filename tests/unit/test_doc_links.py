"""Every relative link in README.md and docs/ points at a file that exists, and at a heading
(or an explicit anchor) that exists in it.

Links are Markdown ``[text](target)``; targets with a scheme (``https:``, ``mailto:``) are
not checked; links inside fenced code blocks are not links. Anchors are GitHub's heading
slugs (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` … for repeats).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fence = [], ""
    for line in text.splitlines():
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            if not fence:
                fence = m.group(1)[0] * 3
            elif line.strip().startswith(fence):
                fence = ""
            continue
        if not fence:
            out.append(line)
    return out


def slug(heading: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)      # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(doc: Path) -> list[str]:
    bad = []
    for line in prose_lines(doc.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = doc if not file_part else (doc.parent / file_part).resolve()
            if not dest.exists():
                bad.append(f"{target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{target}: no heading or anchor '{anchor}' in {dest.name}")
    return bad


def test_every_relative_link_resolves() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = {str(d.relative_to(ROOT)): b for d in docs if (b := broken_links(d))}
    assert bad == {}


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Real heading\n\n## Same\n\n## Same\n", encoding="utf-8")
    doc = tmp_path / "a.md"
    doc.write_text("[ok](b.md#real-heading) [ok2](b.md#same-1) [web](https://x.invalid/y)\n"
                   "```\n[not a link](nowhere.md)\n```\n"
                   "[gone](missing.md) [bad anchor](b.md#nope)\n", encoding="utf-8")
    assert broken_links(doc) == ["missing.md: no such file", "b.md#nope: no heading or anchor 'nope' in b.md"]


LAB_WORDS = re.compile(r"\bthe seed\b|\bseed's\b|\bseed (?:sketch|transcription)\b|\bissues? #?\d+\b", re.I)


def test_user_docs_carry_no_lab_words() -> None:
    """No "the seed" and no issue numbers: history is "the original design" in user docs."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = {f"{d.relative_to(ROOT)}:{i}": m.group(0) for d in docs
             for i, line in enumerate(d.read_text(encoding="utf-8").splitlines(), 1)
             if (m := LAB_WORDS.search(line))}
    assert found == {}
    assert LAB_WORDS.search("as issue 16 measured") and LAB_WORDS.search("The seed's rule")
    assert not LAB_WORDS.search("--seed 7, random seed 1, seed_transcription")


def test_the_readme_names_the_two_connection_settings_on_its_first_screen() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:25])
    assert "TAILGUARD_KAFKA_BOOTSTRAP" in first_screen and "TAILGUARD_REDIS_URL" in first_screen
