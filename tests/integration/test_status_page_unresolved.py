"""The status page in a real headless Chromium shows a model's unresolved flag: the page's own
HTML (``page_html``) and a ``status.json`` of the shape ``page_data`` returns (its test:
test_status_unresolved.py), served by a local HTTP server; a metric name holding markup shows
as text."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_status_page import browser  # noqa: F401  (the fixture)

from tailguard.streaming.page import page_html

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EVIL = "<b>e2e</b>"


def _model(name: str, unresolved: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": name, "version": 3, "mode": "enforce", "routing": ["a"], "shadow": [],
            "peers": {"p50_us": 1e5, "p99_us": 2e5, "ratio": 2.0},
            "nodes": [{"node": "a", "state": "healthy", "routed": True, "routed_by_rules": True,
                       "p50_us": 1e5, "p99_us": 2e5, "ratio": 2.0, "since": 100.0, "reason": "normal",
                       "override": None, "weight": 1.0, "weight_detail": None, "probe_after": None,
                       "history": []}],
            "events": [], "fleet_slow": None, "unresolved": unresolved, "errors": []}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    site = tmp_path / "tailguard"
    site.mkdir()
    (site / "index.html").write_text(page_html(), encoding="utf-8")
    (site / "status.json").write_text(json.dumps({"ts": 130.0, "key_prefix": "t", "models": [
        _model("dynamo-model", [{"metric": "e2e", "first_bound_s": 2.0}, {"metric": EVIL, "first_bound_s": 0.001}]),
        _model("event-model", [])]}), encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tailguard/"
    finally:
        server.shutdown()
        t.join(timeout=5)


def test_the_page_names_the_metric_and_bound_the_buckets_cannot_resolve(browser: Any, served: str) -> None:  # noqa: F811
    browser.get(served)

    deadline = time.monotonic() + 30.0
    got: list[dict[str, str]] = []
    while not got:       # the page fetches status.json after it loads
        assert time.monotonic() < deadline, "no unresolved line on the page within 30 s"
        time.sleep(0.1)
        got = browser.execute_script(
            """return [...document.querySelectorAll('p.unresolved')].map(p => ({
                   metric: p.getAttribute('data-metric'), text: p.textContent}));""")
    assert [g["metric"] for g in got] == ["e2e", EVIL]
    assert "buckets cannot resolve e2e" in got[0]["text"] and "first bound 2 s" in got[0]["text"]
    assert EVIL in got[1]["text"] and "0.001 s" in got[1]["text"]
    assert browser.execute_script("return document.querySelectorAll('p.unresolved b').length") == 0
