"""Names from the wire are printed safely (tailguard.text) by `tailguard status` and in logs."""

from __future__ import annotations

import pytest

from tailguard.routing.status import ModelStatus, format_table
from tailguard.text import printable


@pytest.mark.parametrize(("raw", "shown"), [
    ("gpu-node-07", "gpu-node-07"),
    ("nœud-☃", "nœud-☃"),                         # printable unicode stays readable
    ("ctl\x01\x1b[31m\x07", "ctl\\x01\\x1b[31m\\x07"),  # no terminal escape gets through
    ("a\u2028b\U000e0001", "a\\u2028b\\U000e0001"),
    ("tab\there", "tab\\x09here"),
])
def test_printable_escapes_what_a_terminal_would_act_on(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert printable(raw).isprintable()


def test_status_table_never_prints_a_raw_control_character() -> None:
    node, model = "evil\x1b]0;pwned\x07", "m\x1b[2J"
    ms = ModelStatus(model=model, routing=frozenset({node}), version=1, quarantine={},
                     nodes={node: {"state": "healthy", "reason": "first\x1b[31m", "since": 0.0}})
    table = format_table([ms], 10.0)
    assert "\x1b" not in table and "\x07" not in table
    assert "evil\\x1b]0;pwned\\x07" in table and "m\\x1b[2J" in table


def test_log_messages_with_control_characters_are_written_escaped() -> None:
    import io
    import logging

    from tailguard.text import PrintableMessages

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(PrintableMessages())
    log = logging.getLogger("tailguard.test.printable")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("replacing %s/%s", "evil\x1b[2J\nFAKE LINE", "m")
        log.warning("plain %s", "gpu-node-05")
    finally:
        log.removeHandler(handler)
    assert out.getvalue() == "replacing evil\\x1b[2J\\x0aFAKE LINE/m\nplain gpu-node-05\n"
