"""Stage 1's message intake: a stream of messages → one batch per series per poll.

Owns :class:`Accumulator` (and :func:`decode_many` on top of it): each message is decoded
and validated by :mod:`tailguard.core.contract.events` (the contract), and consecutive single events of
one series and process are grouped into one :class:`~tailguard.core.contract.events.SampleBatch`, so the
window update is one vectorized call per series rather than one per event.

Guarantees:

* ``add()`` raises :class:`~tailguard.core.contract.errors.BadEvent` for a bad message and leaves the
  accumulator as it was; what it accepts is exactly what :func:`tailguard.core.contract.events.decode`
  accepts for the same bytes (with the id rule and, given one, the allowlist).
* ``drain()`` returns every event added since the last drain; per series and process the
  samples keep arrival order, consecutive batch messages come out as one batch (message
  sizes in ``SampleBatch.parts``); the order between series is not kept.
* For the replay, :meth:`Accumulator.decode_lines` decodes many lines in one C loop and
  :meth:`Accumulator.add_decoded` adds a run of them, leaving the accumulator exactly as
  :meth:`Accumulator.add` line by line would (tested against it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeAlias

import numpy as np

from tailguard.core.contract import events, ids
from tailguard.core.contract.binary import MAGIC
from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.errors import BadEvent
from tailguard.core.contract.events import (
    DEFAULT_SETTINGS,
    Event,
    FloatArray,
    Heartbeat,
    SampleBatch,
    batch_of_row,
    bytes_batch,
    future_limit,
    json_loads,
    parse_event,
    single_row,
    size_column,
)
from tailguard.core.contract.events_fast import FastDecoder, Group, Row
from tailguard.core.contract.fields import MAX_TS_S
from tailguard.core.contract.hist_event import HistogramBatch
from tailguard.core.contract.ids import Allowlist

_INF: Final = math.inf
_NAN: Final = math.nan
Parsed: TypeAlias = Event | tuple[Group, Row]     # Accumulator.parse: an event or a single's row


class Accumulator:
    """Decodes messages and groups single events of one series into batches.

    ``add()`` validates one message (raising :class:`BadEvent`, after which
    the accumulator is unchanged) and returns its latest event time;
    ``drain()`` returns everything added since the last drain. Per
    (node_id, model, hardware), the drained events keep arrival order; the
    order *between* series is not kept (it does not matter to a window).
    Consecutive batch messages of one series and process come out as one
    batch (samples concatenated in order, message sizes in
    :attr:`SampleBatch.parts`), so a poll costs one window update per series.

    Node ids and models must meet the id rule of ``settings.id_pattern``
    (:mod:`tailguard.core.contract.ids`; checked once per new series in a drain, not per event).
    With ``allow``, an otherwise valid message of a node id or model not on the allowlist raises
    ``BadEvent("not_allowlisted")``.
    """

    __slots__ = ("_allow", "_fut_limit", "_groups", "_ids", "_max_lat", "_now_s", "_out",
                 "_pending", "_plain", "_runs", "_settings", "_skew_s")

    def __init__(self, *, now_s: float | None = None,
                 settings: DetectorSettings = DEFAULT_SETTINGS,
                 allow: Allowlist | None = None) -> None:
        self._settings = settings
        self._ids = ids.rule(settings.id_pattern)
        self._allow = allow
        self._now_s = now_s
        self._fut_limit = future_limit(now_s, settings)
        self._max_lat = settings.max_latency_us
        self._skew_s = settings.max_future_skew_s
        # Pending single events per series and process: rows, or — while every one of them
        # is an ok, non-probe sample without size fields — just their ts and latency
        # (cheaper to gather and to turn into arrays). A key is in at most one of the two.
        self._groups: dict[Group, list[Row]] = {}
        self._plain: dict[Group, tuple[list[float], list[float]]] = {}
        # Drained in this order; a list is a run of consecutive batches of one key.
        self._out: list[Event | list[SampleBatch]] = []
        self._runs: dict[Group, list[SampleBatch]] = {}
        self._pending = 0

    def __len__(self) -> int:
        """Messages added since the last drain."""
        return self._pending

    def set_now(self, now_s: float | None) -> None:
        """Move the reference for ``future_ts`` checks (replay uses its event-time watermark)."""
        self._now_s = now_s
        self._fut_limit = MAX_TS_S if now_s is None else min(MAX_TS_S, now_s + self._skew_s)

    def add(self, raw: bytes | str) -> float:
        if type(raw) is bytes:
            # Single events first (the replay hot loop): the typed decoder refuses a batch at
            # its samples, cheaper than searching every line for them.
            fast = events.FAST_DECODER     # read at each call: tests turn the fast paths off there
            if fast is not None and raw[:3] != MAGIC:
                e = fast.single(raw, self._fut_limit, self._max_lat)
                if e is not None:
                    key = (e.node_id, e.model, e.hardware, e.instance)
                    plain = self._plain.get(key)
                    if plain is not None and e.ok and not e.probe and e.input_tokens is None \
                            and e.output_tokens is None and e.ttft_us is None:   # the hot loop
                        plain[0].append(e.ts)
                        plain[1].append(e.latency_us)
                        self._pending += 1
                        return e.ts  # type: ignore[no-any-return]
                    if plain is not None or key in self._groups or self._new_series(key):
                        return self._add_single(key, e)
        return self.add_parsed(self.parse(raw))

    def parse(self, raw: bytes | str) -> Parsed:
        """What :meth:`add` would add for ``raw`` past its typed single-event path, decoded
        and checked (raises :class:`BadEvent`) but not added: an event, or a single event's
        series and row. :meth:`add_parsed` adds it (the replay reads its time in between)."""
        if type(raw) is bytes:
            batch = bytes_batch(raw, self._fut_limit, self._max_lat, self._now_s, self._ids)
            if batch is not None:
                self._check_allowed(batch.node_id, batch.model)
                return batch
        try:
            obj = json_loads(raw)
        except (ValueError, RecursionError, TypeError) as e:
            raise BadEvent("bad_json", f"not valid JSON: {e}"[:200]) from None
        if type(obj) is dict and "samples" not in obj and obj.get("type", "single") == "single":
            key, row = single_row(obj, self._fut_limit, self._max_lat, self._now_s, self._ids)
            self._check_allowed(key[0], key[1])
            return key, row
        ev = parse_event(obj, now_s=self._now_s, settings=self._settings)
        self._check_allowed(ev.node_id, ev.model)
        return ev

    def add_parsed(self, parsed: Parsed) -> float:
        """Add what :meth:`parse` returned (never raises); its latest event time."""
        if type(parsed) is tuple:
            key, row = parsed
            self._append_row(key, row)
            return row[0]
        return self._add_event(parsed)  # type: ignore[arg-type]

    def decode_lines(self, raws: Sequence[bytes | str]) -> list[Any] | None:
        """The typed decoding of many lines at once, for :meth:`add_decoded`; None (use
        :meth:`add`) without the msgspec decoders, with an allowlist, or when a line is
        not ``bytes``."""
        fast = events.FAST_DECODER
        if fast is None or self._allow is not None or set(map(type, raws)) != {bytes}:
            return None
        return fast.many(raws)  # type: ignore[arg-type]

    def add_decoded(self, decoded: list[Any], start: int, stop: int,
                    before_ts: float) -> tuple[int, float]:
        """Add lines ``start, start + 1, …`` of :meth:`decode_lines` as :meth:`add` would,
        up to ``stop`` or the first line that is not a single event ``add`` takes by its
        typed path now, or whose ts is not below ``before_ts``: that line (returned with
        the latest ts added, -inf if none) is not added, and is left to :meth:`add`."""
        fut, max_lat, ok = self._fut_limit, self._max_lat, self._ids.ok
        plain, groups = self._plain, self._groups
        get = plain.get
        latest = -_INF
        i = start
        while i < stop:
            e = decoded[i]
            lat, ts = e.latency_us, e.ts
            # FastDecoder.single's checks (the ttft one below), then the replay's boundary
            if e.samples is not None or lat is None or ts is None or lat > max_lat \
                    or ts > fut or ts >= before_ts:
                break
            key = (e.node_id, e.model, e.hardware, e.instance)
            if e.ok and not e.probe and e.input_tokens is None and e.output_tokens is None \
                    and e.ttft_us is None:                       # the hot loop: add()'s
                pending = get(key)
                if pending is not None:
                    pending[0].append(ts)
                    pending[1].append(lat)
                elif key in groups:
                    groups[key].append((ts, lat, True, False, _NAN, _NAN, _NAN))
                elif ok(key[0]) and ok(key[1]):                 # a new series (_new_series)
                    plain[key] = ([ts], [lat])
                else:
                    break
            else:
                if (e.ttft_us is not None and e.ttft_us > lat) or not (
                        key in plain or key in groups or (ok(key[0]) and ok(key[1]))):
                    break
                self._rows(key).append(FastDecoder.row(e))
            if ts > latest:
                latest = ts
            i += 1
        self._pending += i - start
        return i, latest

    def _new_series(self, key: Group) -> bool:
        """The fast path's first event of a series in this drain: True when its ids meet the
        rule and the allowlist; False (the general path decides) when they break the rule."""
        if not (self._ids.ok(key[0]) and self._ids.ok(key[1])):
            return False
        if self._allow is not None:
            self._check_allowed(key[0], key[1])
        return True

    def _check_allowed(self, node_id: str, model: str) -> None:
        allow = self._allow
        if allow is not None:
            allow.check(node_id, model)

    def _add_single(self, key: Group, e: Any) -> float:
        """Add a single event decoded by the fast path (``e``: its struct) to a known series,
        or to a new one whose ids were checked."""
        if FastDecoder.is_plain(e) and key not in self._groups:
            self._plain[key] = ([e.ts], [e.latency_us])
            self._pending += 1
        else:
            self._append_row(key, FastDecoder.row(e))
        return float(e.ts)

    def _append_row(self, key: Group, row: Row) -> None:
        self._rows(key).append(row)
        self._pending += 1

    def _rows(self, key: Group) -> list[Row]:
        """The pending rows of a series; its plain samples, if any, become rows first."""
        group = self._groups.get(key)
        if group is None:
            plain = self._plain.pop(key, None)
            group = self._groups[key] = [] if plain is None else [
                (t, v, True, False, _NAN, _NAN, _NAN) for t, v in zip(*plain, strict=True)]
        return group

    def _add_event(self, ev: Event) -> float:
        key = (ev.node_id, ev.model, ev.hardware, ev.instance)
        pending = self._groups.pop(key, None)
        plain = self._plain.pop(key, None)
        if pending is not None:
            self._out.append(_build(key, pending))
        elif plain is not None:
            self._out.append(_build_plain(key, plain))
        self._pending += 1
        if pending is not None or plain is not None or not isinstance(ev, SampleBatch):
            self._runs.pop(key, None)
        if not isinstance(ev, SampleBatch):     # a heartbeat or a histogram: one interval, no run
            self._out.append(ev)
            return ev.ts
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = [ev]
            self._out.append(run)
        else:
            run.append(ev)
        return float(ev.ts.max())

    def latest_by_node(self) -> dict[str, float]:
        """Each node's latest event time among what was added since the last drain (the
        replay's view of who is where in time; O(pending events))."""
        out: dict[str, float] = {}

        def see(node: str, ts: float) -> None:
            if ts > out.get(node, -_INF):
                out[node] = ts

        for key, (tss, _lat) in self._plain.items():
            see(key[0], max(tss))
        for key, rows in self._groups.items():
            see(key[0], max(r[0] for r in rows))
        for x in self._out:
            for e in (x if type(x) is list else (x,)):
                if isinstance(e, SampleBatch):
                    if e.ts.size:
                        see(e.node_id, float(e.ts.max()))
                elif isinstance(e, Heartbeat | HistogramBatch):
                    see(e.node_id, e.ts)
        return out

    def drain(self) -> list[Event]:
        out: list[Event] = [_concat(x) if type(x) is list else x  # type: ignore[misc]
                            for x in self._out]
        out.extend(_build(key, rows) for key, rows in self._groups.items())
        out.extend(_build_plain(key, p) for key, p in self._plain.items())
        self._out, self._groups, self._plain, self._runs, self._pending = [], {}, {}, {}, 0
        return out


def _concat(run: list[SampleBatch]) -> SampleBatch:
    """One batch of a key's consecutive batches: samples in order, message sizes in ``parts``."""
    if len(run) == 1:
        return run[0]
    first = run[0]

    def sizes(get: Callable[[SampleBatch], FloatArray | None]) -> FloatArray | None:
        cols = [get(b) for b in run]
        if all(c is None for c in cols):
            return None
        return np.concatenate([np.full(len(b), _NAN) if c is None else c
                               for b, c in zip(run, cols, strict=True)])

    return SampleBatch(
        first.node_id, first.model, first.hardware,
        np.concatenate([b.ts for b in run]), np.concatenate([b.latency_us for b in run]),
        np.concatenate([b.ok for b in run]), np.concatenate([b.probe for b in run]),
        sizes(lambda b: b.input_tokens), sizes(lambda b: b.output_tokens),
        sizes(lambda b: b.ttft_us), rejected=sum(b.rejected for b in run),
        instance=first.instance,
        parts=tuple(k for b in run for k in (b.parts or (len(b),))))


def _build_plain(group: Group, plain: tuple[list[float], list[float]]) -> SampleBatch:
    node, model, hw, inst = group
    n = len(plain[0])
    return SampleBatch(node, model, hw, np.array(plain[0], dtype=np.float64),
                       np.array(plain[1], dtype=np.float64), np.ones(n, dtype=bool),
                       np.zeros(n, dtype=bool), instance=inst)


def _build(group: Group, rows: list[Row]) -> SampleBatch:
    if len(rows) == 1:
        return batch_of_row(rows[0], group)
    node, model, hw, inst = group
    arr = np.array(rows, dtype=np.float64)
    return SampleBatch(
        node, model, hw, np.ascontiguousarray(arr[:, 0]), np.ascontiguousarray(arr[:, 1]),
        arr[:, 2] != 0, arr[:, 3] != 0,
        size_column(arr[:, 4]), size_column(arr[:, 5]), size_column(arr[:, 6]),
        instance=inst,
    )


def decode_many(lines: Iterable[bytes | str], *, now_s: float | None = None,
                settings: DetectorSettings = DEFAULT_SETTINGS,
                ) -> tuple[list[Event], list[tuple[int, BadEvent]]]:
    """Decode many messages; single events of one series come back as one batch.

    Returns the events (per-series arrival order kept) and ``(index, error)``
    for every bad message, ``index`` counting from 0 over ``lines``.
    """
    acc = Accumulator(now_s=now_s, settings=settings)
    bad: list[tuple[int, BadEvent]] = []
    add = acc.add
    for i, raw in enumerate(lines):
        try:
            add(raw)
        except BadEvent as e:
            bad.append((i, e))
    return acc.drain(), bad
