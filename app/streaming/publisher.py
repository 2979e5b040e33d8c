"""Stage 2's Kafka output, behind the routing write: a backlog bounded in bytes, retried.

The stage-2 tick writes every model's verdict to Redis first, then hands the tick's messages
(health changes, fleet events, diagnostics requests) to :class:`Publisher` with a budget of
time; :func:`tick_messages` turns a tick's outputs into those messages (and reports the
tick's counters once). Pure asyncio around an injected ``send`` (faust's ``Topic.send`` in the
worker, a fake in unit tests); no Kafka import here.

Guarantees:

* **At least once, in order per topic and key.** A message leaves the backlog only when the
  broker acknowledged it; one that failed is sent again at the next :meth:`Publisher.publish`
  (consumers drop repeats by ``event_id``). A message still in flight when the budget ends is
  not sent twice: its result is collected at a later call.
* **Bounded in bytes.** The backlog holds at most ``max_bytes`` of keys and values; when a new
  message does not fit, the oldest are dropped, counted in ``dropped`` (by topic,
  ``tailguard_publish_dropped_total``) and logged once per publish call.
* **Never blocks the caller for long.** :meth:`Publisher.publish` returns within about its
  ``budget_s`` whatever the broker does (a topic that refuses or never answers).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from tailguard.core.contract.types import HealthState
from tailguard.streaming.edge import EdgeOutput
from tailguard.streaming.wire import dumps

log = logging.getLogger(__name__)

#: Per message, bytes counted on top of its key and value (bookkeeping, headers).
OVERHEAD_BYTES = 64

Send = Callable[[str, bytes | None, bytes], Awaitable["asyncio.Future[Any]"]]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message for ``topic`` (a name the ``send`` callable knows)."""

    topic: str
    key: bytes | None
    value: bytes

    @property
    def nbytes(self) -> int:
        return len(self.value) + len(self.key or b"") + OVERHEAD_BYTES


class Publisher:
    """The backlog of unpublished messages and the sending of it (see the module docstring)."""

    def __init__(self, send: Send, *, max_bytes: int,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
        self._send = send
        self.max_bytes = max_bytes
        self._on_dropped = on_dropped
        self._queue: collections.deque[Outgoing] = collections.deque()
        self._in_flight: dict[int, tuple[Outgoing, asyncio.Future[Any]]] = {}
        self.nbytes = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._failing_logged = False

    def __len__(self) -> int:
        return len(self._queue) + len(self._in_flight)

    def add(self, messages: list[Outgoing]) -> None:
        """Queue ``messages`` (oldest first); drop the oldest queued ones beyond ``max_bytes``."""
        dropped: collections.Counter[str] = collections.Counter()
        for m in messages:
            self._queue.append(m)
            self.nbytes += m.nbytes
        while self.nbytes > self.max_bytes and self._queue:
            old = self._queue.popleft()
            self.nbytes -= old.nbytes
            dropped[old.topic] += 1
        for topic, n in sorted(dropped.items()):
            self.dropped[topic] += n
            if self._on_dropped is not None:
                self._on_dropped(topic, n)
            log.error("the publish backlog is full (%d bytes, TAILGUARD_PUBLISH_BACKLOG_BYTES): "
                      "dropped the %d oldest unpublished message(s) of topic %s", self.max_bytes,
                      n, topic)

    async def publish(self, budget_s: float) -> bool:
        """Send what is queued and collect what was in flight, for at most ``budget_s``.

        True when nothing is left (all acknowledged)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        failed: list[Outgoing] = []
        while self._queue and loop.time() < deadline:
            m = self._queue[0]
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    fut = await self._send(m.topic, m.key, m.value)
            except TimeoutError:
                break
            except Exception as e:  # refused at once (no metadata, producer stopped): retried
                self._note_failure(m, e)
                failed.append(self._queue.popleft())
                continue
            self._queue.popleft()
            self._in_flight[id(fut)] = (m, fut)
        pending = [f for _, f in self._in_flight.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
        retry: list[Outgoing] = []
        for k, (m, fut) in list(self._in_flight.items()):
            if not fut.done():
                continue
            del self._in_flight[k]
            err = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            if err is None:
                self.nbytes -= m.nbytes
            else:
                self._note_failure(m, err)
                retry.append(m)
        # Failed messages go back in front, in their order: sent again next time.
        self._queue.extendleft(reversed(failed + retry))   # still counted in nbytes
        if not failed and not retry and not self._queue and self._failing_logged:
            log.info("stage-2 publishing recovered: the backlog is empty")
            self._failing_logged = False
        return not self._queue and not self._in_flight

    def _note_failure(self, m: Outgoing, error: BaseException) -> None:
        if not self._failing_logged:
            self._failing_logged = True
            log.warning("publishing to %s failed (%s: %s); %d message(s) (%d bytes) wait in the "
                        "backlog and are retried every tick; routing is written to Redis "
                        "meanwhile", m.topic, type(error).__name__, error, len(self), self.nbytes)


class TickMetrics(Protocol):
    """The counters and gauges :func:`tick_messages` reports (``WorkerMetrics``)."""

    transitions: Any
    fleet_events: Any
    weight_changes: Any

    def set_weights(self, model: str, weights: Any, routing: Any) -> None: ...

    def set_node_states(self, model: str, counts: dict[HealthState, int]) -> None: ...

    def set_cluster_latency(self, model: str, p50_us: float | None,
                            p99_us: float | None) -> None: ...


def tick_messages(outputs: Iterable[EdgeOutput], health_topic: str, fleet_topic: str,
                  diagnostics_topic: str, metrics: TickMetrics) -> list[Outgoing]:
    """A stage-2 tick's messages — every health or weight change (keyed by model), fleet event (keyed
    by model) and diagnostics request (keyed by node) — and its counters, reported once per
    tick whether or not Kafka takes the messages."""
    out: list[Outgoing] = []
    for o in outputs:
        tick = o.tick
        key = tick.model.encode()
        for ev in o.health_events:
            out.append(Outgoing(health_topic, key, dumps(ev)))
            if ev.get("type") == "weight":
                metrics.weight_changes.labels(model=tick.model).inc()
            elif "operator" not in ev:    # a drain or pin is no state transition
                metrics.transitions.labels(to=str(ev["to"])).inc()
        metrics.set_weights(tick.model, tick.weights, tick.routing)
        for f in tick.fleet_events:
            out.append(Outgoing(fleet_topic, key, dumps(f.to_event())))
            metrics.fleet_events.labels(model=tick.model, kind=f.kind).inc()
        for r in tick.diagnostics:
            out.append(Outgoing(diagnostics_topic, r.node_id.encode(), dumps(r.to_event())))
        metrics.set_node_states(tick.model, dict(collections.Counter(s.state for s in tick.statuses)))
        metrics.set_cluster_latency(tick.model, tick.fleet_latency_p50_us, tick.fleet_latency_p99_us)
    return out
