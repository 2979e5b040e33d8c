"""SeriesBuffer: batching by size and by linger, drop-oldest, conservation (pure, no clock)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.emitter.buffer import SeriesBuffer
from tailguard.emitter.wire import Sample, SeriesKey

A: SeriesKey = ("node-a", "llama", None)
B: SeriesKey = ("node-b", "llama", "A100")


class Samples:
    """Makes samples with increasing sequence numbers, like the emitter does."""

    def __init__(self) -> None:
        self.seq = itertools.count(1)

    def __call__(self, t_in: float, latency_us: float = 1000.0) -> Sample:
        return (next(self.seq), t_in, 1_700_000_000.0 + t_in, latency_us, None, None, None, True, False)


def test_batch_is_due_at_max_batch_regardless_of_time() -> None:
    buf, mk = SeriesBuffer(max_batch=3, linger_s=10.0, max_buffered=100), Samples()
    wakes = [buf.add(A, mk(0.0)) for _ in range(3)]
    assert wakes == [True, False, True]          # first sample (deadline) and the full batch
    assert buf.add(A, mk(0.0)) is False
    item = buf.pop_due(0.0)
    assert item is not None and item[0] == A and [s[0] for s in item[1]] == [1, 2, 3]
    assert buf.pop_due(0.0) is None               # one sample left, not lingered yet
    assert buf.total == 1


def test_small_batch_is_due_after_linger_exactly_at_next_deadline() -> None:
    buf, mk = SeriesBuffer(max_batch=500, linger_s=0.25, max_buffered=1000), Samples()
    buf.add(A, mk(10.0))
    buf.add(A, mk(10.1))
    assert buf.next_deadline() == pytest.approx(10.25)
    assert buf.pop_due(10.2499) is None
    deadline = buf.next_deadline()
    assert deadline is not None
    item = buf.pop_due(deadline)
    assert item is not None and len(item[1]) == 2
    assert buf.next_deadline() is None and buf.total == 0


def test_force_pops_everything_oldest_series_first() -> None:
    buf, mk = SeriesBuffer(max_batch=2, linger_s=100.0, max_buffered=100), Samples()
    buf.add(B, mk(0.0))
    buf.add(A, mk(0.0))
    buf.add(A, mk(0.0))
    buf.add(A, mk(0.0))
    order = []
    while (item := buf.pop_due(0.0, force=True)) is not None:
        order.append((item[0], [s[0] for s in item[1]]))
    assert order == [(B, [1]), (A, [2, 3]), (A, [4])]


def test_full_buffer_drops_the_oldest_across_series() -> None:
    buf, mk = SeriesBuffer(max_batch=10, linger_s=1.0, max_buffered=4), Samples()
    for key in (A, B, A, B, A, B):
        buf.add(key, mk(0.0))
    assert buf.total == 4 and buf.dropped == 2
    kept = []
    while (item := buf.pop_due(0.0, force=True)) is not None:
        kept += [s[0] for s in item[1]]
    assert sorted(kept) == [3, 4, 5, 6]


def test_requeued_samples_are_first_out_and_first_dropped() -> None:
    buf, mk = SeriesBuffer(max_batch=2, linger_s=1.0, max_buffered=3), Samples()
    for _ in range(2):
        buf.add(A, mk(0.0))
    item = buf.pop_due(0.0)
    assert item is not None
    buf.add(A, mk(0.0))                  # seq 3
    buf.add(A, mk(0.0))                  # seq 4
    buf.requeue(A, item[1])              # seq 1, 2 back: 4 samples > 3 -> seq 1 dropped
    assert buf.dropped == 1 and buf.total == 3
    again = buf.pop_due(0.0)
    assert again is not None and [s[0] for s in again[1]] == [2, 3]


@pytest.mark.parametrize(("kwargs", "culprit"), [
    ({"max_batch": 0, "linger_s": 1.0, "max_buffered": 10}, "max_batch"),
    ({"max_batch": 1, "linger_s": -1.0, "max_buffered": 10}, "linger_s"),
    ({"max_batch": 1, "linger_s": 1.0, "max_buffered": 0}, "max_buffered"),
])
def test_bad_arguments_name_the_culprit(kwargs: dict[str, float], culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        SeriesBuffer(**kwargs)  # type: ignore[arg-type]


KEYS = [A, B, ("node-c", "embed", None)]
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(range(len(KEYS))), st.floats(0, 5)),
    st.tuples(st.just("pop"), st.booleans(), st.floats(0, 5)),
    st.tuples(st.just("requeue"), st.integers(0, 10), st.just(0.0)),
), max_size=200)


@settings(max_examples=300, deadline=None)
@given(ops=ops, max_batch=st.integers(1, 6), max_buffered=st.integers(1, 12), linger_s=st.floats(0, 2))
def test_invariants_against_a_reference_model(ops: list[tuple[str, object, float]], max_batch: int,
                                              max_buffered: int, linger_s: float) -> None:
    """Bounded; every drop takes the globally oldest sample; FIFO per series; nothing lost."""
    buf, mk = SeriesBuffer(max_batch=max_batch, linger_s=linger_s, max_buffered=max_buffered), Samples()
    present: dict[int, SeriesKey] = {}      # reference model: seq -> series of every buffered sample
    expected_dropped = 0
    added = popped = 0
    in_flight: list[tuple[SeriesKey, list[Sample]]] = []
    now = 0.0

    def overflow() -> None:
        nonlocal expected_dropped
        while len(present) > max_buffered:
            del present[min(present)]
            expected_dropped += 1

    for op, arg, dt in ops:
        now += dt
        if op == "add":
            key = KEYS[arg]  # type: ignore[index]
            s = mk(now)
            buf.add(key, s)
            present[s[0]] = key
            added += 1
            overflow()
        elif op == "pop":
            item = buf.pop_due(now, force=bool(arg))
            if item is not None:
                key, batch = item
                seqs = [s[0] for s in batch]
                assert 1 <= len(batch) <= max_batch
                assert all(present[q] == key for q in seqs)
                mine = sorted(q for q, k in present.items() if k == key)
                assert seqs == mine[:len(seqs)]          # FIFO within the series
                for q in seqs:
                    del present[q]
                popped += len(batch)
                in_flight.append(item)
        elif in_flight:
            key, batch = in_flight.pop(int(arg) % len(in_flight))  # type: ignore[call-overload]
            buf.requeue(key, batch)
            for s in batch:
                present[s[0]] = key
            popped -= len(batch)            # a re-queue undoes a pop
            overflow()
        assert buf.total == len(present) <= max_buffered
        assert buf.dropped == expected_dropped
        assert added == popped + buf.dropped + buf.total
    contents = set()
    while (item := buf.pop_due(now, force=True)) is not None:
        contents |= {s[0] for s in item[1]}
    assert contents == set(present)
