"""tailguard.redact: outside text cleaned of escapes and masked of credentials (pure)."""

from __future__ import annotations

import pytest

from tailguard.redact import Redactor, clean


@pytest.mark.parametrize(("raw", "want"), [
    ("\x1b[31mred\x1b[0m \x1b[?25hshown", "red shown"),
    ("title\x1b]0;pwned\x07 ok", "title ok"),
    ("line one\r\nline two\nthree", "line one | line two | three"),
    ("tab\there\x00\x07\x08 bell", "tab here bell"),
    ("fake\n[2026-12-05 12:00:00] [INFO] forged", "fake | [2026-12-05 12:00:00] [INFO] forged"),
])
def test_clean_strips_escapes_and_control_characters(raw: str, want: str) -> None:
    assert clean(raw) == want


@pytest.mark.parametrize(("raw", "leak", "kept"), [
    ("cloning https://bot:gh-pass-42@git.example/x", "gh-pass-42", "https://bot:***@git.example/x"),
    ("curl -H 'Authorization: Bearer abc.def.ghi-123456'", "abc.def.ghi-123456", "Authorization"),
    ("PASSWORD=hunter2 next", "hunter2", "PASSWORD=*** next"),
    ('{"api_key": "k-1234567"}', "k-1234567", '"api_key": "***"'),
    ("aws AKIAABCDEFGHIJKLMNOP used", "AKIAABCDEFGHIJKLMNOP", "aws *** used"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnopqrstuvwxyz0123", "token ***"),
    ("slack xoxb-1234567890-abcdef", "xoxb-1234567890-abcdef", "slack ***"),
    ("jwt eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl", "eyJhbGciOi", "jwt ***"),
])
def test_credentials_by_their_form_are_masked(raw: str, leak: str, kept: str) -> None:
    out = Redactor()(raw)
    assert leak not in out and kept in out, out


def test_given_secret_values_are_masked_wherever_they_appear() -> None:
    r = Redactor(["s3cret-value", "s3cret-value-longer", "ab"])
    assert r("got s3cret-value-longer and s3cret-value, ab stays") == "got *** and ***, ab stays"
    # an escape sequence inside the secret does not hide it
    assert r("x s3cret\x1b[0m-value y") == "x *** y"
    assert r("retirement 0123456789abcdef0123456789abcdef ok") == \
        "retirement 0123456789abcdef0123456789abcdef ok"   # ids are not credentials
