"""``key=value`` maps given on the command line or in a file.

``tailguard proxy --backends``, ``tailguard haproxy-sync --backend-map`` and
``--server-map`` all take the same form: either inline pairs
``a=x,b=y`` or the path of a file holding one ``key=value`` per line (blank
lines and ``#`` comments ignored; commas also separate pairs) or a JSON
object of strings. Guarantees: keys are unique and non-empty, values are
non-empty, surrounding whitespace is stripped; anything else raises
:class:`~tailguard.lb.BackendsError` naming the flag and the offending entry.
"""

from __future__ import annotations

import json
import os

from tailguard.lb import BackendsError


def parse_pairs(text: str, *, flag: str) -> dict[str, str]:
    """Parse ``k=v`` pairs separated by commas and/or newlines (``#`` starts a comment)."""
    out: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.split("#", 1)[0]
        for item in line.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise BackendsError(f"{flag}: {item!r} is not KEY=VALUE")
            if key in out:
                raise BackendsError(f"{flag}: {key!r} is given twice")
            out[key] = value
    return out


def _parse_json(text: str, *, flag: str) -> dict[str, str]:
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise BackendsError(f"{flag}: not valid JSON ({e})") from None
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and k.strip() and isinstance(v, str) and v.strip() for k, v in obj.items()
    ):
        raise BackendsError(f"{flag}: the JSON must be an object of non-empty strings")
    return {k.strip(): v.strip() for k, v in obj.items()}


def load_pairs(arg: str, *, flag: str) -> dict[str, str]:
    """Inline ``k=v,…`` pairs, or the pairs in the file ``arg`` names (see module docstring)."""
    if os.path.isfile(arg):
        try:
            with open(arg, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise BackendsError(f"{flag}: cannot read {arg!r} ({e})") from None
        pairs = _parse_json(text, flag=flag) if text.lstrip().startswith("{") else parse_pairs(text, flag=flag)
    elif "=" in arg:
        pairs = parse_pairs(arg, flag=flag)
    else:
        raise BackendsError(f"{flag}: {arg!r} is neither an existing file nor KEY=VALUE pairs")
    if not pairs:
        raise BackendsError(f"{flag}: no KEY=VALUE pairs in {arg!r}")
    return pairs
