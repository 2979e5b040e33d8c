"""The stage-2 tick (:class:`~tailguard.streaming.ticker.Stage2Ticker`) driven without faust.

Real Stage2 and FleetEvaluator (dict tables), real OperatorEdge, Publisher and metrics; the
edges are fakes that record what a tick does: the publisher's ``send`` (topic, key, event),
the routing sink, the operator source, the replace hook's offers and the consumer group's
assignment.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from stream_fakes import FakeRouting, summary

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.core.judge.evaluate import FleetEvaluator
from tailguard.routing.apply_script import NO_EXTRAS, Extras
from tailguard.routing.operators import OperatorState, Override
from tailguard.settings import Settings
from tailguard.streaming.edge import OperatorEdge
from tailguard.streaming.metrics import WorkerMetrics
from tailguard.streaming.publisher import Publisher
from tailguard.streaming.stage2 import Stage2, state_key
from tailguard.streaming.ticker import Assignment, OutputTopics, Stage2Ticker, partition_for

SETTINGS = DetectorSettings(min_samples=10, window_size=100, warmup_s=0.0, confirm_windows=2,
                            backoff_initial_s=600.0, backoff_max_s=600.0)
T = 2.0
NODES = ["n0", "n1", "n2", "n3", "slow"]
PARTS = 4
HEALTH, FLEET = "health", "fleet"


@dataclass
class Clock:
    now_s: float = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Sender:
    """The publisher's ``send``: records (topic, key, event); ``fail`` refuses like a broken topic."""

    log: list[str]
    sent: list[tuple[str, bytes | None, dict[str, Any]]] = field(default_factory=list)
    fail: bool = False

    async def send(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[Any]:
        if self.fail:
            raise ConnectionError(f"topic {topic} unwritable")
        self.sent.append((topic, key, json.loads(value)))
        self.log.append(f"send {topic}")
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@dataclass
class Routing(FakeRouting):
    log: list[str] = field(default_factory=list)
    books: list[str] = field(default_factory=list)     # the history writes
    broken_model: str | None = None

    async def apply(self, tick: ModelTick, extras: Extras = NO_EXTRAS) -> bool:
        if tick.model == self.broken_model:
            raise ValueError("malformed verdict")
        self.log.append(f"route {tick.model}")
        return await super().apply(tick, extras)

    async def write_history(self, model: str, history: Mapping[str, str]) -> bool:
        self.books.append(f"history {model}")
        return await super().write_history(model, history)


class LoggedTable(dict[bytes, Any]):
    """A stage-2 table (state or hints) that logs each write as ``"<name> <model>"``."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.log.append(f"{self.name} {key.decode()}")
        super().__setitem__(key, value)


@dataclass
class Operators:
    state: OperatorState = field(default_factory=OperatorState)
    down: bool = False
    deleted: list[Override] = field(default_factory=list)

    async def read(self) -> OperatorState:
        if self.down:
            raise ConnectionError("redis down")
        return self.state

    async def delete_expired(self, override: Override) -> None:
        self.deleted.append(override)


@dataclass
class Hook:
    offered: list[NodeStatus] = field(default_factory=list)

    def offer(self, statuses: Iterable[NodeStatus]) -> int:
        got = list(statuses)
        self.offered += got
        return len(got)


@dataclass
class Ownership:
    owned: frozenset[int] = frozenset(range(PARTS))
    rebalancing: bool = False
    generation: int = 1

    async def assignment(self) -> Assignment | None:
        if self.rebalancing:
            return None
        return Assignment("node-window-stats", self.generation, self.owned, PARTS)


@dataclass
class Rig:
    ticker: Stage2Ticker
    stage2: Stage2
    clock: Clock
    publisher: Sender
    routing: Routing
    operators: Operators
    hook: Hook
    ownership: Ownership
    metrics: WorkerMetrics
    log: list[str]

    def feed(self, model: str = "m", nodes: list[str] = NODES) -> None:
        for n in nodes:
            p50 = 3000.0 if n == "slow" else 1000.0
            self.stage2.on_summary(summary(n, model, self.clock.now_s, p50, p50 * 1.5))
        self.clock.now_s += 0.5

    async def tick(self, models: tuple[str, ...] = ("m",)) -> list[Any]:
        for m in models:
            self.feed(m)
        outs = await self.ticker.tick()
        self.clock.now_s += T - 0.5
        return outs

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def rig(mode: str = "enforce", tables: tuple[dict[bytes, Any], dict[bytes, Any]] | None = None, *,
        log_books: bool = False) -> Rig:
    """A ticker on fakes; ``tables``: the (state, hints) tables' contents to start from;
    ``log_books``: the table and history writes go to the log beside routing and sends."""
    log: list[str] = []
    books: list[str] = log if log_books else []
    clock, publisher, routing = Clock(), Sender(log), Routing(log=log, books=books)
    operators, hook, ownership = Operators(), Hook(), Ownership()
    metrics = WorkerMetrics(CollectorRegistry())
    state, hints = LoggedTable("state", books), LoggedTable("hints", books)
    if tables is not None:
        dict.update(state, tables[0])
        dict.update(hints, tables[1])
    stage2 = Stage2(FleetEvaluator(SETTINGS), state, stale_after_s=1.5 * T, hints=hints)
    ticker = Stage2Ticker(stage2=stage2, edge=OperatorEdge(SETTINGS, mode), routing=routing,
                          publisher=Publisher(publisher.send, max_bytes=1 << 20),
                          topics=OutputTopics(HEALTH, FLEET, "diagnostics"),
                          ownership=ownership, metrics=metrics, tick_s=T,
                          max_ejected_fraction=SETTINGS.max_ejected_fraction, operators=operators,
                          hook=hook, clock=clock)
    return Rig(ticker, stage2, clock, publisher, routing, operators, hook, ownership, metrics, log)


async def test_a_slow_node_leaves_routing_then_its_changes_are_published() -> None:
    r = rig()
    for _ in range(4):
        await r.tick()
    health = [ev for topic, key, ev in r.publisher.sent if topic == HEALTH]
    assert [ev["to"] for ev in health if ev["node_id"] == "slow"][-2:] == ["unhealthy", "quarantined"]
    assert all(key == state_key("m") for topic, key, _ in r.publisher.sent if topic in (HEALTH, FLEET))
    assert "slow" not in r.routing.applied[-1].routing
    assert set(r.routing.applied[-1].routing) == {"n0", "n1", "n2", "n3"}
    assert len(r.routing.applied) == 4                     # one routing write per model and tick
    assert r.metric("tailguard_transitions_total", to="quarantined") == 1.0
    # Within a tick: the routing write first (it never waits on Kafka), then the sends.
    # (The first tick publishes every node's first state change.)
    first_tick = r.log[:r.log.index("route m", 1)]
    assert first_tick[0] == "route m", first_tick
    assert len(first_tick) > len(NODES) and set(first_tick[1:]) == {"send health"}, first_tick


async def test_while_rebalancing_a_tick_does_nothing() -> None:
    r = rig()
    r.ownership.rebalancing = True
    assert await r.tick() == []
    assert r.publisher.sent == [] and r.routing.applied == [] and r.hook.offered == []
    r.ownership.rebalancing = False
    assert [o.tick.model for o in await r.tick()] == ["m"]


async def test_only_models_of_owned_partitions_are_judged() -> None:
    r = rig()
    models = ("m", "other", "third", "fourth", "fifth")
    part = {m: partition_for(state_key(m), PARTS) for m in models}
    r.ownership.owned = frozenset({part["m"]})
    outs = await r.tick(models)
    assert {o.tick.model for o in outs} == {m for m in models if part[m] == part["m"]}
    assert {t.model for t in r.routing.applied} == {o.tick.model for o in outs}


async def test_a_broken_topic_never_holds_routing_and_its_backlog_goes_out_first_when_back() -> None:
    r = rig()
    for _ in range(2):
        await r.tick()
    r.publisher.fail = True
    sent_before = len(r.publisher.sent)
    for _ in range(2):
        await r.tick()
    assert len(r.routing.applied) == 4                     # routing written every tick regardless
    assert len(r.publisher.sent) == sent_before and len(r.ticker.publisher) > 0
    assert r.metric("tailguard_publish_backlog_bytes") == r.ticker.publisher.nbytes > 0
    waiting = len(r.ticker.publisher)
    r.publisher.fail = False
    await r.tick()
    assert len(r.ticker.publisher) == 0
    assert len(r.publisher.sent) - sent_before >= waiting   # the backlog, then this tick's
    assert r.metric("tailguard_publish_backlog_bytes") == 0.0


async def test_one_models_failing_routing_write_does_not_stop_the_others() -> None:
    r = rig()
    r.routing.broken_model = "bad"
    await r.tick(("bad", "m"))
    assert [t.model for t in r.routing.applied] == ["m"]


async def test_operator_overrides_apply_and_a_failed_read_keeps_the_last_ones() -> None:
    r = rig()
    for _ in range(2):
        await r.tick()
    r.operators.state = OperatorState(overrides=(Override("n0", None, "drain", reason="maint", set_ts=999.0),))
    await r.tick()
    assert "n0" not in r.routing.applied[-1].routing
    r.operators.down = True
    await r.tick()
    assert "n0" not in r.routing.applied[-1].routing          # the last overrides read stay in force
    assert r.metric("tailguard_operator_read_failures_total") == 1.0
    drains = [ev for t, _, ev in r.publisher.sent if t == HEALTH and ev.get("operator")]
    assert [ev["node_id"] for ev in drains] == ["n0"]


async def test_the_replace_hook_is_offered_enforce_modes_statuses_only() -> None:
    enforce, observe = rig("enforce"), rig("observe")
    for r in (enforce, observe):
        for _ in range(3):
            await r.tick()
    assert {s.node_id for s in enforce.hook.offered} == set(NODES)
    assert observe.hook.offered == []
    assert any(s.state is HealthState.UNHEALTHY or s.state is HealthState.QUARANTINED
               for s in enforce.hook.offered if s.node_id == "slow")


async def test_models_no_longer_owned_drop_out_of_the_gauges() -> None:
    r = rig()
    other = next(m for m in (f"other-{i}" for i in range(100))
                 if partition_for(state_key(m), PARTS) != partition_for(state_key("m"), PARTS))
    await r.tick(("m", other))
    assert r.ticker.gauged_models == {"m", other}
    assert r.metric("tailguard_owned_models") == 2.0
    r.ownership.owned = frozenset({partition_for(state_key("m"), PARTS)})
    r.ownership.generation = 2
    await r.tick(("m", other))
    assert r.ticker.gauged_models == {"m"}
    assert r.metric("tailguard_owned_models") == 1.0
    assert r.ticker.last_assignment == (2, r.ownership.owned)


async def test_every_models_routing_is_written_before_its_state_hints_and_history() -> None:
    r = rig(log_books=True)
    models = ("m", "other", "third")
    for _ in range(3):
        r.log.clear()
        await r.tick(models)
        kinds = [entry.split()[0] for entry in r.log]
        routes = [i for i, k in enumerate(kinds) if k == "route"]
        books = [i for i, k in enumerate(kinds) if k in ("state", "hints", "history")]
        sends = [i for i, k in enumerate(kinds) if k == "send"]
        assert len(routes) == len(models) and books and sends, r.log
        # The routing of every model first, then the bookkeeping, then Kafka.
        assert max(routes) < min(books) and max(books) < min(sends), r.log
        assert {e.split()[1] for e in r.log if e.startswith("history")} == set(models)
        assert {e.split()[1] for e in r.log if e.startswith("state")} == set(models)
    # The history is written apart, after the routing (whose script never touches it).
    model, history = r.routing.histories[-1]
    assert model == "third" and set(history) == set(NODES)
    rows = json.loads(history["slow"])
    assert len(rows) == 3 and rows[-1]["state"] == str(r.routing.applied[-1].statuses[-1].state)


class FailingTable(LoggedTable):
    """A stage-2 table whose writes raise while ``failing`` (faust's when the producer lost
    its metadata)."""

    failing = True

    def __setitem__(self, key: bytes, value: Any) -> None:
        if self.failing:
            raise TypeError("'NoneType' object is not iterable")
        super().__setitem__(key, value)


async def test_failed_table_writes_are_counted_and_retried_by_the_next_tick() -> None:
    # The ticker writes the tables after the routing writes (Stage2.persist); the failures
    # there went uncounted: tailguard_table_write_failures read them before the writes.
    r = rig()
    state = r.stage2.state = FailingTable("state", [])
    for i in range(1, 3):
        await r.tick(("m", "other"))
        assert r.metric("tailguard_table_write_failures_total") == 2 * i == r.stage2.write_failures
    assert len(r.routing.applied) == 4                  # routing written every tick regardless
    state.failing = False
    await r.tick(("m", "other"))
    assert r.metric("tailguard_table_write_failures_total") == 4.0
    assert state[state_key("m")] == r.stage2.evaluator.snapshot_model("m")


async def test_a_new_owner_from_the_tables_the_ticker_wrote_judges_as_the_old_one_would() -> None:
    old = rig()
    for _ in range(3):
        await old.tick()
    new = rig(tables=(dict(old.stage2.state), dict(old.stage2.hints or {})))
    new.clock.now_s = old.clock.now_s
    for _ in range(3):
        a, b = await old.tick(), await new.tick()
        assert [o.tick.statuses for o in a] == [o.tick.statuses for o in b]
        assert [o.tick.transitions for o in a] == [o.tick.transitions for o in b]
    assert "slow" not in new.routing.applied[-1].routing
    assert new.routing.applied[-1].routing == old.routing.applied[-1].routing


async def test_the_default_backlog_holds_the_first_tick_of_100000_new_nodes_unpublished() -> None:
    r = rig()
    r.ticker.publisher = Publisher(r.publisher.send, max_bytes=Settings().publish_backlog_bytes)
    r.publisher.fail = True     # nothing leaves: the whole tick waits in the backlog
    model, nodes = "meta-llama/Llama-3.1-70B-Instruct", [f"gpu-node-{i:05d}" for i in range(1_000)]
    for n in nodes:
        r.stage2.on_summary(summary(n, model, r.clock.now_s, 1000.0, 1500.0))
    r.clock.now_s += 0.5
    await r.ticker.tick()
    changes = len(r.ticker.publisher)
    assert changes >= len(nodes) and not r.ticker.publisher.dropped    # a change each, at least
    # What 100 such models (100,000 new nodes) queue in one tick fits the default.
    assert 100 * r.ticker.publisher.nbytes <= Settings().publish_backlog_bytes


@dataclass
class SlowRouting(Routing):
    """A routing sink whose writes take a few loop turns, like a Redis round trip: logs
    ``route <m>`` when a write is sent and ``routed <m>`` when it is done."""

    turns: int = 3

    async def apply(self, tick: ModelTick, extras: Extras = NO_EXTRAS) -> bool:
        self.log.append(f"route {tick.model}")
        for _ in range(self.turns):
            await asyncio.sleep(0)
        self.log.append(f"routed {tick.model}")
        return await FakeRouting.apply(self, tick, extras)


async def test_the_next_model_is_judged_while_a_routing_write_is_in_flight() -> None:
    r = rig(log_books=True)
    r.routing = SlowRouting(log=r.log, books=r.log)
    r.ticker.routing = r.routing
    judge = r.stage2._evaluate

    def judged(model: str, now_s: float) -> Any:
        r.log.append(f"judge {model}")
        return judge(model, now_s)

    r.stage2._evaluate = judged   # type: ignore[method-assign]
    models = ("m", "other", "third")
    for _ in range(3):
        r.log.clear()
        await r.tick(models)
        at = {e: i for i, e in enumerate(r.log)}
        order = [e.split()[1] for e in r.log if e.startswith("judge")]
        assert order == sorted(models), r.log
        # The first model's write is sent before the next model is judged; every model's
        # write is done only after the next model was judged (Redis works meanwhile).
        assert at[f"route {order[0]}"] < at[f"judge {order[1]}"], r.log
        for k, nxt in itertools.pairwise(order):
            assert at[f"judge {nxt}"] < at[f"routed {k}"], r.log
        kinds = [e.split()[0] for e in r.log]
        books = [i for i, k in enumerate(kinds) if k in ("state", "hints", "history", "send")]
        # every write done, in the order judged, before any bookkeeping or message
        assert [e.split()[1] for e in r.log if e.startswith("routed")] == order, r.log
        assert max(at[f"routed {m}"] for m in models) < min(books), r.log
    assert "slow" not in r.routing.applied[-1].routing
