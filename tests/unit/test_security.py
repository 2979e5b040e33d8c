"""Security settings → client options, secrets kept out of every printout.

Certificates are made with the openssl command in a temporary directory;
nothing here connects anywhere (tests/integration/test_secure.py does, against
the local stack's SASL_SSL and TLS listeners).
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import faust
import pytest

from tailguard import cli
from tailguard.core.contract.config import SettingError
from tailguard.security import (
    AccessRefused,
    faust_broker_credentials,
    kafka_client_options,
    redis_client_options,
    tls_context,
)
from tailguard.settings import Secret, Settings, load, redact_url

SASL_SSL = {"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "TAILGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "TAILGUARD_KAFKA_SASL_USERNAME": "tg"}


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=test", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    (d / "junk.pem").write_text("not a certificate\n")
    return {"cert": d / "cert.pem", "key": d / "key.pem", "junk": d / "junk.pem", "dir": d}


def test_secret_prints_as_stars_and_reveals_on_request() -> None:
    s = Secret("hunter2")
    assert (str(s), repr(s), s.reveal(), bool(s)) == ("***", "Secret('***')", "hunter2", True)
    assert (str(Secret()), bool(Secret())) == ("", False)
    settings = load({**SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD": "hunter2",
                     "TAILGUARD_REDIS_URL": "redis://u:pw-in-url@h:6379/0"})
    assert "hunter2" not in repr(settings) and "pw-in-url" not in repr(settings)


def test_secret_from_a_file_drops_one_trailing_newline(tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text("s3cret \n")
    s = load({**SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(f)})
    assert s.kafka_sasl_password.reveal() == "s3cret "
    f.write_text("r3dis")
    assert load({"TAILGUARD_REDIS_PASSWORD_FILE": str(f)}).redis_password.reveal() == "r3dis"


def test_secret_file_errors_name_the_file_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingError) as info:
        load({**SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "missing")})
    assert info.value.name == "TAILGUARD_KAFKA_SASL_PASSWORD_FILE" and "readable file" in str(info.value)
    (tmp_path / "pw").write_text("x")
    with pytest.raises(SettingError) as info:
        load({**SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD": "a",
              "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw")})
    assert info.value.name == "TAILGUARD_KAFKA_SASL_PASSWORD_FILE" and "give the secret once" in str(info.value)


@pytest.mark.parametrize(("env", "name"), [
    (SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD"),
    ({"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "TAILGUARD_KAFKA_SASL_PASSWORD": "p"},
     "TAILGUARD_KAFKA_SASL_USERNAME"),
    ({"TAILGUARD_KAFKA_SSL_KEYFILE": "/k", "TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SSL"},
     "TAILGUARD_KAFKA_SSL_CERTFILE"),
    ({"TAILGUARD_REDIS_URL": "redis://:pw@h/0", "TAILGUARD_REDIS_PASSWORD": "pw2"}, "TAILGUARD_REDIS_PASSWORD"),
    ({"TAILGUARD_REDIS_URL": "redis://u@h/0", "TAILGUARD_REDIS_USERNAME": "v"}, "TAILGUARD_REDIS_USERNAME"),
])
def test_inconsistent_security_settings_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(SettingError) as info:
        load(env)
    assert info.value.name == name
    assert "pw2" not in str(info.value)


def test_redact_url() -> None:
    assert redact_url("redis://tg:p%40ss@h:6380/0") == "redis://tg:***@h:6380/0"
    assert redact_url("rediss://:pw@h/0") == "rediss://:***@h/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_tailguard_settings_shows_stars_for_every_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "pw").write_text("from-a-file\n")
    for k, v in {**SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw"),
                 "TAILGUARD_REDIS_URL": "redis://tg:in-the-url@h:6379/0"}.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out
    assert "from-a-file" not in out and "in-the-url" not in out
    printed = dict(line.split("=", 1) for line in out.splitlines())
    assert printed["TAILGUARD_KAFKA_SASL_PASSWORD"] == "***   (default )"
    assert printed["TAILGUARD_REDIS_URL"].startswith("redis://tg:***@h:6379/0")
    assert printed["TAILGUARD_KAFKA_SSL_CHECK_HOSTNAME"] == "true"


def test_plaintext_kafka_options_carry_no_tls_or_sasl() -> None:
    assert kafka_client_options(Settings()) == {"security_protocol": "PLAINTEXT"}
    assert faust_broker_credentials(Settings()) is None


def test_sasl_ssl_options_for_aiokafka_and_faust(pem: dict[str, Path]) -> None:
    s = load({**SASL_SSL, "TAILGUARD_KAFKA_SASL_PASSWORD": "pw", "TAILGUARD_KAFKA_SSL_CAFILE": str(pem["cert"]),
              "TAILGUARD_KAFKA_SSL_CERTFILE": str(pem["cert"]), "TAILGUARD_KAFKA_SSL_KEYFILE": str(pem["key"])})
    opts = kafka_client_options(s)
    ctx = opts.pop("ssl_context")
    assert opts == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "tg", "sasl_plain_password": "pw"}
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    cred = faust_broker_credentials(s)
    assert isinstance(cred, faust.SASLCredentials)
    assert (cred.username, cred.password, cred.mechanism.value, cred.protocol.value) == (
        "tg", "pw", "SCRAM-SHA-512", "SASL_SSL")
    assert "pw" not in repr(cred)


def test_ssl_only_and_sasl_plaintext(pem: dict[str, Path]) -> None:
    s = load({"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SSL", "TAILGUARD_KAFKA_SSL_CHECK_HOSTNAME": "false"})
    opts = kafka_client_options(s)
    assert set(opts) == {"security_protocol", "ssl_context"} and not opts["ssl_context"].check_hostname
    assert isinstance(faust_broker_credentials(s), faust.SSLCredentials)
    s = load({"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "TAILGUARD_KAFKA_SASL_USERNAME": "u",
              "TAILGUARD_KAFKA_SASL_PASSWORD": "p"})
    assert "ssl_context" not in kafka_client_options(s)
    cred = faust_broker_credentials(s)
    assert isinstance(cred, faust.SASLCredentials) and cred.protocol.value == "SASL_PLAINTEXT"


def test_redis_options(pem: dict[str, Path]) -> None:
    assert redis_client_options(Settings()) == {}
    s = load({"TAILGUARD_REDIS_URL": "rediss://127.0.0.1:6380/0", "TAILGUARD_REDIS_USERNAME": "tg",
              "TAILGUARD_REDIS_PASSWORD": "pw", "TAILGUARD_REDIS_SSL_CAFILE": str(pem["cert"])})
    assert redis_client_options(s) == {
        "username": "tg", "password": "pw", "ssl_cert_reqs": "required", "ssl_check_hostname": True,
        "ssl_ca_certs": str(pem["cert"]), "ssl_certfile": None, "ssl_keyfile": None}


@pytest.mark.parametrize(("field", "which", "name", "allowed"), [
    ("cafile", "missing", "TAILGUARD_KAFKA_SSL_CAFILE", "readable PEM file of CA"),
    ("cafile", "junk", "TAILGUARD_KAFKA_SSL_CAFILE", "PEM file of CA certificates"),
    ("certfile", "missing", "TAILGUARD_KAFKA_SSL_CERTFILE", "readable PEM client certificate"),
    ("certfile", "junk", "TAILGUARD_KAFKA_SSL_CERTFILE", "PEM client certificate"),
])
def test_bad_tls_files_name_the_setting(pem: dict[str, Path], field: str, which: str, name: str,
                                        allowed: str) -> None:
    path = str(pem["dir"] / "nope.pem") if which == "missing" else str(pem["junk"])
    files = {"cafile": "", "certfile": "", "keyfile": ""} | {field: path}
    with pytest.raises(SettingError) as info:
        tls_context("TAILGUARD_KAFKA_SSL", key_password="", check_hostname=True, **files)
    assert info.value.name == name and allowed in str(info.value)


def test_access_refused_is_one_line_naming_the_setting() -> None:
    e = AccessRefused("TAILGUARD_KAFKA_SASL_PASSWORD", "Kafka at h:9094 refused the login")
    assert isinstance(e, SettingError) and e.name == "TAILGUARD_KAFKA_SASL_PASSWORD"
    assert str(e) == "TAILGUARD_KAFKA_SASL_PASSWORD: Kafka at h:9094 refused the login"


def test_a_bad_redis_url_is_refused_without_its_password() -> None:
    with pytest.raises(SettingError) as info:
        load({"TAILGUARD_REDIS_URL": "http://tg:hunter2@h:6379/0"})
    assert info.value.name == "TAILGUARD_REDIS_URL" and "hunter2" not in str(info.value)
    assert "tg:***@h" in str(info.value)


class _RefusingRedis:
    """A client whose connection the server refuses as Redis does a /db past `databases`."""

    async def ping(self) -> bool:
        from redis.exceptions import ResponseError

        raise ResponseError("DB index is out of range")

    async def aclose(self) -> None:
        pass


def test_a_db_the_server_refuses_is_one_line_naming_the_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tailguard.routing import client

    monkeypatch.setattr(client, "connect_for", lambda settings, timeout_s=2.0: _RefusingRedis())
    monkeypatch.setenv("TAILGUARD_REDIS_URL", "redis://tg:hunter2@127.0.0.1:6379/99")
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tailguard status: TAILGUARD_REDIS_URL: ") and len(err.splitlines()) == 1
    assert "DB index is out of range" in err and "below the server's `databases`" in err
    assert "tg:***@127.0.0.1:6379/99" in err and "hunter2" not in err
