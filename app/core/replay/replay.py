"""Replay: the detector over a sequence of JSON-lines latency events, in event time.

Owns :func:`replay` and :class:`Replay`, the pure part of ``tailguard replay``
(:mod:`tailguard.replay_cli`): lines from any iterable in, each output line (a transition or a
fleet event, keys in docs/replay.md) to ``emit``. No clock is read anywhere.

Guarantees:

* Ticks at the multiples of ``tick_interval_s`` of event time, each evaluated once as soon as
  an event at or past it is read, plus a final tick after the last event. An out-of-order
  event counts from the next tick on. Empty ticks where nothing can change print nothing.
* A line more than ``max_future_skew_s`` past the latest event time is held back: a real jump
  once ``JUMP_CONFIRM_LINES`` come in a row from ``JUMP_CONFIRM_NODES`` nodes (or
  ``JUMP_ALONE_LINES`` from one), or at the end unless other nodes sent events; else bad
  input (``future_ts``). A node ``AHEAD_TICKS`` intervals past the fleet's median, or one past
  all but ``QUORUM_NODES - 1`` other nodes, runs no tick: its early lines wait (docs/replay.md).
* Bad lines, and samples read too late for any tick to judge them, are skipped and counted
  in :class:`ReplayStats` (by reason, first line numbers).
* The same trace and settings give the same output, for any ``chunk_lines``.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import Event, SampleBatch, loads
from tailguard.core.contract.types import TickResult
from tailguard.core.replay.detector import Detector
from tailguard.core.window.accumulate import Accumulator, Parsed

PROGRESS_EVERY_LINES = 100_000
JUMP_CONFIRM_LINES = 20
JUMP_CONFIRM_NODES = 2
JUMP_ALONE_LINES = 1000
AHEAD_TICKS = 2      # a node this many tick intervals ahead of the fleet's clock does not move it
QUORUM_NODES = 2     # ... nor one more than a tick ahead of all but one of the other nodes
FIRST_BAD_LINES = 5
_UNDECODED: Any = object()
CHUNK_LINES = 2_000


@dataclass(slots=True)
class ReplayStats:
    lines: int = 0
    events: int = 0
    ticks: int = 0
    skipped_ticks: int = 0
    transitions: int = 0
    fleet_events: int = 0
    weight_changes: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    first_bad: list[tuple[int, str, str]] = field(default_factory=list)   # line, reason, message
    bad_samples: int = 0
    late_samples: int = 0        # read when already older than every tick's age bound to come
    # Routed pairs whose last window held fewer than min_samples judged samples: too few
    # requests within max_sample_age_s to be judged at all (with the settings, for the hint).
    thin_pairs: int = 0
    min_samples: int = 0
    max_sample_age_s: float = 0.0
    first_ts: float | None = None
    last_ts: float | None = None

    def summary(self) -> str:
        span = ("" if self.first_ts is None or self.last_ts is None
                else f", event time {self.first_ts:.3f}..{self.last_ts:.3f}")
        text = (f"replay: {self.lines} lines, {self.events} events{span}, {self.ticks} ticks"
                + (f" ({self.skipped_ticks} quiet ticks skipped)" if self.skipped_ticks else "")
                + f", {self.transitions} transitions, {self.fleet_events} fleet events"
                + (f", {self.weight_changes} weight changes" if self.weight_changes else ""))
        nbad = sum(self.bad.values())
        text += f", {nbad} bad lines skipped"
        if nbad:
            text += " (" + ", ".join(f"{r}: {n}" for r, n in sorted(self.bad.items())) + ")"
            text += "; first: " + "; ".join(f"line {ln} {r}: {msg}" for ln, r, msg in self.first_bad)
        if self.bad_samples:
            text += f"; {self.bad_samples} bad samples dropped from batches"
        if self.late_samples:
            text += (f"; {self.late_samples} samples read after the ticks they belonged to had "
                     "passed (older than max_sample_age_s then): never judged. Is the trace "
                     "sorted by time? Sort it by ts first (e.g. `jq -cs 'sort_by(.ts)[]'`)")
        if self.thin_pairs:
            rate = self.min_samples / self.max_sample_age_s
            text += (f"; {self.thin_pairs} routed (node, model) pairs ended with fewer than "
                     f"min_samples={self.min_samples} judged samples within max_sample_age_s="
                     f"{self.max_sample_age_s:g} s: below about {rate:.2g} requests/s they are "
                     "not judged; raise max_sample_age_s or lower min_samples (--set) to judge them")
        return text


def tick_lines(result: TickResult) -> list[str]:
    """The stdout lines of one tick: transitions, then weight changes, then fleet events, per
    model."""
    out: list[str] = []
    for m in result.models:
        for t in m.transitions:
            out.append(json.dumps({"type": "transition", **t.to_event()}))
        for c in m.weight_changes:
            out.append(json.dumps(c.replay_line()))
        for e in m.fleet_events:
            out.append(json.dumps(e.to_event()))
    return out


def _single_at(e: Any) -> tuple[str, float] | None:
    """``(node, ts)`` of a typed-decoded single event (:meth:`Accumulator.decode_lines`),
    None for anything else (a batch, a heartbeat, a line that did not decode)."""
    if e is None or e.samples is not None or e.latency_us is None or e.ts is None:
        return None
    return e.node_id, e.ts


def _parsed_at(parsed: Parsed) -> tuple[str, float]:
    """``(node, latest ts)`` of what :meth:`Accumulator.parse` returned."""
    if type(parsed) is tuple:
        return parsed[0][0], parsed[1][0]
    if isinstance(parsed, SampleBatch):
        return parsed.node_id, float(parsed.ts.max())     # a parsed batch keeps >= 1 sample
    return parsed.node_id, parsed.ts      # type: ignore[union-attr]


def _node_of(raw: bytes | str) -> str | None:
    """The node id of a held line (a JSON event), None when it has none to read."""
    try:
        obj = loads(raw)
    except (ValueError, TypeError, RecursionError):
        return None
    node = obj.get("node_id") if isinstance(obj, dict) else None
    return node if isinstance(node, str) else None


def replay(lines: Iterable[bytes | str], settings: DetectorSettings,
           emit: Callable[[str], object], *, detector: Detector | None = None,
           progress: Callable[[ReplayStats], object] | None = None,
           chunk_lines: int = CHUNK_LINES) -> tuple[Detector, ReplayStats]:
    """Replay ``lines`` through a detector; ``emit`` receives each output line (no newline).

    ``chunk_lines``: lines decoded at once (1: line by line, the reference path; the
    output and the stats are the same for any value)."""
    run = Replay(settings, emit, detector=detector, progress=progress)
    run.feed(lines, chunk_lines=chunk_lines)
    return run.finish()


class Replay:
    """One replay in event time (module docstring): :meth:`feed` the lines, then :meth:`finish`.

    :meth:`take_line` is the reference path for one line (decode, hold, count, tick);
    :meth:`take_chunk` takes many lines as it would, one by one; :meth:`advance` moves the
    clock (the latest event time); :meth:`tick` runs the ticks up to an event time;
    :meth:`finish` settles what the end of the trace decides, runs the last tick and returns
    the detector and the report (:class:`ReplayStats`).
    """

    def __init__(self, settings: DetectorSettings, emit: Callable[[str], object], *,
                 detector: Detector | None = None,
                 progress: Callable[[ReplayStats], object] | None = None) -> None:
        self.settings, self.emit, self.progress = settings, emit, progress
        self.det = detector or Detector(settings)
        self.stats = ReplayStats()
        self.acc = Accumulator(settings=settings)
        self.interval = settings.tick_interval_s
        self.quiet_after_s = settings.max_sample_age_s + self.interval
        self.k: int | None = None           # next boundary is k * interval
        self.seen_max = -math.inf           # latest event time of events already fed to ticks
        self.quiet_tick = False
        self.lineno = 0                     # lines read so far
        # Early lines (module docstring): a node whose clock runs ahead of the fleet's must not
        # move the ticks, or every other node would look silent.
        self.ahead_s = AHEAD_TICKS * self.interval
        self.drained_ts: dict[str, float] = {}   # node -> latest event time fed to the detector
        self.ahead: set[str] = set()         # nodes found ahead of the fleet since the last tick
        self.early: list[tuple[int, bytes | str]] = []
        self.early_nodes: set[str] = set()
        # Held lines (module docstring): a clock ahead must not jump the ticks past everyone
        # else's events (they would all turn "late" and never be judged).
        self.held: list[tuple[int, bytes | str, BadEvent]] = []
        self.held_nodes: set[str | None] = set()

    # -- reading -------------------------------------------------------------------------

    def feed(self, lines: Iterable[bytes | str], *, chunk_lines: int = CHUNK_LINES) -> None:
        """Take every line of ``lines``, ``chunk_lines`` decoded at once (1: one by one). A read
        error of ``lines`` is raised after the lines read before it were taken."""
        if chunk_lines <= 1:
            for lineno, raw in enumerate(lines, self.lineno + 1):
                self.lineno = lineno
                self.take_line(lineno, raw)
            return
        source = iter(lines)
        while True:
            raws: list[bytes | str] = []
            try:
                raws.extend(islice(source, chunk_lines))
            except Exception:
                self.take_chunk(self.lineno, raws)    # the lines before a read error, as line by line
                raise
            if not raws:
                break
            self.take_chunk(self.lineno, raws)
            self.lineno += len(raws)

    def take_line(self, lineno: int, raw: bytes | str, pre: Any = _UNDECODED) -> None:
        """One line, the reference path: decode, hold or count it, run the ticks it crosses.
        ``pre``: its typed decoding, when the caller has it."""
        settings, early, held, stats = self.settings, self.early, self.held, self.stats
        parsed: Parsed | BadEvent | None = None     # decoded once, here, when its time is read
        if self.k is not None:
            if pre is _UNDECODED:
                typed = self.acc.decode_lines([raw])
                pre = None if typed is None else typed[0]
            at = _single_at(pre)
            if at is None and raw.strip():   # a heartbeat, batch or histogram line: early too
                try:
                    parsed = self.acc.parse(raw)
                except BadEvent as e:
                    parsed = e
                else:
                    at = _parsed_at(parsed)
            if at is not None and self.is_early(*at):
                early.append((lineno, raw))
                self.early_nodes.add(at[0])
                if len(early) >= JUMP_ALONE_LINES or (len(early) >= JUMP_CONFIRM_LINES
                                                      and len(self.early_nodes) >= JUMP_CONFIRM_NODES):
                    self.settle_early(jump=True)
                return
            if early and at is not None and at[1] <= self.seen_max + settings.max_future_skew_s:
                self.settle_early(jump=False)           # the fleet is behind, or has caught up
        try:
            if parsed is None:
                ts = self.acc.add(raw)
            elif isinstance(parsed, BadEvent):
                raise parsed
            else:
                ts = self.acc.add_parsed(parsed)
        except BadEvent as e:
            if not raw.strip():        # a blank line is no event (and never decodes)
                return
            if e.reason == "future_ts" and self.k is not None:
                held.append((lineno, raw, e))
                if len(self.held_nodes) < JUMP_CONFIRM_NODES:     # read a node id only while it counts
                    self.held_nodes.add(_node_of(raw))
                if len(held) >= JUMP_ALONE_LINES or (len(held) >= JUMP_CONFIRM_LINES
                                                     and len(self.held_nodes) >= JUMP_CONFIRM_NODES):
                    self.take_held()
            else:
                self.bad(lineno, e)
            return
        if held:
            self.flush_held()
        if ts <= self.seen_max and self.k is not None and ts < self.k * self.interval:
            stats.events += 1          # accepted(ts) of an event inside the current tick
        else:
            self.accepted(ts)
        if self.progress is not None and lineno % PROGRESS_EVERY_LINES == 0:
            stats.lines, stats.last_ts = lineno, self.seen_max
            self.progress(stats)

    def take_chunk(self, base: int, raws: list[bytes | str]) -> None:
        """Lines ``base + 1 …`` as :meth:`take_line` would take them one by one: runs of the
        single events the accumulator takes from its typed decoding (below the next boundary,
        on no progress line) added at once, and :meth:`take_line` for each line in between."""
        acc = self.acc
        decoded = acc.decode_lines(raws) if self.k is not None else None
        if decoded is None:
            for i, raw in enumerate(raws, base + 1):
                self.take_line(i, raw)
            return
        n = len(raws)
        i = 0
        while i < n:
            k = self.k
            assert k is not None
            if self.early:                  # one by one until the early lines are settled
                self.take_line(base + i + 1, raws[i], decoded[i])
                i += 1
                continue
            # A progress line goes to take_line(), which reports it.
            stop = n if self.progress is None else min(n, i + -(base + i + 1) % PROGRESS_EVERY_LINES)
            j, latest = acc.add_decoded(decoded, i, stop, k * self.interval)
            if j > i:
                if self.held:
                    self.flush_held()
                self.stats.events += j - i
                self.advance(latest)
            if j < n:
                self.take_line(base + j + 1, raws[j], decoded[j])
            i = j + 1

    def bad(self, lineno: int, e: BadEvent) -> None:
        """Count a bad line (and keep the first few)."""
        self.stats.bad[e.reason] += 1
        if len(self.stats.first_bad) < FIRST_BAD_LINES:
            self.stats.first_bad.append((lineno, e.reason, str(e)[:120]))

    # -- the clock -----------------------------------------------------------------------

    def advance(self, ts: float) -> None:
        """``ts`` was fed: the latest event time (and the future bound) moves up to it."""
        if ts > self.seen_max:
            self.seen_max = ts
            self.acc.set_now(ts)

    def accepted(self, ts: float) -> None:
        """An event at ``ts`` was added: the first sets the ticks' phase; one at or past the
        next boundary runs the ticks up to it; the clock advances."""
        self.stats.events += 1
        if self.k is None:
            self.k = math.floor(ts / self.interval) + 1
            self.stats.first_ts = ts
        elif ts >= self.k * self.interval:
            self.tick(ts)
        self.advance(ts)

    # -- ticks ---------------------------------------------------------------------------

    def tick(self, upto_ts: float) -> None:
        """Every tick at a boundary up to ``upto_ts`` (quiet runs skipped), after the
        accumulated events joined the windows."""
        k = self.k
        assert k is not None
        det, stats, interval = self.det, self.stats, self.interval
        self.ahead.clear()
        det.observe(self.drain())
        while k * interval <= upto_ts:
            now = k * interval
            res = det.evaluate(now, with_statuses=False)
            stats.ticks += 1
            out = tick_lines(res)
            for line in out:
                self.emit(line)
            stats.transitions += len(res.transitions)
            stats.fleet_events += len(res.fleet_events)
            stats.weight_changes += len(res.weight_changes)
            silent = not out and now - self.seen_max > self.quiet_after_s
            if silent and self.quiet_tick and not det.evaluator.waiting_on_time(now):
                skip_to = max(k + 1, math.floor(upto_ts / interval))
                stats.skipped_ticks += skip_to - k - 1
                k = skip_to
            else:
                k += 1
            self.k = k
            self.quiet_tick = silent

    def drain(self) -> list[Event]:
        """The accumulated events, for the detector; counts the samples no tick will judge and
        keeps each node's latest event time."""
        settings, stats, drained_ts = self.settings, self.stats, self.drained_ts
        evs = self.acc.drain()
        # Samples older than the age bound of the next tick to run are judged by no tick.
        too_old = -math.inf if self.k is None else self.k * self.interval - settings.max_sample_age_s
        if len(drained_ts) > 2 * self.det.store.series_count() + 64:     # ids the store forgot
            alive = {n for n, _m in self.det.store.keys()}  # noqa: SIM118 (a WindowStore, not a dict)
            for n in [n for n in drained_ts if n not in alive]:
                del drained_ts[n]
        for e in evs:
            if isinstance(e, SampleBatch):
                stats.bad_samples += e.rejected
                if e.ts.size:
                    if e.ts.min() <= too_old:
                        stats.late_samples += int((e.ts <= too_old).sum())
                    t = float(e.ts.max())
                    if t > drained_ts.get(e.node_id, -math.inf):
                        drained_ts[e.node_id] = t
            elif e.ts > drained_ts.get(e.node_id, -math.inf):
                drained_ts[e.node_id] = e.ts
        return evs

    # -- early and held lines ------------------------------------------------------------

    def is_early(self, node: str, ts: float) -> bool:
        """An event at or past the next boundary (within the future bound) from a node
        more than ``ahead_s`` past the fleet: the median latest event time of the other
        nodes that sent since the last tick (or, none yet, within ``ahead_s`` before it);
        or more than a tick past the quorum (:meth:`quorum_ts`)."""
        k, ahead, interval = self.k, self.ahead, self.interval
        assert k is not None
        if ts < k * interval or ts > self.seen_max + self.settings.max_future_skew_s:
            return False
        if node in ahead:
            return True
        pending = self.acc.latest_by_node()
        clocks = [t for n, t in pending.items() if n != node and n not in ahead]
        if not clocks:
            recent = (k - 1) * interval - self.ahead_s
            clocks = [t for n, t in self.drained_ts.items() if t >= recent and n != node and n not in ahead]
        if not clocks:
            # Every other recent node is ahead too: the fleet jumped (a gap in the trace), so
            # this line is early against the clock before the jump (early lines do not move it).
            if ahead and ts - self.seen_max > self.ahead_s:
                ahead.add(node)
                return True
            return False
        clocks.sort()
        if (ts - clocks[(len(clocks) - 1) // 2] <= self.ahead_s
                and ts - self.quorum_ts(node, pending) <= interval):
            return False
        ahead.add(node)
        return True

    def quorum_ts(self, node: str, pending: dict[str, float]) -> float:
        """The latest event time that ``QUORUM_NODES`` other nodes (fewer if there are not as
        many) have reached, whoever they are: each recent node's latest, fed or pending;
        -inf without one. One node ahead never vouches for another alone."""
        recent = (self.k or 0) * self.interval - self.interval - self.ahead_s
        latest = {n: t for n, t in self.drained_ts.items() if t >= recent}
        for n, t in pending.items():
            if t > latest.get(n, -math.inf):
                latest[n] = t
        latest.pop(node, None)
        return heapq.nlargest(QUORUM_NODES, latest.values())[-1] if latest else -math.inf

    def settle_early(self, *, jump: bool) -> None:
        """The early lines join the windows: as they are while the fleet has not caught up,
        or, a jump of the whole trace, taken in order, ticks and all."""
        lines = list(self.early)
        self.early.clear()
        self.early_nodes.clear()
        if jump:
            self.take_in_order(lines, unbounded=False)
            return
        for early_lineno, early_raw in lines:
            try:
                ts = self.acc.add(early_raw)
            except BadEvent as e:
                self.bad(early_lineno, e)
                continue
            self.stats.events += 1
            self.advance(ts)

    def take_in_order(self, lines: list[tuple[int, bytes | str]], *, unbounded: bool) -> None:
        """Add ``lines`` in order, running the ticks each crosses; ``unbounded``: each with no
        future bound (the lines of a jump may lie far apart; each one taken moves it). A line
        bad for another reason is counted bad by that reason."""
        acc = self.acc
        for lineno_, raw_ in lines:
            if unbounded:
                acc.set_now(None)
            try:
                ts = acc.add(raw_)
            except BadEvent as e:
                self.bad(lineno_, e)
                continue
            self.accepted(ts)
        if unbounded:
            acc.set_now(self.seen_max)

    def flush_held(self) -> None:
        """The held lines were bad after all (``future_ts``): count them."""
        for held_lineno, _, held_err in self.held:
            self.bad(held_lineno, held_err)
        self.held.clear()
        self.held_nodes.clear()

    def take_held(self) -> None:
        """Take the held lines as a real gap (:meth:`take_in_order`, unbounded)."""
        lines = [(held_lineno, held_raw) for held_lineno, held_raw, _ in self.held]
        self.held.clear()
        self.held_nodes.clear()
        self.take_in_order(lines, unbounded=True)

    # -- the end -------------------------------------------------------------------------

    def finish(self) -> tuple[Detector, ReplayStats]:
        """The end of the trace: held and early lines settled (a jump unless other nodes' clocks
        say otherwise), the last tick run; the detector and the report."""
        det, stats, settings = self.det, self.stats, self.settings
        if self.held or self.early:
            known = {n for n, _m in det.store.keys()}  # noqa: SIM118 (a WindowStore, not a dict)
            if self.held and (len(self.held_nodes) >= JUMP_CONFIRM_NODES or known <= self.held_nodes):
                self.take_held()
            elif self.held:
                self.flush_held()
            if self.early and (len(self.early_nodes) >= JUMP_CONFIRM_NODES or known <= self.early_nodes):
                self.settle_early(jump=True)
            elif self.early:
                self.settle_early(jump=False)
        stats.lines = self.lineno
        stats.last_ts = None if self.k is None else self.seen_max
        if self.k is not None:
            det.observe(self.drain())
            res = det.evaluate(self.k * self.interval)
            stats.ticks += 1
            for line in tick_lines(res):
                self.emit(line)
            stats.transitions += len(res.transitions)
            stats.fleet_events += len(res.fleet_events)
            stats.weight_changes += len(res.weight_changes)
            stats.min_samples, stats.max_sample_age_s = settings.min_samples, settings.max_sample_age_s
            stats.thin_pairs = sum(1 for s in det.statuses() if s.routed and s.samples < settings.min_samples)
        return det, stats
