"""Outside text (a command's output, an HTTP reply, an error) made safe to log and publish.

The replace hook (:mod:`tailguard.streaming.replace`) writes what its action printed to the log,
to ``node-replacements`` and to Redis; that text is whatever a shell script, ``kubectl``
or a fleet API chose to print. :func:`clean` removes terminal escape sequences and control
characters (a line break becomes `` | ``), so it can neither repaint a terminal nor forge a
log line. :class:`Redactor` then masks, as ``***``:

* every value it was given (the secret settings: :func:`tailguard.settings.secret_values`);
* the password of a ``scheme://user:password@`` URL;
* the value of a ``key=value`` / ``key: value`` pair whose key names a password, secret,
  token, API or access key, credential or auth (``Authorization: Bearer …`` included);
* well-known token forms: AWS access key ids, GitHub, GitLab, Slack and ``sk-`` API tokens,
  JSON web tokens.

Guarantees: pure, no I/O; ``Redactor(...)(text)`` never contains a given value of three
characters or more (shorter ones would mask ordinary text and are not secrets anyone
uses) nor a control character. It masks what looks like a credential, so it may mask
more than a secret; it cannot know a secret it was not given that has no telltale form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
MIN_SECRET_CHARS = 3

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"            # CSI: colours, cursor moves, ESC[?25h …
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|\x1b[P^_][^\x1b]*(?:\x1b\\)?"       # DCS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"                   # any other escape
    r"|\x9b[0-?]*[ -/]*[@-~]")             # 8-bit CSI
_LINE_BREAKS = re.compile(r"[ \t]*(?:\r\n|\r|\n|\x0b|\x0c|\x85|\u2028|\u2029)+[ \t]*")

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@")
_SCHEME_TOKEN = re.compile(r"(?i)\b(?P<head>(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=-]{6,}")
_KEY_VALUE = re.compile(
    r"(?i)(?P<head>\b[\w.-]*(?:passw(?:or)?d|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|"
    r"private[_-]?key|credentials?|auth)[\w.-]*[\"']?\s*[:=]\s*[\"']?)"
    r"(?!\*\*\*)[^\s\"',;&|]+")
_TOKENS = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}\b"
    r"|\bglpat-[A-Za-z0-9_-]{20,}\b"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}\b"
    r"|\bsk-[A-Za-z0-9_-]{20,}\b"
    r"|\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}")


def clean(text: str) -> str:
    """``text`` without escape sequences and control characters; line breaks become `` | ``."""
    text = _LINE_BREAKS.sub(" | ", _ESCAPES.sub("", text)).strip(" |")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " if c == "\t" else "" for c in text)


class Redactor:
    """``redactor(text)``: :func:`clean` ``text``, then mask secrets (see the module docstring)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if len(s) >= MIN_SECRET_CHARS}
        # Longest first: a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        text = clean(text)
        for v in self._values:
            text = text.replace(v, MASK)
        text = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", text)
        text = _SCHEME_TOKEN.sub(rf"\g<head>{MASK}", text)
        text = _KEY_VALUE.sub(rf"\g<head>{MASK}", text)
        return _TOKENS.sub(MASK, text)
