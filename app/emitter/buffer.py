"""The emitter's bounded sample buffer: per-series FIFOs, drop-oldest, due batches.

Pure and synchronous (no clock, no I/O, no lock): the caller passes ``now_s``
(a monotonic time) and serialises access. Guarantees:

* At most ``max_buffered`` samples are held. Adding one more drops the
  *oldest* sample across all series (smallest sequence number, so a
  re-queued sample, which keeps its original number, goes first) and counts
  it in :attr:`SeriesBuffer.dropped`.
* :meth:`pop_due` returns at most ``max_batch`` samples of one series, in
  arrival order, and only when that series holds ``max_batch`` samples or its
  oldest sample has waited ``linger_s`` (or ``force``). Among due series the
  one with the oldest sample goes first, so no series starves.
* Nothing is lost silently: ``added == popped + dropped + total`` at all
  times, where a re-queue undoes a pop (tested with Hypothesis against a
  reference model).

Cost: ``add`` is O(1) unless the buffer is full; ``pop_due``,
``next_deadline`` and a drop are O(number of non-empty series), which is a
handful per process (one node × the models it serves).
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Iterable

from tailguard.emitter.wire import SEQ, T_IN, Sample, SeriesKey


def _seq(s: Sample) -> int:
    return s[SEQ]


class SeriesBuffer:
    """Per-series sample FIFOs bounded in total; see the module docstring."""

    __slots__ = ("_series", "dropped", "linger_s", "max_batch", "max_buffered", "total")

    def __init__(self, *, max_batch: int, linger_s: float, max_buffered: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered!r}")
        if not linger_s >= 0:
            raise ValueError(f"linger_s must be >= 0, got {linger_s!r}")
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.max_buffered = max_buffered
        self.total = 0
        self.dropped = 0
        # Only non-empty series are present.
        self._series: dict[SeriesKey, collections.deque[Sample]] = {}

    def add(self, key: SeriesKey, sample: Sample) -> bool:
        """Buffer ``sample``; True when the flusher should re-plan (see below).

        True when the series was empty (a new linger deadline starts) or just
        reached ``max_batch`` (a batch is due now); otherwise False, so a
        flusher on another thread is woken twice per batch, not per sample.
        """
        q = self._series.get(key)
        if q is None:
            q = self._series[key] = collections.deque()
        q.append(sample)
        self.total += 1
        if self.total > self.max_buffered:
            self._drop_oldest()
        n = len(q)
        return n == 1 or n == self.max_batch

    def requeue(self, key: SeriesKey, samples: Iterable[Sample]) -> None:
        """Put samples whose send failed back into their series, in sequence order.

        Failed messages may come back in any order; merging by sequence number
        keeps each series in arrival order (so the head is its oldest sample).
        """
        back = list(samples)
        if not back:
            return
        q = self._series.get(key)
        if q is None or not q or back[-1][SEQ] < q[0][SEQ]:
            if q is None:
                q = self._series[key] = collections.deque()
            q.extendleft(reversed(back))
        else:
            q = self._series[key] = collections.deque(heapq.merge(back, q, key=_seq))
        self.total += len(back)
        while self.total > self.max_buffered:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        key, q = min(self._series.items(), key=lambda kv: kv[1][0][SEQ])
        q.popleft()
        if not q:
            del self._series[key]
        self.total -= 1
        self.dropped += 1

    def pop_due(self, now_s: float, *, force: bool = False) -> tuple[SeriesKey, list[Sample]] | None:
        """The next due batch, or None when no series is due at ``now_s``."""
        best: tuple[SeriesKey, collections.deque[Sample]] | None = None
        linger_s = self.linger_s
        for key, q in self._series.items():
            # Same arithmetic as next_deadline(), so "due" and "deadline passed" agree exactly.
            due = force or len(q) >= self.max_batch or q[0][T_IN] + linger_s <= now_s
            if due and (best is None or q[0][SEQ] < best[1][0][SEQ]):
                best = (key, q)
        if best is None:
            return None
        key, q = best
        n = min(len(q), self.max_batch)
        batch = [q.popleft() for _ in range(n)]
        if not q:
            del self._series[key]
        self.total -= n
        return key, batch

    def next_deadline(self) -> float | None:
        """Monotonic time at which the next series becomes due by linger (None: empty)."""
        if not self._series:
            return None
        return min(q[0][T_IN] for q in self._series.values()) + self.linger_s

    def any_full(self) -> bool:
        """True when some series holds a full batch (due regardless of time)."""
        return any(len(q) >= self.max_batch for q in self._series.values())

    def clear(self) -> int:
        """Discard everything (counted as dropped); returns how many samples that was."""
        n = self.total
        self._series.clear()
        self.total = 0
        self.dropped += n
        return n
