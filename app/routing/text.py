"""Names from the wire, made safe to print on an operator's terminal.

Node ids and model names come from whoever writes to ``latency-events``. :func:`printable`
is what every human-facing output of this package (``tailguard status``, ``explain``)
passes them through: control characters, escape sequences and other non-printable code
points become ``\\xNN`` / ``\\uNNNN`` escapes, so an event cannot rewrite the screen;
printable text (unicode included) is shown as it is. Pure, no I/O.
"""

from __future__ import annotations


def printable(name: str) -> str:
    """``name`` with every non-printable character escaped (``\\x1b`` for ESC …)."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else
                                              f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                                              f"\\U{ord(c):08x}") for c in name)
