"""The minimal demo tells the truth: the slow node leaves the routing set, in Redis too."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from tailguard.demo import minimal as demo_min

pytestmark = pytest.mark.integration


@pytest.fixture
def demo_prefix(redis_url: str, unique_name: Callable[[str], str]) -> Iterator[str]:
    prefix = unique_name("demo")
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def test_demo_removes_the_slow_node_and_redis_shows_it(
    demo_prefix: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_url)
    code = demo_min.main(["--pause-s", "0", "--key-prefix", demo_prefix, "--slow-node", "gpu-node-03"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gpu-node-03 left the routing set" in out
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        members = client.smembers(f"{demo_prefix}:routing:{demo_min.MODEL}")
    finally:
        client.close()
    assert members == set(demo_min.NODES) - {"gpu-node-03"}


def test_demo_reports_failure_when_no_node_degrades(capsys: pytest.CaptureFixture[str]) -> None:
    code = demo_min.main(["--pause-s", "0", "--no-redis", "--degrade-at-s", "1000", "--duration-s", "40"])
    out = capsys.readouterr().out
    assert code == 1
    assert "STILL in the routing set" in out and "result: FAILED" in out
