"""The demo's wait for a stable consumer group: a broker still loading its groups is "not yet"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import GroupLoadInProgressError, UnknownError

from tailguard.demo.stack import _group_stable


class _Admin:
    def __init__(self, error: Exception | None, groups: list[tuple[str, str]]) -> None:
        self.error, self.groups = error, groups

    async def list_consumer_groups(self) -> list[tuple[str, str]]:
        if self.error is not None:
            raise self.error
        return self.groups

    async def describe_consumer_groups(self, _groups: list[str]) -> list[Any]:
        return []


def test_a_group_load_in_progress_is_not_yet_stable() -> None:
    admin: Any = _Admin(GroupLoadInProgressError(), [])
    assert asyncio.run(_group_stable(admin, "g")) is False


def test_a_non_retriable_error_is_raised() -> None:
    admin: Any = _Admin(UnknownError(), [])
    with pytest.raises(UnknownError):
        asyncio.run(_group_stable(admin, "g"))


def test_an_unlisted_group_is_not_stable() -> None:
    admin: Any = _Admin(None, [("other", "consumer")])
    assert asyncio.run(_group_stable(admin, "g")) is False
