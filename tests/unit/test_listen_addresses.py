"""Every listener binds to loopback unless a setting says otherwise.

The metrics endpoint (``TAILGUARD_METRICS_HOST``), faust's web server
(``TAILGUARD_WEB_HOST``) and ``tailguard proxy`` (``TAILGUARD_PROXY_LISTEN``, or
``--listen``) default to 127.0.0.1: exposing one of them is a choice.
"""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from tailguard.lb.proxy import build_parser, listen_address
from tailguard.settings import Settings, load
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.service import create_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_defaults_are_loopback() -> None:
    s = Settings()
    assert (s.metrics_host, s.web_host, s.proxy_listen) == ("127.0.0.1", "127.0.0.1", "127.0.0.1:8080")


@pytest.mark.parametrize(("addr", "want"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_metrics_endpoint_binds_where_told(addr: str | None, want: str) -> None:
    m = WorkerMetrics(CollectorRegistry())
    port = _free_port()
    if addr is None:
        m.serve(port)
    else:
        m.serve(port, addr)
    try:
        assert m._server.server_address[:2] == (want, port)
    finally:
        m.close()


def test_worker_app_binds_metrics_and_web_to_the_settings(tmp_path: object) -> None:
    app = create_app(load({"TAILGUARD_WEB_HOST": "0.0.0.0"}, data_dir=str(tmp_path)))
    assert app.conf.web_bind == "0.0.0.0"
    assert create_app(load({}, data_dir=str(tmp_path))).conf.web_bind == "127.0.0.1"


def test_proxy_listens_on_the_setting_unless_listen_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    monkeypatch.delenv("TAILGUARD_PROXY_LISTEN", raising=False)
    assert listen_address(parser.parse_args(["--backends", "a=http://h:1"])) == ("127.0.0.1", 8080)
    monkeypatch.setenv("TAILGUARD_PROXY_LISTEN", "0.0.0.0:9080")
    assert listen_address(parser.parse_args(["--backends", "a=http://h:1"])) == ("0.0.0.0", 9080)
    args = parser.parse_args(["--backends", "a=http://h:1", "--listen", "127.0.0.1:0"])
    assert listen_address(args) == ("127.0.0.1", 0)
