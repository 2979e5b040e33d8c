"""``tailguard worker``: what stops it before it starts, in one line naming the setting or flag.

Every case here fails before the worker connects to Kafka or Redis (no stack needed).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard import cli
from tailguard import settings as settings_mod
from tailguard.streaming import worker
from tailguard.streaming.topics import TopicSetup


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    for var in list(settings_mod.env_names()):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TAILGUARD_DATA_DIR", str(tmp_path_factory.mktemp("data")))


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:          # another program listening there
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_set_without_equals_says_key_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["worker", "--set", "tick_interval_s"]) == 2
    err = capsys.readouterr().err
    assert "--set='tick_interval_s'" in err and "KEY=VALUE" in err
    assert "expected a number" not in err and len(err.splitlines()) == 1


def test_set_with_a_bad_value_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["worker", "--set", "tick_interval_s=soon"]) == 2
    assert "--set tick_interval_s='soon'" in capsys.readouterr().err


def test_a_data_dir_it_cannot_create_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TAILGUARD_DATA_DIR", "/proc/nope")
    assert cli.main(["worker"]) == 2
    err = capsys.readouterr().err
    assert "TAILGUARD_DATA_DIR='/proc/nope'" in err and "create and write" in err
    assert len(err.splitlines()) == 1


def test_missing_parents_of_the_data_dir_are_created(tmp_path: Path) -> None:
    path = f"{tmp_path}/a/b"
    worker.check_data_dir(path)        # faust itself makes only the last level
    worker.check_data_dir(path)


@pytest.mark.parametrize(("port_var", "host_var", "other"), [
    ("TAILGUARD_METRICS_PORT", "TAILGUARD_METRICS_HOST", "TAILGUARD_WEB_PORT"),
    ("TAILGUARD_WEB_PORT", "TAILGUARD_WEB_HOST", "TAILGUARD_METRICS_PORT"),
])
def test_a_port_in_use_exits_1_naming_the_setting_and_the_address(
    port_var: str, host_var: str, other: str, busy_port: int,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(port_var, str(busy_port))
    monkeypatch.setenv(other, "0")
    assert cli.main(["worker"]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{busy_port} ({host_var}, {port_var})" in err
    assert "in use" in err and len(err.splitlines()) == 1


def test_a_free_port_or_port_0_is_no_problem() -> None:
    assert worker.listen_problem("H", "P", "127.0.0.1", 0) is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert worker.listen_problem("H", "P", "127.0.0.1", port) is None


def test_start_up_line_names_kafka_redis_with_password_masked_and_prefix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # Logged once the start-up checks passed (a refused start stays one line on stderr);
    # the checks and the app are stand-ins here: no stack needed.
    async def passes(*_: object) -> None:
        return None

    async def no_topics(*_: object) -> TopicSetup:
        return TopicSetup([], 1)

    class Started(Exception):
        pass

    def create_app(*_: object) -> None:
        raise Started

    for name in ("check_redis", "check_kafka"):
        monkeypatch.setattr(worker, name, passes)
    monkeypatch.setattr(worker, "ensure_topics", no_topics)
    monkeypatch.setattr(worker.allowlist, "check", passes)
    monkeypatch.setattr("tailguard.streaming.service.create_app", create_app)
    monkeypatch.setenv("TAILGUARD_REDIS_URL", "redis://u:s3cret@redis.internal:6379/2")
    monkeypatch.setenv("TAILGUARD_KEY_PREFIX", "tg-eu")
    monkeypatch.setenv("TAILGUARD_WEB_PORT", "0")
    monkeypatch.setenv("TAILGUARD_METRICS_PORT", "0")
    with caplog.at_level(logging.INFO, logger="tailguard.worker"), pytest.raises(Started):
        cli.main(["worker"])
    assert "s3cret" not in caplog.text
    assert ("Kafka at 127.0.0.1:9092 (TAILGUARD_KAFKA_BOOTSTRAP), Redis at "
            "redis://u:***@redis.internal:6379/2 (TAILGUARD_REDIS_URL), key prefix 'tg-eu'") in caplog.text


async def test_a_broker_that_accepts_but_never_answers_is_named_with_a_cause() -> None:
    # A listener that takes the connection and says nothing: the error used to end in "()".
    from tailguard.streaming.errors import StreamingError
    from tailguard.streaming.topics import ensure_topics

    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        settings = settings_mod.load({"TAILGUARD_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"})
        with pytest.raises(StreamingError) as e:
            await ensure_topics(settings, timeout_s=0.5)
    finally:
        server.close()
    assert f"cannot reach the broker at 127.0.0.1:{port} (" in str(e.value)
    assert "()" not in str(e.value), str(e.value)


def test_new_topics_get_the_replication_setting_or_min_3_brokers_and_an_isr_below_it() -> None:
    from tailguard.streaming.errors import StreamingError
    from tailguard.streaming.topics import replication_for, topic_configs

    default = settings_mod.load({})
    assert [replication_for(default, b) for b in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert replication_for(settings_mod.load({"TAILGUARD_REPLICATION_FACTOR": "2"}), 3) == 2
    with pytest.raises(StreamingError, match="TAILGUARD_REPLICATION_FACTOR=3 needs at least"):
        replication_for(settings_mod.load({"TAILGUARD_REPLICATION_FACTOR": "3"}), 1)
    assert topic_configs(3, compacted=False) == {"min.insync.replicas": "2"}
    assert topic_configs(1, compacted=True) == {"cleanup.policy": "compact"}
    assert topic_configs(2, compacted=False) == {}


def test_the_changelogs_created_before_faust_starts_are_the_ones_its_tables_use(
        tmp_path: Path) -> None:
    # ensure_topics creates them (compacted) so that they exist, with leaders, before the
    # consumer group forms; a name that drifted from faust's would leave the race open.
    from tailguard.streaming.service import create_app
    from tailguard.streaming.topics import changelog_names

    settings = settings_mod.load({"TAILGUARD_APP_ID": "tg-changelogs"}, data_dir=str(tmp_path))
    app = create_app(settings)
    assert sorted(t.changelog_topic.get_topic_name() for t in app.tables.values()) == \
        sorted(changelog_names(settings))
