"""The routing writer and reader against a real redis-server.

Most tests use the shared Redis of ``scripts/up`` with a unique key prefix
(deleted afterwards). Tests that stop, restart or flush Redis start their OWN
throwaway ``redis-server`` on a free port, so the shared one is never
disturbed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from tailguard.core.contract.types import HealthState, ModelTick, NodeStatus
from tailguard.routing import status
from tailguard.routing.apply_script import NO_EXTRAS, Extras
from tailguard.routing.client import connect
from tailguard.routing.errors import RoutingUnavailable
from tailguard.routing.keys import Keys
from tailguard.routing.reader import RoutingTable
from tailguard.routing.writer import RoutingWriter
from tailguard.streaming.metrics import WorkerMetrics

pytestmark = pytest.mark.integration

MODEL = "llama-3:70b chat"   # ':' and a space on purpose


def tick(routing: set[str], quarantine: dict[str, float] | None = None, *,
         model: str = MODEL, ts: float = 100.0, p50_us: float = 180_000.0) -> ModelTick:
    quarantine = dict(quarantine or {})
    statuses = tuple(
        NodeStatus(node_id=n, model=model, state=HealthState.HEALTHY, routed=True, since_ts=ts,
                   reason="normal", ratio=2.0, samples=1000, latency_p50_us=p50_us,
                   latency_p99_us=p50_us * 2)
        for n in sorted(routing)
    ) + tuple(
        NodeStatus(node_id=n, model=model, state=HealthState.QUARANTINED, routed=False,
                   since_ts=ts, reason="quarantine", ratio=5.0, samples=1000,
                   probe_after_ts=at)
        for n, at in sorted(quarantine.items())
    )
    return ModelTick(model=model, ts=ts, transitions=(), routing=frozenset(routing),
                     quarantine=quarantine, statuses=statuses)


async def wait_for(cond: Callable[[], bool | Awaitable[bool]], what: str,
                   timeout_s: float = 20.0) -> None:
    """Poll ``cond`` until true; fail naming ``what`` after ``timeout_s`` (a hang guard only)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = cond()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for: {what}")
        await asyncio.sleep(0.02)


def _text_set(raw: set[bytes]) -> set[str]:
    return {x.decode() for x in raw}


# -- our own throwaway redis-server ---------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class OwnRedis:
    """A redis-server subprocess without persistence (a restart loses every key)."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not on PATH (scripts/redis installs it: apt-get install "
                        "redis-server)", pytrace=False)
        self.exe, self.workdir, self.port = exe, workdir, _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as r:
                    if r.ping():
                        return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"own redis-server on port {self.port} did not start", pytrace=False)
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- the writer ---------------------------------------------------------------------


async def test_apply_writes_every_key(client: aioredis.Redis, prefix: str) -> None:
    k = Keys(prefix)
    async with RoutingWriter(client, prefix, clock=lambda: 123.0) as w:
        assert await w.apply(tick({"gpu-1", "gpu-2"}, {"gpu-3": 160.5}))
    assert _text_set(await client.smembers(k.routing(MODEL))) == {"gpu-1", "gpu-2"}
    # A new version key starts at the server's clock in ms (never repeats after a data loss).
    (server_s, _) = await client.time()
    version = int(await client.get(k.version(MODEL)) or 0)
    assert abs(version / 1000 - server_s) < 60
    assert await client.zrange(k.quarantine(MODEL), 0, -1, withscores=True) == [(b"gpu-3", 160.5)]
    nodes = {n.decode(): json.loads(v) for n, v in (await client.hgetall(k.nodes(MODEL))).items()}
    assert set(nodes) == {"gpu-1", "gpu-2", "gpu-3"}
    assert nodes["gpu-1"]["state"] == "healthy" and nodes["gpu-1"]["p50_us"] == 180000.0
    assert nodes["gpu-3"]["probe_after"] == 160.5 and nodes["gpu-3"]["updated"] == 123.0
    assert _text_set(await client.smembers(k.models)) == {MODEL}
    # The contract's literal key, for a model name without special characters:
    async with RoutingWriter(client, prefix) as w:
        assert await w.apply(tick({"a"}, model="plain-model"))
    assert await client.smembers(f"{prefix}:routing:plain-model") == {b"a"}


async def test_history_is_written_apart_after_routing_and_never_ahead_of_it(
        client: aioredis.Redis, prefix: str) -> None:
    k = Keys(prefix)
    async with RoutingWriter(client, prefix) as w:
        assert await w.apply(tick({"gpu-1", "gpu-2"}))
        assert await w.write_history(MODEL, {"gpu-1": "[1]"})
        version = await client.get(k.version(MODEL))
        # A routing write leaves the history alone, extras and all ...
        assert await w.apply(tick({"gpu-1", "gpu-2"}, ts=130.0),
                             Extras(shadow=frozenset({"gpu-1"}), events=('{"x":1}',)))
        assert await client.hgetall(k.history(MODEL)) == {b"gpu-1": b"[1]"}
        version = await client.get(k.version(MODEL))
        # ... and write_history replaces it whole, without touching the routing version.
        history = {f"gpu-{i}": f"[{i}]" for i in range(1, 1200)}    # past one HSET chunk
        assert await w.write_history(MODEL, history)
        got = await client.hgetall(k.history(MODEL))
        assert {n.decode(): v.decode() for n, v in got.items()} == history
        assert await client.get(k.version(MODEL)) == version
        # While the model's verdict waits unwritten, its history is not written.
        w._pending[MODEL] = (tick({"gpu-1"}), NO_EXTRAS)
        assert not await w.write_history(MODEL, {"gpu-1": "[2]"})
        assert await client.hget(k.history(MODEL), "gpu-1") == b"[1]"


async def test_same_tick_twice_changes_nothing_and_publishes_once(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(k.channel)
    try:
        w = RoutingWriter(client, prefix)
        assert await w.apply(tick({"a", "b"}))
        v1 = w.last_results[MODEL].version
        assert await w.apply(tick({"a", "b"}, p50_us=190_000.0))   # same decision, new numbers
        assert w.last_results[MODEL].version == v1 and not w.last_results[MODEL].changed
        assert await client.get(k.version(MODEL)) == str(v1).encode()
        nodes = await client.hgetall(k.nodes(MODEL))
        assert json.loads(nodes[b"a"])["p50_us"] == 190000.0       # statuses still refreshed
        assert await w.apply(tick({"a"}))
        messages: list[Any] = []
        deadline = time.monotonic() + 20
        while len(messages) < 2 and time.monotonic() < deadline:
            # None also stands for the (ignored) subscribe confirmation.
            msg = await pubsub.get_message(timeout=1.0)
            if msg is not None:
                messages.append(json.loads(msg["data"]))
        # If the second apply had published, the 2nd message would carry v1 again.
        assert messages == [{"model": MODEL, "version": v1}, {"model": MODEL, "version": v1 + 1}]
    finally:
        await pubsub.aclose()


async def test_a_primary_that_lost_the_last_writes_never_shows_an_older_version(
    client: aioredis.Redis, prefix: str
) -> None:
    # What a Redis failover to a replica that missed the last writes leaves: the version key
    # and the routing set as they were two writes ago. The writer's next write (changed or
    # not) moves the version past the last one it wrote, so no reader sees it go back.
    k = Keys(prefix)
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a", "b", "c"}))
    old = w.last_results[MODEL].version
    assert await w.apply(tick({"a", "b"}))
    assert await w.apply(tick({"a"}))
    seen = w.last_results[MODEL].version
    assert seen == old + 2
    async with client.pipeline(transaction=True) as pipe:    # the promoted replica's data
        pipe.set(k.version(MODEL), old).delete(k.routing(MODEL)).sadd(k.routing(MODEL), "a", "b", "c")
        await pipe.execute()
    assert await w.apply(tick({"a", "b", "c"}))               # same content as the replica's
    assert w.last_results[MODEL].version > seen
    assert int(await client.get(k.version(MODEL)) or 0) == w.last_results[MODEL].version
    async with client.pipeline(transaction=True) as pipe:
        pipe.set(k.version(MODEL), old)
        await pipe.execute()
    floor = w.last_results[MODEL].version
    assert await w.apply(tick({"b"}))                         # a change on a lagging version
    assert w.last_results[MODEL].version == floor + 1


async def test_quarantine_change_bumps_version_without_touching_routing(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a"}, {"q": 10.0}))
    v1 = w.last_results[MODEL].version
    assert await w.apply(tick({"a"}, {"q": 10.0}))
    assert await client.get(k.version(MODEL)) == str(v1).encode()
    assert await w.apply(tick({"a"}, {"q": 40.0}))     # back-off doubled: LBs must learn it
    r = w.last_results[MODEL]
    assert (r.version, r.routing_changed, r.quarantine_changed) == (v1 + 1, False, True)
    assert await client.zscore(k.quarantine(MODEL), "q") == 40.0
    assert await w.apply(tick({"a", "q"}))              # re-admitted
    assert await client.exists(k.quarantine(MODEL)) == 0
    assert _text_set(await client.smembers(k.routing(MODEL))) == {"a", "q"}


async def test_empty_routing_is_refused_and_the_last_set_stays(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    refused: list[str] = []

    class Metrics:
        def write_failed(self, model: str, error: BaseException) -> None:
            raise AssertionError(f"unexpected failure {error!r}")

        def model_rejected(self, model: str, error: BaseException) -> None:
            raise AssertionError(f"unexpected model error {error!r}")

        def empty_refused(self, model: str) -> None:
            refused.append(model)

        def written(self, model: str, *, changed: bool, version: int) -> None:
            pass

    w = RoutingWriter(client, prefix, metrics=Metrics())
    assert await w.apply(tick({"a", "b"}))
    v1 = await client.get(k.version(MODEL))
    assert not await w.apply(tick(set(), {"a": 1.0, "b": 1.0}))
    assert refused == [MODEL]
    assert _text_set(await client.smembers(k.routing(MODEL))) == {"a", "b"}
    assert await client.get(k.version(MODEL)) == v1
    assert await client.exists(k.quarantine(MODEL)) == 0
    # The script refuses to empty an existing set on its own too (a second guard, against what
    # Redis holds: another writer's set), writing nothing.
    got = await w._script(keys=[k.routing(MODEL), k.version(MODEL), k.quarantine(MODEL),
                                k.nodes(MODEL), k.models, k.shadow(MODEL),
                                k.events(MODEL), k.held_out(MODEL), k.weights(MODEL)],
                          args=[k.channel, MODEL, 0, 0, 0, -1, 0, 50, 0, 0, 0])
    assert [int(x) for x in got][:2] == [0, -1]
    assert _text_set(await client.smembers(k.routing(MODEL))) == {"a", "b"}
    assert await client.get(k.version(MODEL)) == v1


async def test_a_model_with_no_admitted_node_has_no_routing_set_until_one_is_admitted(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    w = RoutingWriter(client, prefix)
    new = NodeStatus(node_id="new", model=MODEL, state=HealthState.WARMING, routed=False, since_ts=1.0,
                     reason="first_seen")
    gone = NodeStatus(node_id="old", model=MODEL, state=HealthState.GONE, routed=False, since_ts=1.0,
                      reason="silent")
    waiting = ModelTick(model=MODEL, ts=1.0, transitions=(), routing=frozenset(), quarantine={},
                        statuses=(new, gone))
    assert await w.apply(waiting)
    assert await client.exists(k.routing(MODEL)) == 0               # never written empty
    assert set((await client.hgetall(k.nodes(MODEL))).keys()) == {b"new", b"old"}
    assert _text_set(await client.smembers(k.held_out(MODEL))) == {"old"}   # not the new one
    v1 = await client.get(k.version(MODEL))
    assert v1 is not None
    assert await w.apply(waiting)                                   # the same: nothing changes
    assert await client.get(k.version(MODEL)) == v1
    admitted = NodeStatus(node_id="new", model=MODEL, state=HealthState.HEALTHY, routed=True,
                          since_ts=2.0, reason="admitted")
    assert await w.apply(ModelTick(model=MODEL, ts=2.0, transitions=(), routing=frozenset({"new"}),
                                   quarantine={}, statuses=(admitted, gone)))
    assert _text_set(await client.smembers(k.routing(MODEL))) == {"new"}
    assert await client.get(k.version(MODEL)) != v1


async def test_a_poisoned_model_is_counted_and_backs_off_while_the_other_is_written(
    client: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    k, good, bad = Keys(prefix), "good-model", "bad-model"
    assert await RoutingWriter(client, prefix).apply(tick({"b1"}, model=bad))
    await client.set(k.routing(bad), "someone wrote a string here")      # WRONGTYPE for SCARD
    metrics = WorkerMetrics(CollectorRegistry())

    def rejections() -> float | None:
        return metrics.registry.get_sample_value(
            "tailguard_redis_model_rejections_total", {"model": bad})

    async with RoutingWriter(client, prefix, metrics=metrics, retry_initial_s=0.05,
                             retry_max_s=0.2) as w:
        assert not await w.apply(tick({"b1", "b2"}, model=bad))
        assert await w.apply(tick({"g1", "g2"}, model=good))
        assert _text_set(await client.smembers(k.routing(good))) == {"g1", "g2"}
        assert w.pending == {bad} and w.rejected == {bad} and not w.failing
        assert rejections() == 1.0
        assert "WRONGTYPE" in caplog.text and k.routing(bad) in caplog.text
        await wait_for(lambda: (rejections() or 0) >= 3, "the poisoned model is retried")
        # The good model keeps being written while the bad one is in back-off.
        assert await w.apply(tick({"g1"}, model=good))
        assert _text_set(await client.smembers(k.routing(good))) == {"g1"}
        assert await client.get(k.routing(bad)) == b"someone wrote a string here"
        await client.delete(k.routing(bad))                                # an operator repairs it
        await wait_for(lambda: not w.pending, "the repaired model is written")
    assert _text_set(await client.smembers(k.routing(bad))) == {"b1", "b2"}
    assert metrics.registry.get_sample_value(
        "tailguard_redis_model_rejections_total", {"model": good}) is None


async def test_thousands_of_nodes_fit_in_one_script_call(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    routing = {f"node-{i:05d}" for i in range(3000)}
    quarantine = {f"q-{i:05d}": float(i) for i in range(1500)}
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick(routing, quarantine))
    v1 = w.last_results[MODEL].version
    assert await w.apply(tick(routing, quarantine))
    assert w.last_results[MODEL].version == v1 and not w.last_results[MODEL].changed
    assert await client.scard(k.routing(MODEL)) == 3000
    assert await client.zcard(k.quarantine(MODEL)) == 1500
    assert await client.hlen(k.nodes(MODEL)) == 4500


# -- the reader ---------------------------------------------------------------------


async def test_reader_never_sees_a_half_written_set(
    redis_url: str, client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    s1 = frozenset(f"even-{i}" for i in range(300))
    s2 = frozenset(f"odd-{i}" for i in range(300))
    flips = 60
    reader_client = connect(redis_url)
    observed_raw: list[frozenset[str]] = []
    observed_table: list[tuple[int | None, frozenset[str]]] = []
    done = asyncio.Event()
    try:
        w = RoutingWriter(client, prefix)
        assert await w.apply(tick(set(s1)))
        v0 = w.last_results[MODEL].version
        table = RoutingTable(reader_client, prefix, poll_interval_s=0.05)

        async def read_loop() -> None:
            while not done.is_set():
                observed_raw.append(frozenset(
                    _text_set(await reader_client.smembers(k.routing(MODEL)))))
                if table.snapshot(MODEL) is None:
                    await table.get(MODEL)
                else:
                    await table.refresh()
                snap = table.snapshot(MODEL)
                assert snap is not None
                observed_table.append((snap.version, snap.nodes))

        readers = [asyncio.create_task(read_loop()) for _ in range(3)]
        for i in range(flips):
            assert await w.apply(tick(set(s2 if i % 2 == 0 else s1)))
            await asyncio.sleep(0)
        done.set()
        await asyncio.gather(*readers)
    finally:
        await reader_client.aclose()
    assert set(observed_raw) <= {s1, s2}, "a reader saw a set that was never written"
    assert set(observed_raw) == {s1, s2}, "the readers did not overlap the writer's flips"
    for version, nodes in observed_table:
        assert version is not None
        assert nodes == (s1 if (version - v0) % 2 == 0 else s2), f"v{version} with the wrong set"


async def test_reader_refreshes_on_pubsub(redis_url: str, client: aioredis.Redis,
                                          prefix: str) -> None:
    changes: list[tuple[int | None, frozenset[str]]] = []
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a", "b"}))
    # A poll interval far longer than the test: only pub/sub can bring the change.
    async with RoutingTable(client, prefix, poll_interval_s=600.0,
                            on_change=lambda r: changes.append((r.version, r.nodes))) as table:
        assert await table.get(MODEL) == {"a", "b"}
        assert await table.quarantined(MODEL) == {}

        async def subscribed() -> bool:
            return bool((await client.pubsub_numsub(Keys(prefix).channel))[0][1])

        await wait_for(subscribed, "the table subscribed to the change channel")
        assert await w.apply(tick({"a"}, {"b": 50.0}))
        await wait_for(lambda: table.nodes(MODEL) == {"a"}, "pub/sub refresh")
        assert table.cached_quarantine(MODEL) == {"b": 50.0}
        assert table.probe_candidates(MODEL, 49.0) == frozenset()
        assert table.probe_candidates(MODEL, 50.0) == {"b"}
        v1 = w.last_results[MODEL].version - 1
        assert table.version(MODEL) == v1 + 1
    assert changes[0] == (v1, frozenset({"a", "b"}))
    assert changes[-1] == (v1 + 1, frozenset({"a"}))


async def test_reader_refreshes_by_polling_when_no_message_arrives(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a", "b"}))
    v1 = w.last_results[MODEL].version
    async with RoutingTable(client, prefix, poll_interval_s=0.05) as table:
        assert await table.get(MODEL) == {"a", "b"}
        # Change the keys the way the script does, but without PUBLISH (a dropped message).
        async with client.pipeline(transaction=True) as pipe:
            pipe.srem(k.routing(MODEL), "b")
            pipe.incr(k.version(MODEL))
            await pipe.execute()
        await wait_for(lambda: table.nodes(MODEL) == {"a"}, "version poll refresh")
        assert table.version(MODEL) == v1 + 1


async def test_sync_nodes_of_an_unknown_model_loads_on_the_next_poll(
    client: aioredis.Redis, prefix: str
) -> None:
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"x"}, model="other"))
    async with RoutingTable(client, prefix, poll_interval_s=0.05) as table:
        assert table.nodes("other") == frozenset()      # not loaded yet: "no data"
        await wait_for(lambda: table.nodes("other") == {"x"}, "lazy load by the poll loop")
        assert await table.get("never-written") == frozenset()
        assert table.version("never-written") is None
        assert await table.models() == ["other"]


async def test_reader_keeps_the_last_known_set_when_keys_vanish(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a", "b"}))
    async with RoutingTable(client, prefix, poll_interval_s=0.05) as table:
        assert await table.get(MODEL) == {"a", "b"}
        await client.delete(k.routing(MODEL), k.version(MODEL))
        assert await table.refresh()
        assert table.nodes(MODEL) == {"a", "b"}
        assert await w.apply(tick({"c"}))             # the writer recreates the keys
        await wait_for(lambda: table.nodes(MODEL) == {"c"}, "refresh after the keys came back")
        assert table.version(MODEL) == w.last_results[MODEL].version


async def test_first_read_of_an_unreachable_redis_raises_routing_unavailable() -> None:
    c = connect(f"redis://127.0.0.1:{_free_port()}/0", timeout_s=0.5)
    try:
        table = RoutingTable(c, "tg")
        with pytest.raises(RoutingUnavailable, match="TAILGUARD_REDIS_URL"):
            await table.get("m")
        assert not table.reachable
    finally:
        await c.aclose()


# -- own redis-server: NOSCRIPT, stop and restart --------------------------------------


async def test_script_is_reloaded_after_script_flush(own_redis: OwnRedis) -> None:
    c = connect(own_redis.url)
    try:
        w = RoutingWriter(c, "tg")
        assert await w.apply(tick({"a"}))
        await c.script_flush()
        assert await c.script_exists(w._script.sha) == [False]
        assert await w.apply(tick({"b"}))              # EVALSHA → NOSCRIPT → SCRIPT LOAD → retry
        assert await c.smembers(Keys("tg").routing(MODEL)) == {b"b"}
        assert await c.script_exists(w._script.sha) == [True]
    finally:
        await c.aclose()


async def test_redis_stopped_and_restarted_catches_up_and_never_empties(
    own_redis: OwnRedis,
) -> None:
    k = Keys("tg")
    a, c_set = {"n1", "n2", "n3"}, {"n1", "n3"}
    failures: list[str] = []

    class Metrics:
        def write_failed(self, model: str, error: BaseException) -> None:
            failures.append(type(error).__name__)

        def model_rejected(self, model: str, error: BaseException) -> None:
            raise AssertionError(f"unexpected model error {error!r}")

        def empty_refused(self, model: str) -> None:
            raise AssertionError("nothing here is empty")

        def written(self, model: str, *, changed: bool, version: int) -> None:
            pass

    writer_client = connect(own_redis.url, timeout_s=0.5)
    reader_client = connect(own_redis.url, timeout_s=0.5)
    seen: list[frozenset[str]] = []
    stop_watch = asyncio.Event()
    try:
        async with (
            RoutingWriter(writer_client, "tg", metrics=Metrics(), retry_initial_s=0.05,
                          retry_max_s=0.2) as w,
            RoutingTable(reader_client, "tg", poll_interval_s=0.05) as table,
        ):
            assert await w.apply(tick(a))
            old_version = w.last_results[MODEL].version
            assert await table.get(MODEL) == a

            async def watch() -> None:      # what a load balancer would see, all along
                while not stop_watch.is_set():
                    seen.append(table.nodes(MODEL))
                    await asyncio.sleep(0.005)
                seen.append(table.nodes(MODEL))   # the view at the end, whatever the sleep missed

            watcher = asyncio.create_task(watch())

            own_redis.stop()
            assert not await w.apply(tick({"n2"}))        # superseded before Redis returns
            assert not await w.apply(tick(c_set, {"n2": 500.0}))
            assert w.pending == {MODEL} and failures
            await wait_for(lambda: not table.reachable, "reader notices Redis is down")
            assert table.nodes(MODEL) == a and await table.get(MODEL) == a

            own_redis.start()                              # empty: no persistence
            await wait_for(lambda: not w.pending, "writer catches up")
            await wait_for(lambda: table.nodes(MODEL) == c_set, "reader refreshes")
            await wait_for(lambda: table.reachable, "reader reports Redis reachable")
            assert table.cached_quarantine(MODEL) == {"n2": 500.0}
            stop_watch.set()
            await watcher

        assert _text_set(await writer_client.smembers(k.routing(MODEL))) == c_set
        # The fresh server's version key was created anew, with a different number.
        new_version = int(await writer_client.get(k.version(MODEL)) or 0)
        assert new_version != old_version and table.version(MODEL) == new_version
        assert await writer_client.smembers(k.models) == {MODEL.encode()}
    finally:
        stop_watch.set()
        await writer_client.aclose()
        await reader_client.aclose()
    assert frozenset() not in seen, "the load balancer's view was emptied"
    assert set(seen) <= {frozenset(a), frozenset(c_set)}
    assert seen[0] == a and seen[-1] == c_set


# -- tailguard status -----------------------------------------------------------------


def test_status_command_shows_what_the_writer_wrote(
    redis_url: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = unique_name("status")

    async def write() -> None:
        c = connect(redis_url)
        try:
            w = RoutingWriter(c, prefix)
            assert await w.apply(tick({"gpu-1", "gpu-2"}, {"gpu-3": time.time() + 60}))
        finally:
            await c.aclose()

    async def cleanup() -> None:
        c = connect(redis_url)
        try:
            keys = [x async for x in c.scan_iter(match=f"{prefix}:*")]
            if keys:
                await c.delete(*keys)
        finally:
            await c.aclose()

    asyncio.run(write())
    try:
        monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_url)
        monkeypatch.setenv("TAILGUARD_KEY_PREFIX", prefix)
        assert status.main(["--json"]) == 0
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        (m,) = doc["models"]
        assert m["model"] == MODEL and isinstance(m["version"], int)
        assert m["routing"] == ["gpu-1", "gpu-2"]
        assert m["nodes"]["gpu-3"]["state"] == "quarantined"
        assert m["nodes"]["gpu-3"]["in_routing_set"] is False
        assert status.main([]) == 0
        table = capsys.readouterr().out
        assert f"model {MODEL}  version {m['version']}  routed 2/3  quarantined 1" in table
        assert status.main(["--model", "nope"]) == 1
        assert "nope" in capsys.readouterr().err
    finally:
        asyncio.run(cleanup())


def test_a_db_past_the_servers_databases_is_one_line_naming_the_url(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from urllib.parse import urlparse

    from tailguard import cli

    monkeypatch.setenv("TAILGUARD_REDIS_URL", urlparse(redis_url)._replace(path="/99").geturl())
    for argv in (["status"], ["drain", "gpu-x", "--model", MODEL]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "TAILGUARD_REDIS_URL: Redis at" in err and "DB index is out of range" in err
        assert len(err.splitlines()) == 1


async def test_reader_tracks_at_most_max_models(client: aioredis.Redis, prefix: str) -> None:
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a"}, model="m1"))
    assert await w.apply(tick({"b"}, model="m2"))
    table = RoutingTable(client, prefix, max_models=1)
    assert await table.get("m1") == {"a"}
    assert await table.get("m2") == frozenset()        # not tracked: "no data", no Redis read
    assert table.snapshot("m2") is None


async def test_a_garbage_version_key_does_not_stop_the_refreshes(
    client: aioredis.Redis, prefix: str
) -> None:
    k = Keys(prefix)
    w = RoutingWriter(client, prefix)
    assert await w.apply(tick({"a", "b"}))
    async with RoutingTable(client, prefix, poll_interval_s=0.05) as table:
        assert await table.get(MODEL) == {"a", "b"}
        await client.set(k.version(MODEL), "not-a-number")
        await wait_for(lambda: not table.reachable, "the poll loop reports the bad key")
        assert table.nodes(MODEL) == {"a", "b"}
        await client.delete(k.version(MODEL))
        assert await w.apply(tick({"a"}))              # recreates the version key
        await wait_for(lambda: table.nodes(MODEL) == {"a"}, "refreshes resume")
