"""The emitter's back-off and rate-limited warnings (tailguard.emitter.pacing), on a fake clock."""

from __future__ import annotations

import logging
import math

import pytest

from tailguard.emitter.pacing import Backoff, LogLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_backoff_doubles_from_initial_to_max_and_starts_over() -> None:
    clock = Clock()
    b = Backoff(0.2, 1.0, clock)
    assert (b.delay_s, b.retry_at) == (0.0, -math.inf)
    delays = []
    for _ in range(5):
        b.failed()
        delays.append(b.delay_s)
        assert b.retry_at == clock.t + b.delay_s
    assert delays == [0.2, 0.4, 0.8, 1.0, 1.0]
    b.delivered()                       # the next failure waits initial_s; the wait in force stays
    assert b.delay_s == 0.0 and b.retry_at == clock.t + 1.0
    b.failed()
    assert b.delay_s == 0.2
    b.connected()
    assert (b.delay_s, b.retry_at) == (0.0, -math.inf)


def test_log_limiter_says_each_kind_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    say = LogLimiter(logging.getLogger("tailguard.emitter"), 30.0, clock)
    with caplog.at_level(logging.WARNING, logger="tailguard.emitter"):
        assert say.log("send", logging.WARNING, "send failed %d", 1)
        assert not say.log("send", logging.WARNING, "send failed %d", 2)
        assert say.log("connect", logging.WARNING, "cannot connect")
        clock.t += 29.9
        assert not say.log("send", logging.WARNING, "send failed %d", 3)
        clock.t += 0.1
        assert say.log("send", logging.WARNING, "send failed %d", 4)
    assert [r.getMessage() for r in caplog.records] == ["send failed 1", "cannot connect", "send failed 4"]
