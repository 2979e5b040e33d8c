"""Names from the wire, made safe to print on a terminal and in a log.

Node ids, model names, reasons and error texts come from whoever writes to
``latency-events``. :func:`printable` is what every human-facing output of this package
(``tailguard status``, ``explain``, the demo's report) passes them through: control
characters, escape sequences and other non-printable code points become ``\\xNN`` /
``\\uNNNN`` escapes, so an event cannot rewrite the screen; printable text (unicode
included) is shown as it is. :func:`basic_config` (``logging.basicConfig`` for the
worker, the agent and the LB sync) installs :class:`PrintableMessages` on the root
handlers, so a log message holding such a character — or a line break that would forge
another log line — is written escaped, whatever ``%s`` put it there; printable messages
pass unchanged (one ``str.isprintable``). Tracebacks, added by the formatter, are not
touched. Pure but for :func:`basic_config`; imports nothing of the package.
"""

from __future__ import annotations

import logging
from typing import Any


def printable(name: str) -> str:
    """``name`` with every non-printable character escaped (``\\x1b`` for ESC …)."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else
                                              f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                                              f"\\U{ord(c):08x}") for c in name)


class PrintableMessages(logging.Filter):
    """Escapes non-printable characters of a record's formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if not msg.isprintable():
            record.msg, record.args = printable(msg), None
        return True


def basic_config(**kwargs: Any) -> None:
    """``logging.basicConfig(**kwargs)``, then :class:`PrintableMessages` on every root handler."""
    logging.basicConfig(**kwargs)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, PrintableMessages) for f in handler.filters):
            handler.addFilter(PrintableMessages())
