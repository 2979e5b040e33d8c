"""Settings: every ``TAILGUARD_*`` variable is read, and every bad value is refused.

Table-driven: each known variable gets a valid non-default value and must come
out of :func:`tailguard.settings.load` with it; each bad value must raise a
:class:`SettingError` that names the variable, the value and what is allowed.
The environment is always passed explicitly, so the tests do not depend on
the shell they run in.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tailguard import cli
from tailguard import settings as settings_mod
from tailguard.core.contract.config import DetectorSettings, SettingError, field_names
from tailguard.settings import Secret, Settings, load

# A valid, non-default value for every variable, and the value it must parse to.
SERVICE_VALUES: dict[str, tuple[str, Any]] = {
    "TAILGUARD_KAFKA_BOOTSTRAP": ("kafka-a:9092,kafka-b:19092", "kafka-a:9092,kafka-b:19092"),
    "TAILGUARD_REDIS_URL": ("redis://cache.internal:6380/3", "redis://cache.internal:6380/3"),
    "TAILGUARD_KEY_PREFIX": ("tg-prod", "tg-prod"),
    "TAILGUARD_APP_ID": ("tailguard-eu", "tailguard-eu"),
    "TAILGUARD_TOPIC_PARTITIONS": ("32", 32),
    "TAILGUARD_REPLICATION_FACTOR": ("3", 3),
    "TAILGUARD_REDIS_SENTINELS": ("127.0.0.1:26379,127.0.0.1:26380", "127.0.0.1:26379,127.0.0.1:26380"),
    "TAILGUARD_REDIS_SENTINEL_MASTER": ("mymaster", "mymaster"),
    "TAILGUARD_REDIS_CLUSTER": ("true", True),
    "TAILGUARD_KEY_LAYOUT": ("tagged", "tagged"),
    "TAILGUARD_METRICS_PORT": ("0", 0),
    "TAILGUARD_WEB_PORT": ("7066", 7066),
    "TAILGUARD_DATA_DIR": ("/var/lib/tailguard", "/var/lib/tailguard"),
    "TAILGUARD_LOG_LEVEL": ("debug", "debug"),
    "TAILGUARD_ALLOCATOR": ("pymalloc", "pymalloc"),
    "TAILGUARD_METRICS_HOST": ("0.0.0.0", "0.0.0.0"),
    "TAILGUARD_WEB_HOST": ("::1", "::1"),
    "TAILGUARD_PROXY_LISTEN": ("[::]:9080", "[::]:9080"),
    "TAILGUARD_KAFKA_SECURITY_PROTOCOL": ("SSL", "SSL"),
    "TAILGUARD_KAFKA_SASL_MECHANISM": ("SCRAM-SHA-512", "SCRAM-SHA-512"),
    "TAILGUARD_KAFKA_SASL_USERNAME": ("tailguard", "tailguard"),
    "TAILGUARD_KAFKA_SASL_PASSWORD": ("s3cret", Secret("s3cret")),
    "TAILGUARD_KAFKA_SSL_CAFILE": ("/etc/ca.pem", "/etc/ca.pem"),
    "TAILGUARD_KAFKA_SSL_CERTFILE": ("/etc/client.pem", "/etc/client.pem"),
    "TAILGUARD_KAFKA_SSL_KEYFILE": ("/etc/client.key", "/etc/client.key"),
    "TAILGUARD_KAFKA_SSL_KEY_PASSWORD": ("k3y", Secret("k3y")),
    "TAILGUARD_KAFKA_SSL_CHECK_HOSTNAME": ("false", False),
    "TAILGUARD_REDIS_USERNAME": ("tailguard", "tailguard"),
    "TAILGUARD_REDIS_PASSWORD": ("r3dis", Secret("r3dis")),
    "TAILGUARD_REDIS_SSL_CAFILE": ("/etc/ca.pem", "/etc/ca.pem"),
    "TAILGUARD_REDIS_SSL_CERTFILE": ("/etc/client.pem", "/etc/client.pem"),
    "TAILGUARD_REDIS_SSL_KEYFILE": ("/etc/client.key", "/etc/client.key"),
    "TAILGUARD_REDIS_SSL_CHECK_HOSTNAME": ("0", False),
    "TAILGUARD_REPLACE_COMMAND": ('kubectl delete pod "$TAILGUARD_NODE_ID"', 'kubectl delete pod "$TAILGUARD_NODE_ID"'),
    "TAILGUARD_REPLACE_WEBHOOK_URL": ("https://ops.internal/replace", Secret("https://ops.internal/replace")),
    "TAILGUARD_REPLACE_ENV": ("KUBECONFIG,HOME", "KUBECONFIG,HOME"),
    "TAILGUARD_REPLACE_TIMEOUT_S": ("120", 120.0),
    "TAILGUARD_REPLACE_ATTEMPTS": ("5", 5),
    "TAILGUARD_REPLACE_MAX_AGE_S": ("600.5", 600.5),
    "TAILGUARD_MODE": ("observe", "observe"),
    "TAILGUARD_DIAGNOSE_IN_OBSERVE": ("true", True),
    "TAILGUARD_HISTORY_TICKS": ("3", 3),
    "TAILGUARD_ALLOWLIST_REDIS_KEY": ("site:nodes", "site:nodes"),
    "TAILGUARD_ALLOWLIST_FILE": ("/etc/tailguard/nodes.txt", "/etc/tailguard/nodes.txt"),
    "TAILGUARD_ALLOWLIST_PATTERN": ("gpu-[0-9]+", "gpu-[0-9]+"),
    "TAILGUARD_ALLOWLIST_MODELS": ("llama,qwen", "llama,qwen"),
    "TAILGUARD_PUBLISH_BACKLOG_BYTES": ("1048576", 1048576),
    "TAILGUARD_ALLOWLIST_MODEL_PATTERN": ("llama-.*", "llama-.*"),
    "TAILGUARD_ALLOWLIST_REFRESH_S": ("5", 5.0),
    "TAILGUARD_SCRAPE_FILE_SD": ("/etc/tailguard/targets.json", "/etc/tailguard/targets.json"),
    "TAILGUARD_SCRAPE_HTTP_SD": ("http://sd.example:8080/targets", "http://sd.example:8080/targets"),
    "TAILGUARD_SCRAPE_SD_REFRESH_S": ("60", 60.0),
    "TAILGUARD_SCRAPE_INTERVAL_S": ("15", 15.0),
    "TAILGUARD_SCRAPE_TIMEOUT_S": ("2.5", 2.5),
    "TAILGUARD_SCRAPE_CONCURRENCY": ("64", 64),
    "TAILGUARD_SCRAPE_NODE_LABEL": ("node", "node"),
    "TAILGUARD_SCRAPE_MODEL_LABEL": ("served_model", "served_model"),
    "TAILGUARD_SCRAPE_HARDWARE_LABEL": ("gpu", "gpu"),
    "TAILGUARD_SCRAPE_PROFILE_LABEL": ("server", "server"),
    "TAILGUARD_SCRAPE_SHARD": ("1/3", "1/3"),
    "TAILGUARD_SCRAPE_METRICS_PORT": ("9475", 9475),
    "TAILGUARD_SCRAPE_PROFILES_FILE": ("/etc/tailguard/servers.yml", "/etc/tailguard/servers.yml"),
    "TAILGUARD_K8S_API_URL": ("https://10.0.0.1:6443", "https://10.0.0.1:6443"),
    "TAILGUARD_K8S_TOKEN_FILE": ("/run/tg/token", "/run/tg/token"),
    "TAILGUARD_K8S_CA_FILE": ("/run/tg/ca.crt", "/run/tg/ca.crt"),
    "TAILGUARD_K8S_NAMESPACE": ("llm", "llm"),
    "TAILGUARD_K8S_CONDITION": ("example.com/serving", "example.com/serving"),
    "TAILGUARD_K8S_NODE_ID": ("label:example.com/node", "label:example.com/node"),
    "TAILGUARD_K8S_MODEL_LABEL": ("example.com/model", "example.com/model"),
    "TAILGUARD_K8S_LEASE_NAME": ("tg-sync", "tg-sync"),
    "TAILGUARD_K8S_LEASE_DURATION_S": ("30", 30.0),
    "TAILGUARD_K8S_RESYNC_S": ("5", 5.0),
    "TAILGUARD_K8S_WEBHOOK_LISTEN": ("0.0.0.0:9443", "0.0.0.0:9443"),
    "TAILGUARD_K8S_WEBHOOK_CERTFILE": ("/tls/tls.crt", "/tls/tls.crt"),
    "TAILGUARD_K8S_WEBHOOK_KEYFILE": ("/tls/tls.key", "/tls/tls.key"),
}
# Variables that are only valid together with others (set alongside, left out of "nothing else moved").
_TLS = {"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SSL"}
_REDIS_TLS = {"TAILGUARD_REDIS_URL": "rediss://127.0.0.1:6380/0"}
COMPANIONS: dict[str, dict[str, str]] = {
    "TAILGUARD_KAFKA_SSL_CAFILE": _TLS,
    "TAILGUARD_KAFKA_SSL_CERTFILE": _TLS,
    "TAILGUARD_KAFKA_SSL_KEYFILE": _TLS | {"TAILGUARD_KAFKA_SSL_CERTFILE": "/etc/client.pem"},
    "TAILGUARD_REDIS_SSL_CAFILE": _REDIS_TLS,
    "TAILGUARD_REDIS_SSL_CERTFILE": _REDIS_TLS,
    "TAILGUARD_REDIS_SSL_KEYFILE": _REDIS_TLS | {"TAILGUARD_REDIS_SSL_CERTFILE": "/etc/client.pem"},
    "TAILGUARD_K8S_WEBHOOK_CERTFILE": {"TAILGUARD_K8S_WEBHOOK_KEYFILE": "/tls/tls.key"},
    "TAILGUARD_K8S_WEBHOOK_KEYFILE": {"TAILGUARD_K8S_WEBHOOK_CERTFILE": "/tls/tls.crt"},
}
DETECTOR_TEXT: dict[str, tuple[str, Any]] = {
    "tick_interval_s": ("2.5", 2.5),
    "window_size": ("2000", 2000),
    "min_samples": ("50", 50),
    "ratio_threshold": ("4", 4.0),
    "confirm_windows": ("5", 5),
    "relative_p50_factor": ("1.5", 1.5),
    "relative_p99_factor": ("2.5", 2.5),
    "error_share_peer_factor": ("3", 3.0),
    "min_peers": ("4", 4),
    "max_ejected_fraction": ("0.25", 0.25),
    "warmup_s": ("0", 0.0),
    "max_sample_age_s": ("60", 60.0),
    "fleet_ratio_factor": ("2", 2.0),
    "shift_factor": ("0", 0.0),
    "max_error_share": ("0.25", 0.25),
    "stall_peer_requests": ("40", 40),
    "signal": ("tpot", "tpot"),
    "model_signals": ("llama=latency,mistral=normalized", "llama=latency,mistral=normalized"),
    "load_event_fraction": ("0.75", 0.75),
    "probe_min_samples": ("5", 5),
    "backoff_initial_s": ("10", 10.0),
    "backoff_max_s": ("600", 600.0),
    "retire_after_failed_probes": ("3", 3),
    "forget_after_s": ("0", 0.0),
    "silent_after_s": ("300", 300.0),
    "telemetry_loss_fraction": ("0.9", 0.9),
    "restart_gap_s": ("0", 0.0),
    "max_latency_us": ("1e7", 1e7),
    "max_future_skew_s": ("30", 30.0),
    "id_pattern": ("[a-z0-9.-]{1,63}", "[a-z0-9.-]{1,63}"),
    "max_new_pairs_per_tick": ("50", 50),
    "weights": ("observe", "observe"),
    "min_weight": ("0.2", 0.2),
    "min_total_weight_share": ("0.5", 0.5),
    "max_models": ("20", 20),
}


def _value_of(s: Settings, var: str) -> Any:
    key = var.removeprefix("TAILGUARD_").lower()
    if key in field_names():
        return getattr(s.detector, key)
    if key.startswith("topic_") and key != "topic_partitions":
        return getattr(s.topics, key.removeprefix("topic_"))
    return getattr(s, key)


def test_the_tables_cover_every_known_variable() -> None:
    topics = {v for v in settings_mod.env_names() if v.startswith("TAILGUARD_TOPIC_")} - {
        "TAILGUARD_TOPIC_PARTITIONS"
    }
    covered = set(SERVICE_VALUES) | topics | {"TAILGUARD_" + n.upper() for n in DETECTOR_TEXT}
    assert covered == set(settings_mod.env_names())
    assert set(DETECTOR_TEXT) == set(field_names())


@pytest.mark.parametrize("var", sorted(settings_mod.env_names()))
def test_every_variable_is_parsed(var: str) -> None:
    key = var.removeprefix("TAILGUARD_").lower()
    if var in SERVICE_VALUES:
        text, want = SERVICE_VALUES[var]
    elif key in DETECTOR_TEXT:
        text, want = DETECTOR_TEXT[key]
    else:  # a topic name
        text = want = f"custom-{key}.v2"
    default = _value_of(Settings(), var)
    assert want != default, "the table must use a non-default value, or the test proves nothing"
    companions = COMPANIONS.get(var, {})
    s = load({var: text, **companions})
    assert _value_of(s, var) == want
    # ...and nothing else moved.
    for other in settings_mod.env_names():
        if other != var and other not in companions:
            assert _value_of(s, other) == _value_of(Settings(), other), other


def test_empty_environment_gives_the_documented_defaults() -> None:
    s = load({"PATH": "/usr/bin", "HOME": "/root"})
    assert s == Settings()
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.key_prefix == "tailguard"
    assert s.detector == DetectorSettings()
    assert (s.detector.tick_interval_s, s.detector.window_size, s.detector.min_samples) == (30.0, 1000, 100)
    assert (s.detector.ratio_threshold, s.detector.confirm_windows) == (3.0, 3)
    assert (s.detector.relative_p50_factor, s.detector.min_peers) == (2.0, 3)
    assert (s.detector.max_ejected_fraction, s.detector.warmup_s) == (0.5, 120.0)


def test_env_names_defaults_are_the_settings_defaults() -> None:
    for var, default_text in settings_mod.env_names().items():
        assert settings_mod.as_text(_value_of(Settings(), var)) == default_text, var


def test_settings_are_frozen() -> None:
    s = load({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kafka_bootstrap = "elsewhere:9092"  # type: ignore[misc]


def test_overrides_win_over_the_environment() -> None:
    s = load({"TAILGUARD_KEY_PREFIX": "from-env"}, key_prefix="from-code")
    assert s.key_prefix == "from-code"


# (variable, bad value, a piece of the "allowed" text)
BAD: list[tuple[str, str, str]] = [
    ("TAILGUARD_KAFKA_BOOTSTRAP", "", "host:port"),
    ("TAILGUARD_KAFKA_BOOTSTRAP", "localhost", "host:port"),
    ("TAILGUARD_KAFKA_BOOTSTRAP", "kafka:nine", "host:port"),
    ("TAILGUARD_KAFKA_BOOTSTRAP", "a:9092,:9093", "host:port"),
    ("TAILGUARD_KAFKA_BOOTSTRAP", "a:70000", "host:port"),
    ("TAILGUARD_REDIS_URL", "http://127.0.0.1:6379", "redis://"),
    ("TAILGUARD_REDIS_URL", "127.0.0.1:6379", "redis://"),
    ("TAILGUARD_REDIS_URL", "redis://127.0.0.1:6379/abc", "db is a number 0, 1, …"),
    ("TAILGUARD_REDIS_URL", "redis://127.0.0.1:6379/-1", "db is a number 0, 1, …"),
    ("TAILGUARD_REDIS_URL", "redis://127.0.0.1:6379?db=two", "db is a number 0, 1, …"),
    ("TAILGUARD_REDIS_URL", "unix:///run/redis.sock?db=x", "db is a number 0, 1, …"),
    ("TAILGUARD_APP_ID", "opx bad", "Kafka topic name"),
    ("TAILGUARD_APP_ID", "", "Kafka topic name"),
    ("TAILGUARD_APP_ID", "tg/eu", "letters, digits, '.', '_', '-'"),
    ("TAILGUARD_APP_ID", "x" * 228, "1-227"),
    ("TAILGUARD_KEY_PREFIX", "", "non-empty"),
    ("TAILGUARD_KEY_PREFIX", "tail guard", "without spaces"),
    ("TAILGUARD_TOPIC_PARTITIONS", "0", "1..1024"),
    ("TAILGUARD_REPLICATION_FACTOR", "-1", "min(3, brokers)"),
    ("TAILGUARD_REDIS_SENTINELS", "sentinel-without-port", "host:port"),
    ("TAILGUARD_KEY_LAYOUT", "hashed", "auto (tagged on a Redis Cluster, plain otherwise), plain or tagged"),
    ("TAILGUARD_TOPIC_PARTITIONS", "eight", "whole number"),
    ("TAILGUARD_METRICS_PORT", "65536", "0..65535"),
    ("TAILGUARD_METRICS_PORT", "-1", "0..65535"),
    ("TAILGUARD_WEB_PORT", "80.5", "whole number"),
    ("TAILGUARD_LOG_LEVEL", "verbose", "debug, info, warning or error"),
    ("TAILGUARD_ALLOCATOR", "tcmalloc", "auto, jemalloc or pymalloc"),
    ("TAILGUARD_METRICS_HOST", "", "listen address"),
    ("TAILGUARD_WEB_HOST", "0.0.0.0 ", "listen address"),
    ("TAILGUARD_PROXY_LISTEN", "127.0.0.1", "HOST:PORT"),
    ("TAILGUARD_PROXY_LISTEN", ":8080", "HOST:PORT"),
    ("TAILGUARD_KAFKA_SECURITY_PROTOCOL", "TLS", "SASL_SSL"),
    ("TAILGUARD_KAFKA_SASL_MECHANISM", "GSSAPI", "SCRAM-SHA-512"),
    ("TAILGUARD_KAFKA_SSL_CHECK_HOSTNAME", "maybe", "true or false"),
    ("TAILGUARD_KAFKA_SSL_CAFILE", "/etc/ca.pem", "uses no TLS"),
    ("TAILGUARD_REDIS_SSL_CAFILE", "/etc/ca.pem", "rediss://"),
    ("TAILGUARD_REPLACE_ENV", "KUBECONFIG HOME", "comma-separated"),
    ("TAILGUARD_REPLACE_TIMEOUT_S", "0.0", "seconds > 0"),
    ("TAILGUARD_REPLACE_TIMEOUT_S", "soon", "a number"),
    ("TAILGUARD_REPLACE_MAX_AGE_S", "inf", "seconds > 0"),
    ("TAILGUARD_REPLACE_ATTEMPTS", "0", "1..100"),
    ("TAILGUARD_MODE", "shadow", "observe (publish verdicts, route every node) or enforce"),
    ("TAILGUARD_HISTORY_TICKS", "500", "0..100 (0 keeps none)"),
    ("TAILGUARD_ALLOWLIST_PATTERN", "gpu-(", "regular expression"),
    ("TAILGUARD_ALLOWLIST_REDIS_KEY", "site nodes", "without spaces"),
    ("TAILGUARD_ALLOWLIST_REFRESH_S", "0.5", "[1, 3600]"),
    ("TAILGUARD_ID_PATTERN", "[a-z", "regular expression"),
    ("TAILGUARD_TOPIC_LATENCY_EVENTS", "", "Kafka topic name"),
    ("TAILGUARD_TOPIC_HEALTH_CHANGES", "node health", "Kafka topic name"),
    ("TAILGUARD_TOPIC_DEAD_LETTER", "x" * 250, "Kafka topic name"),
    ("TAILGUARD_TICK_INTERVAL_S", "0", "> 0.0"),
    ("TAILGUARD_TICK_INTERVAL_S", "thirty", "number"),
    ("TAILGUARD_TICK_INTERVAL_S", "nan", "finite"),
    ("TAILGUARD_WINDOW_SIZE", "9", ">= 10"),
    ("TAILGUARD_WINDOW_SIZE", "1000.5", "number (int)"),
    ("TAILGUARD_MIN_SAMPLES", "0", ">= 1"),
    ("TAILGUARD_MIN_SAMPLES", "5000", "at most window_size"),
    ("TAILGUARD_SHIFT_FACTOR", "0.8", "0 (off) or a factor above 1"),
    ("TAILGUARD_RATIO_THRESHOLD", "1", "> 1.0"),
    ("TAILGUARD_RATIO_THRESHOLD", "inf", "finite"),
    ("TAILGUARD_CONFIRM_WINDOWS", "0", ">= 1"),
    ("TAILGUARD_RELATIVE_P50_FACTOR", "0.5", "> 1.0"),
    ("TAILGUARD_MIN_PEERS", "1", ">= 2"),
    ("TAILGUARD_MAX_EJECTED_FRACTION", "1.5", "<= 1.0"),
    ("TAILGUARD_MAX_EJECTED_FRACTION", "-0.1", ">= 0.0"),
    ("TAILGUARD_WARMUP_S", "-1", ">= 0.0"),
    ("TAILGUARD_SIGNAL", "p99", "one of auto, latency, tpot, normalized"),
    ("TAILGUARD_MODEL_SIGNALS", "llama", "model=signal"),
    ("TAILGUARD_MODEL_SIGNALS", "llama=fast", "one of auto, latency, tpot, normalized"),
    ("TAILGUARD_LOAD_EVENT_FRACTION", "0", "> 0.0"),
    ("TAILGUARD_BACKOFF_MAX_S", "5", ">= backoff_initial_s"),
]


@pytest.mark.parametrize(("var", "value", "allowed"), BAD, ids=[f"{v}={x[:20]}" for v, x, _ in BAD])
def test_bad_value_names_variable_value_and_what_is_allowed(var: str, value: str, allowed: str) -> None:
    with pytest.raises(SettingError) as info:
        load({var: value})
    err = info.value
    assert err.name == var
    assert str(err.value) == value  # as typed ("0", not 0.0)
    assert allowed in err.allowed
    message = str(err)
    assert var in message and repr(err.value) in message and err.allowed in message


@pytest.mark.parametrize("url", ["redis://h:6379", "redis://h:6379/", "redis://h:6379/15",
                                 "rediss://u:p@h:6380/2?db=2", "unix:///run/redis.sock?db=3"])
def test_redis_url_with_a_numbered_or_no_db_is_accepted(url: str) -> None:
    assert load({"TAILGUARD_REDIS_URL": url}).redis_url == url


def test_app_id_of_227_kafka_topic_characters_is_accepted() -> None:
    # faust's longest topic, <app id>-judge_since-changelog, is then Kafka's 249.
    app_id = "Tg.eu_1-" + "x" * 219
    assert load({"TAILGUARD_APP_ID": app_id}).app_id == app_id


def test_cross_field_error_names_the_variable_even_when_it_was_not_set() -> None:
    # The user lowered the window below the default min_samples.
    with pytest.raises(SettingError) as info:
        load({"TAILGUARD_WINDOW_SIZE": "50"})
    assert info.value.name == "TAILGUARD_MIN_SAMPLES"
    assert "window_size (50)" in info.value.allowed


@pytest.mark.parametrize("var", ["TAILGUARD_TICK_INTERVAL", "TAILGUARD_KAFKA", "TAILGUARD_TOPIC_LATENCY"])
def test_unknown_tailguard_variable_is_rejected(var: str) -> None:
    with pytest.raises(SettingError) as info:
        load({var: "2"})
    assert info.value.name == var
    assert "known TAILGUARD_* variable" in info.value.allowed


def test_other_variables_are_ignored() -> None:
    assert load({"TAILGUARDX": "1", "KAFKA_BOOTSTRAP": "x", "tailguard_window_size": "abc"}) == Settings()


def test_one_replace_action_only() -> None:
    with pytest.raises(SettingError) as info:
        load({"TAILGUARD_REPLACE_COMMAND": "true", "TAILGUARD_REPLACE_WEBHOOK_URL": "http://x/"})
    assert info.value.name == "TAILGUARD_REPLACE_WEBHOOK_URL" and "TAILGUARD_REPLACE_COMMAND" in info.value.allowed


@pytest.mark.parametrize("env", [
    {"TAILGUARD_REPLACE_WEBHOOK_URL": "ftp://ops:tok3n-9f8e7d@fleet.internal/replace?key=k3y-abc"},
    {"TAILGUARD_REPLACE_WEBHOOK_URL": "https://hooks.example/T0/B1/tok3n-9f8e7d?key=k3y-abc",
     "TAILGUARD_REPLACE_COMMAND": "true"},
    {"TAILGUARD_REPLACE_WEBHOOK_URL_FILE": "SECRET_FILE"},
])
def test_the_webhook_url_is_a_secret_masked_in_every_error(env: dict[str, str], tmp_path: Path) -> None:
    if "TAILGUARD_REPLACE_WEBHOOK_URL_FILE" in env:     # the _FILE variant: a refused URL too
        f = tmp_path / "url"
        f.write_text("ftp://ops:tok3n-9f8e7d@fleet.internal/replace?key=k3y-abc\n")
        env = {"TAILGUARD_REPLACE_WEBHOOK_URL_FILE": str(f)}
    with pytest.raises(SettingError) as info:
        load(env)
    err = info.value
    assert err.name == "TAILGUARD_REPLACE_WEBHOOK_URL"
    for leak in ("tok3n", "k3y", "ops:", "fleet.internal", "hooks.example"):
        assert leak not in str(err) and leak not in repr(err.value), str(err)


def test_the_webhook_url_comes_from_a_file_and_never_prints(tmp_path: Path) -> None:
    f = tmp_path / "url"
    f.write_text("https://hooks.example/T0/B1/tok3n-9f8e7d\n")
    s = load({"TAILGUARD_REPLACE_WEBHOOK_URL_FILE": str(f)})
    assert s.replace_webhook_url.reveal() == "https://hooks.example/T0/B1/tok3n-9f8e7d"
    assert "tok3n" not in repr(s) and "tok3n" not in str(s.replace_webhook_url)


@pytest.mark.parametrize("name", ["TAILGUARD_KAFKA_SASL_PASSWORD", "TAILGUARD_REDIS_PASSWORD_FILE",
                                  "TAILGUARD_REPLACE_WEBHOOK_URL"])
def test_the_replace_command_cannot_be_given_a_secret_setting(name: str) -> None:
    with pytest.raises(SettingError) as info:
        load({"TAILGUARD_REPLACE_ENV": f"KUBECONFIG,{name}"})
    assert info.value.name == "TAILGUARD_REPLACE_ENV" and name in info.value.allowed


def test_hook_environment_variables_are_accepted() -> None:
    # A replace command or user check that runs `tailguard …` inherits them.
    assert load({"TAILGUARD_NODE_ID": "n1", "TAILGUARD_MODEL": "m", "TAILGUARD_RETIREMENT_ID": "x"}) == Settings()


def test_script_only_variables_are_accepted() -> None:
    env = {"TAILGUARD_CACHE": "/c", "TAILGUARD_RUN": "/r", "TAILGUARD_VENV": "/v", "TAILGUARD_PYTHON": "python3",
           "TAILGUARD_KAFKA_PORT": "19092", "TAILGUARD_KAFKA_CONTROLLER_PORT": "19093",
           "TAILGUARD_KAFKA_SASL_SSL_PORT": "19094", "TAILGUARD_REDIS_PORT": "16379",
           "TAILGUARD_REDIS_TLS_PORT": "16380"}
    assert load(env) == Settings()


# --- the command line -------------------------------------------------------


def test_tailguard_settings_prints_every_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in list(settings_mod.env_names()):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TAILGUARD_WINDOW_SIZE", "2000")
    assert cli.main(["settings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    printed = dict(line.split("=", 1) for line in lines)
    assert set(printed) == set(settings_mod.env_names())
    assert printed["TAILGUARD_WINDOW_SIZE"] == "2000   (default 1000)"
    assert printed["TAILGUARD_KAFKA_BOOTSTRAP"] == "127.0.0.1:9092"


def test_tailguard_settings_masks_the_webhook_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in list(settings_mod.env_names()):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TAILGUARD_REPLACE_WEBHOOK_URL", "https://u:pw@hooks.example/T0/B1/tok3n-9f8e7d")
    assert cli.main(["settings"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("TAILGUARD_REPLACE_WEBHOOK_URL=")]
    assert line.startswith("TAILGUARD_REPLACE_WEBHOOK_URL=***"), line
    assert "tok3n" not in out and "pw@" not in out


def test_tailguard_with_bad_setting_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TAILGUARD_RATIO_THRESHOLD", "0.5")
    assert cli.main(["settings"]) == 2
    err = capsys.readouterr().err
    assert "TAILGUARD_RATIO_THRESHOLD" in err and "0.5" in err and "> 1.0" in err


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly() -> None:
    """`tailguard settings | head -2`: no BrokenPipeError traceback, nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "settings"], env={"PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()                 # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert err == ""


def test_unknown_command_exits_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "usage: tailguard" in err


@pytest.mark.parametrize("argv", [[], ["--help"], ["help"]])
def test_help_lists_every_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_console_entry_point_in_a_fresh_process() -> None:
    """The installed program, not just the function: exit codes survive the process boundary."""
    env = {"PATH": "/usr/bin:/bin", "TAILGUARD_LOG_LEVEL": "loud"}
    bad = subprocess.run([sys.executable, "-m", "tailguard.cli", "settings"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert "TAILGUARD_LOG_LEVEL='loud'" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "tailguard.cli", "nope"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert unknown.returncode == 2
    ok = subprocess.run([sys.executable, "-m", "tailguard.cli", "settings"], env={"PATH": "/usr/bin:/bin"},
                        capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0 and "TAILGUARD_WINDOW_SIZE=1000" in ok.stdout
