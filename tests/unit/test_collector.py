"""The collector's pauses and the worker's fewer full passes (tailguard.collector)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tailguard.collector import collect_if_due, collector_paused, fewer_full_collections


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*before)
    if enabled:
        gc.enable()


def test_fewer_full_collections_changes_only_the_oldest_generations_threshold() -> None:
    young, middle, _ = gc.get_threshold()
    fewer_full_collections(100)
    assert gc.get_threshold() == (young, middle, 100)


def test_fewer_full_collections_refuses_less_than_one() -> None:
    with pytest.raises(ValueError, match="every"):
        fewer_full_collections(0)


def test_a_pause_ends_enabled_also_on_an_error_and_keeps_someone_elses_disable() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_collect_if_due_makes_a_full_pass_only_when_due() -> None:
    gc.collect()                                  # the counts start again from 0
    assert gc.get_count()[2] == 0
    assert not collect_if_due(1)
    gc.collect(1)                                 # one pass over the middle generation
    assert gc.get_count()[2] == 1
    assert collect_if_due(1)
    assert gc.get_count()[2] == 0
