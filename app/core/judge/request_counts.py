"""A model's request counters, kept for the error-rate and stall rules: one array per model.

Owns :class:`RequestCounts`: per pair, stage 1's cumulative (requests, failed) at the pair's
last few ticks it was in (a pair absent from a tick's summaries records nothing that tick).
The pairs of the last tick, in its order, are the rows of a ring of columns (ticks x rows x
2, int64): a tick writes its counters into the column after the newest and makes it the
newest, so that a tick naming the same nodes in the same order moves no counter (in another
order: the rows permuted at once); a row's columns older than its ticks hold :data:`PAD`
(below any counter). A pair absent from the last tick waits in the snapshot form.

Guarantees: :meth:`RequestCounts.to_lists` is the snapshot form (per node, the counters flat,
oldest first: requests, failed, requests, failed, ...; nodes sorted) and
:meth:`RequestCounts.from_lists` restores it exactly, so equal counters give equal snapshots;
a tick keeps at most the number of ticks :meth:`RequestCounts.begin` is given, dropping the
oldest. Pure: no clock, no I/O.

Rationale: docs/performance.md (the request counters as arrays, 2026-12-06).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress
from typing import Final

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

PAD: Final = int(np.iinfo(np.int64).min)     # before a row's ticks: at most any counter


class RequestCounts:
    """One model's per-pair request counters (module docstring)."""

    __slots__ = ("_away", "_full", "_head", "_held", "_nodes", "_ring", "_rows", "checked")

    def __init__(self) -> None:
        self._nodes: list[str] = []                        # ring row -> node
        self._rows: dict[str, int] | None = {}             # node -> ring row (None: not made)
        self._ring: I64 = _blank(2, 0)                     # column x row x (requests, failed)
        self._head = 0                                     # the newest column
        self._held: I64 = np.zeros(0, np.int64)            # ticks held by each row
        self._full = False                                 # every row holds a tick in each column
        self._away: dict[str, list[int]] = {}              # absent pairs, in the snapshot form
        # For the rules: a token of the pair table every row's node was last found in (None
        # after the rows change).
        self.checked: object = None

    @classmethod
    def from_lists(cls, lists: Mapping[str, Sequence[int]]) -> RequestCounts:
        """The counters of the snapshot form (each list non-empty, even, of int64 values)."""
        out = cls()
        out._away = {node: list(v) for node, v in lists.items()}
        return out

    def to_lists(self) -> dict[str, list[int]]:
        """The snapshot form (module docstring)."""
        out = {node: list(v) for node, v in self._away.items()}
        ticks = self._ticks()
        for row, (node, held) in enumerate(zip(self._nodes, self._held.tolist(), strict=True)):
            if held:
                out[node] = ticks[len(ticks) - held:, row].ravel().tolist()
        return dict(sorted(out.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestCounts):
            return NotImplemented
        return self.to_lists() == other.to_lists()

    __hash__ = None     # type: ignore[assignment]   # mutable

    def __repr__(self) -> str:
        return f"RequestCounts({self.to_lists()!r})"

    def __len__(self) -> int:
        return len(self._nodes) + len(self._away)

    def __contains__(self, node: object) -> bool:
        return node in self._row_of() or node in self._away

    def row(self, node: str) -> int | None:
        """The row of ``node`` in the ring (a node of the last tick)."""
        return self._row_of().get(node)

    def _row_of(self) -> dict[str, int]:
        rows = self._rows
        if rows is None:
            rows = self._rows = dict(zip(self._nodes, range(len(self._nodes)), strict=True))
        return rows

    def drop(self, node: str) -> None:
        """Forget ``node``'s counters."""
        self._away.pop(node, None)
        row = self._row_of().get(node)
        if row is not None:
            self._nodes = [v for v in self._nodes if v != node]
            self._rows = None
            self._ring = np.delete(self._ring, row, axis=1)
            self._held = np.delete(self._held, row)
            self.checked = None

    def _ticks(self) -> I64:
        """The ring's ticks, oldest first (a copy)."""
        size = len(self._ring)
        return self._ring[[(self._head + 1 + k) % size for k in range(1, size)]]

    def _reshape(self, keys: list[str], cols: int, cap: int = 1) -> list[int]:
        """Rows for ``keys`` in that order, room for at least ``cap`` ticks (and for what they
        hold, up to ``cols``: the newest kept); the other pairs wait in the snapshot form.
        The rows of new nodes."""
        old, held_old, rows = self._ticks(), self._held, self._row_of()
        came = {node: self._away.pop(node) for node in keys
                if node not in rows and node in self._away}
        longest = max([int(held_old.max()) if len(held_old) else 0,
                       *(len(v) // 2 for v in came.values())])
        cap = max(1, min(cols, max(cap, longest + 1)))
        ring = _blank(cap + 1, len(keys))
        held = np.zeros(len(keys), np.int64)
        src = [rows.get(node, -1) for node in keys]
        stay = [row for row, at in enumerate(src) if at >= 0]
        if stay:        # columns before a row's ticks hold the pad: copied as they are
            k, width = min(cap, len(old)), len(old)
            at = [src[row] for row in stay]
            ring[cap - k:cap, stay] = old[width - k:][:, at]
            held[stay] = np.minimum(held_old[at], cap)
        new: list[int] = []
        for row, node in enumerate(keys):
            if src[row] >= 0:
                continue
            if not (v := came.get(node)):
                new.append(row)
                continue
            k = held[row] = min(cap, len(v) // 2)
            ring[cap - k:cap, row] = np.asarray(v[len(v) - 2 * k:], np.int64).reshape(k, 2)
        there = set(keys)
        for node, at_row in rows.items():
            if node not in there and (k := int(held_old[at_row])):
                self._away[node] = old[len(old) - k:, at_row].ravel().tolist()
        self._nodes, self._rows = keys, None
        self._ring, self._head, self._held = ring, cap - 1, held
        self._full = False
        self.checked = None
        return new

    def begin(self, keys: list[str], cols: int) -> tuple[I64, I64, I64, list[int]]:
        """Rows for the pairs of ``keys`` (distinct nodes) in that order, with room for this
        tick's counters within ``cols`` ticks: (the column to write them into, the newest
        column, each row's ticks held, the rows of new nodes), each valid until
        :meth:`advance`. A new node's row holds no tick."""
        cap = len(self._ring) - 1
        new: list[int] = []
        if cap > cols or (keys != self._nodes and not self._reorder(keys)):
            new = self._reshape(keys, cols)
            cap = len(self._ring) - 1
        if cap < cols and (self._full or (len(keys) and int(np.maximum.reduce(self._held)) >= cap)):
            self._widen(min(cols, 2 * cap))           # no row may lose a tick below cols
        ring, head = self._ring, self._head
        return ring[(head + 1) % len(ring)], ring[head], self._held, new

    def _reorder(self, keys: list[str]) -> bool:
        """The same nodes as the rows, in the order of ``keys``, if they are (summaries from
        several stage-1 workers can come in another order each tick)."""
        rows = self._row_of()
        if len(keys) != len(rows):
            return False
        try:
            at = np.fromiter(map(rows.__getitem__, keys), np.intp, len(keys))
        except KeyError:
            return False
        self._ring, self._held = self._ring[:, at], self._held[at]
        self._nodes, self._rows = keys, None
        return True

    def _widen(self, cap: int) -> None:
        """The same rows, room for ``cap`` ticks (more than now)."""
        old = self._ticks()
        ring = _blank(cap + 1, old.shape[1])
        ring[cap - len(old):cap] = old
        self._ring, self._head, self._full = ring, cap - 1, False

    def ago(self, k: int) -> I64:
        """The column of the tick ``k`` ticks before this one (1: the newest; at most the
        capacity given at :meth:`begin`)."""
        col: I64 = self._ring[(self._head + 1 - k) % len(self._ring)]
        return col

    def at_most(self, top: I64, k: int) -> tuple[I64, I64]:
        """Per row, of its last ``k`` ticks (at most the capacity): how many have requests
        at most ``top`` (the pad before a row's ticks included: the oldest ones, as a row's
        requests never go back), and the counters of the newest of them (undefined where
        none). The column being written must be above ``top``."""
        ring, head = self._ring, self._head
        size = len(ring)
        if k == size - 1:       # every column but the one being written: no gather
            enough = np.add.reduce(ring[:, :, 0] <= top, 0)
        else:
            past = ring[[(head + 1 - k + j) % size for j in range(k)], :, 0]
            enough = np.add.reduce(past <= top, 0)
        return enough, ring[(head - k + enough) % size, np.arange(len(top))]

    @property
    def capacity(self) -> int:
        """How many ticks a row can hold now."""
        return len(self._ring) - 1

    @property
    def full(self) -> bool:
        """Whether every row holds a tick in every column (False when not known)."""
        return self._full

    def advance(self, restart: Bools | None) -> None:
        """Make the column written since :meth:`begin` the newest; a row of ``restart`` then
        holds it alone."""
        ring = self._ring
        size = len(ring)
        head = self._head = (self._head + 1) % size
        held = self._held
        full = self._full
        if not full:
            held += 1
            np.minimum(held, size - 1, out=held)
        if restart is not None:
            rows = restart.nonzero()[0]
            keep = ring[head, rows]
            ring[:, rows] = (PAD, 0)
            ring[head, rows] = keep
            held[rows] = 1
            full = False
        self._full = full or not len(held) or bool(np.minimum.reduce(held) >= size - 1)

    def served(self, span: int) -> dict[str, int]:
        """Of the rows holding more than ``span`` ticks (after :meth:`advance`): node ->
        requests over their last ``span`` ticks."""
        if self.capacity <= span:
            return {}
        more = (self._held > span).tolist()
        diff = (self._ring[self._head, :, 0] - self.ago(span + 1)[:, 0]).tolist()
        return dict(zip(compress(self._nodes, more), compress(diff, more), strict=True))


def _blank(cols: int, rows: int) -> I64:
    """A ring of no ticks: requests :data:`PAD`, failed 0."""
    ring = np.zeros((cols, rows, 2), np.int64)
    ring[:, :, 0] = PAD
    return ring
