"""haproxy-sync: parsing `show servers state`, planning the minimal commands, the sync, the socket client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.lb import BackendsError, RuntimeApiError
from tailguard.lb.haproxy import HaproxySync, SocketRuntimeApi, validate_backend_map
from tailguard.lb.haproxy_plan import (
    CMAINT,
    FDRAIN,
    FMAINT,
    OP_RUNNING,
    OP_STOPPED,
    ServerState,
    parse_servers_state,
    plan_backend,
)
from tailguard.lb.testing import StaticSource

# Captured from HAProxy 2.6 (Debian 12): node-a ready, node-b forced maint, node-c `disabled` in the config.
REAL_STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight \
srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state \
bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr \
srv_agent_addr srv_agent_port
3 be_llama 1 node-a 127.0.0.1 2 0 1 1 0 1 0 2 0 0 0 0 - 18601 - 0 0 - - 0
3 be_llama 2 node-b 127.0.0.1 0 1 1 1 0 1 0 0 0 0 0 0 - 18602 - 0 0 - - 0
3 be_llama 3 node-c 127.0.0.1 0 5 1 1 0 1 0 0 8 0 0 0 - 18603 - 0 0 - - 0
4 be_bge 1 e1 127.0.0.1 2 0 1 1 0 1 0 2 0 0 0 0 - 18604 - 0 0 - - 0

"""


def st_(server: str, admin: int = 0, op: int = OP_RUNNING, backend: str = "be") -> ServerState:
    return ServerState(backend, server, op, admin)


class FakeHaproxy:
    """A RuntimeApi that keeps server admin states like HAProxy and renders `show servers state`."""

    def __init__(self, backends: dict[str, dict[str, int]]) -> None:
        self.admin = {b: dict(s) for b, s in backends.items()}
        self.commands: list[str] = []
        self.down = False

    def serving(self, backend: str) -> set[str]:
        return {s for s, a in self.admin[backend].items() if not a & FMAINT}

    async def command(self, line: str) -> str:
        if self.down:
            raise RuntimeApiError("fake haproxy is down")
        self.commands.append(line)
        if line == "show servers state":
            rows = ["1", "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight"]
            for bi, (b, servers) in enumerate(self.admin.items()):
                for si, (s, a) in enumerate(servers.items()):
                    rows.append(f"{bi} {b} {si} {s} 127.0.0.1 {0 if a & FMAINT else 2} {a} 1")
            return "\n".join(rows) + "\n\n"
        parts = line.split()
        if parts[:2] == ["set", "server"] and parts[3] == "state":
            b, _, s = parts[2].partition("/")
            if b not in self.admin or s not in self.admin[b]:
                return "No such server.\n\n"
            a = self.admin[b][s]
            self.admin[b][s] = (a & ~(FMAINT | FDRAIN)) if parts[4] == "ready" else (a | FMAINT)
            return "\n"
        return "Unknown command.\n"


def test_parse_real_output() -> None:
    state = parse_servers_state(REAL_STATE)
    assert sorted(state) == ["be_bge", "be_llama"]
    a, b, c = (state["be_llama"][n] for n in ("node-a", "node-b", "node-c"))
    assert (a.forced_maint, a.serving) == (False, True)
    assert (b.forced_maint, b.serving, b.op_state) == (True, False, OP_STOPPED)
    assert (c.forced_maint, c.admin_state & CMAINT != 0, c.serving) == (True, True, False)


@pytest.mark.parametrize(
    "text", ["", "Unknown command.\n", "2\n# be_name srv_name\n", "1\n# be_id be_name\n3 be 1\n",
             "1\n# be_name srv_name srv_op_state srv_admin_state\nbe s x 0\n"]
)
def test_parse_rejects_unexpected_answers(text: str) -> None:
    with pytest.raises(RuntimeApiError):
        parse_servers_state(text)


def test_parse_empty_state_is_no_backends() -> None:
    assert parse_servers_state("1\n# be_id be_name srv_id srv_name srv_op_state srv_admin_state\n") == {}


def test_plan_sends_only_changes() -> None:
    servers = {"a": st_("a"), "b": st_("b"), "c": st_("c", FMAINT), "d": st_("d", FMAINT)}
    plan = plan_backend("be", servers, frozenset({"a", "c"}), held_out=frozenset({"b", "d"}))
    assert plan.commands == ("set server be/c state ready", "set server be/b state maint")
    assert plan.ready == {"a", "c"} and plan.maint == {"b", "d"} and plan.skipped is None


def test_plan_makes_servers_not_judged_yet_ready() -> None:
    # d is new to tailguard (not routed, not held out): ready, so that it gets the traffic
    # that admits it; b was taken out
    servers = {"a": st_("a"), "b": st_("b"), "c": st_("c", FMAINT), "d": st_("d", FMAINT)}
    plan = plan_backend("be", servers, frozenset({"a", "c"}), held_out=frozenset({"b"}))
    assert plan.commands == ("set server be/c state ready", "set server be/d state ready",
                             "set server be/b state maint")
    # a model with no routing set yet (nobody admitted) and one node held out (gone)
    plan = plan_backend("be", servers, frozenset(), held_out=frozenset({"b"}))
    assert plan.ready == {"a", "c", "d"} and plan.maint == {"b"} and plan.skipped is None


def test_plan_uses_server_map_and_ignores_unknown_nodes() -> None:
    servers = {"srv1": st_("srv1", FMAINT), "srv2": st_("srv2")}
    plan = plan_backend("be", servers, frozenset({"gpu-1", "ghost"}), {"gpu-1": "srv1", "gpu-2": "srv2"},
                        held_out=frozenset({"gpu-2", "ghost-2"}))
    assert plan.commands == ("set server be/srv1 state ready", "set server be/srv2 state maint")


@pytest.mark.parametrize(
    ("servers", "routed", "reason"),
    [
        (None, frozenset({"a"}), "does not exist"),
        ({"a": st_("a")}, frozenset(), "unknown"),
        ({"a": st_("a"), "b": st_("b")}, frozenset({"x", "y"}), "no node of the routing set"),
        ({"a": st_("a"), "b": st_("b")}, frozenset({"a"}), "every server"),
    ],
)
def test_plan_leaves_backend_alone_when_it_would_empty_it(
    servers: dict[str, ServerState] | None, routed: frozenset[str], reason: str
) -> None:
    held = frozenset({"a", "b"}) if reason == "every server" else frozenset()
    plan = plan_backend("be", servers, routed, held_out=held)
    assert plan.commands == () and plan.skipped is not None and reason in plan.skipped


def test_config_disabled_server_is_not_forced_back() -> None:
    # `disabled` in the config (CMAINT) without forced maint: a routed one needs no command, an unrouted one gets maint.
    servers = {"a": st_("a", CMAINT, OP_STOPPED), "b": st_("b")}
    assert plan_backend("be", servers, frozenset({"a", "b"})).commands == ()
    assert plan_backend("be", servers, frozenset({"b"}), held_out=frozenset({"a"})).commands == (
        "set server be/a state maint",)


names = st.sampled_from(["s1", "s2", "s3", "s4", "s5"])


@given(
    admin=st.dictionaries(names, st.sampled_from([0, FMAINT, FDRAIN, FMAINT | FDRAIN, CMAINT]), min_size=1),
    routed=st.frozensets(st.sampled_from(["s1", "s2", "s3", "s4", "s5", "ghost"])),
    held=st.frozensets(st.sampled_from(["s1", "s2", "s3", "s4", "s5", "ghost"])),
)
async def test_plan_invariants_never_all_maint_and_idempotent(admin: dict[str, int], routed: frozenset[str],
                                                              held: frozenset[str]) -> None:
    routed = routed - held          # tailguard never holds out a routed node
    fake = FakeHaproxy({"be": admin})
    state = parse_servers_state(await fake.command("show servers state"))
    plan = plan_backend("be", state["be"], routed, held_out=held)
    for cmd in plan.commands:
        assert await fake.command(cmd) == "\n"
    known = bool(routed or held) and (not routed or bool(routed & set(admin)))
    usable = set(admin) - held if known else set()
    if usable:
        assert fake.serving("be") == usable
        # Applying the plan converges: a second plan has nothing left to do.
        again = plan_backend("be", parse_servers_state(await fake.command("show servers state"))["be"], routed,
                             held_out=held)
        assert again.commands == ()
    else:
        assert plan.commands == () and fake.admin["be"] == admin
    assert fake.serving("be") or not any(not a & FMAINT for a in admin.values())


async def test_sync_once_follows_routing_changes_across_backends() -> None:
    fake = FakeHaproxy({"be_llama": {"a": 0, "b": 0, "c": 0}, "be_bge": {"e1": 0, "e2": FMAINT}})
    source = StaticSource({"llama": frozenset({"a", "b", "c"}), "bge": frozenset({"e1", "e2"})})
    sync = HaproxySync(fake, source, {"llama": "be_llama", "bge": "be_bge"})
    r = await sync.sync_once()
    assert r.sent == ["set server be_bge/e2 state ready"] and not r.errors and not r.skipped

    source.routing["llama"] = frozenset({"a", "c"})
    source.held["llama"] = frozenset({"b"})
    r = await sync.sync_once()
    assert r.sent == ["set server be_llama/b state maint"]
    assert fake.serving("be_llama") == {"a", "c"}

    fake.commands.clear()
    assert (await sync.sync_once()).sent == []
    assert fake.commands == ["show servers state"]          # one read, no writes when nothing changed

    source.routing["llama"] = frozenset()                    # unknown: leave as is
    source.held["llama"] = frozenset()
    r = await sync.sync_once()
    assert r.sent == [] and "be_llama" in r.skipped and fake.serving("be_llama") == {"a", "c"}

    source.routing["llama"] = frozenset({"a", "b", "c"})
    assert (await sync.sync_once()).sent == ["set server be_llama/b state ready"]
    assert sync.commands_sent == 3 and sync.syncs == 5


async def test_sync_repairs_a_restarted_haproxy() -> None:
    fake = FakeHaproxy({"be": {"a": 0, "b": 0}})
    sync = HaproxySync(fake, StaticSource({"m": frozenset({"a"})}, held={"m": frozenset({"b"})}), {"m": "be"})
    await sync.sync_once()
    fake.admin["be"]["b"] = 0                                # restart: config state again
    assert (await sync.sync_once()).sent == ["set server be/b state maint"]


async def test_refused_commands_are_reported_not_raised() -> None:
    class Denying(FakeHaproxy):
        async def command(self, line: str) -> str:
            return "Permission denied\n\n" if line.startswith("set ") else await super().command(line)

    sync = HaproxySync(Denying({"be": {"a": 0, "b": 0}}),
                       StaticSource({"m": frozenset({"a"})}, held={"m": frozenset({"b"})}), {"m": "be"})
    r = await sync.sync_once()
    assert r.sent == [] and len(r.errors) == 1 and "level admin" in r.errors[0]


async def test_run_syncs_on_wake_and_stops() -> None:
    fake = FakeHaproxy({"be": {"a": 0, "b": 0}})
    source = StaticSource({"m": frozenset({"a", "b"})})
    stop, wake = asyncio.Event(), asyncio.Event()
    sync = HaproxySync(fake, source, {"m": "be"}, poll_interval_s=60.0, resync_interval_s=600.0, wake=wake)
    task = asyncio.create_task(sync.run(stop))
    while sync.syncs < 1:
        await asyncio.sleep(0)
    source.routing["m"] = frozenset({"a"})
    source.held["m"] = frozenset({"b"})
    sync.notify()
    while sync.commands_sent < 1:
        await asyncio.sleep(0)
    assert fake.serving("be") == {"a"}
    stop.set()
    await asyncio.wait_for(task, 5.0)
    assert sync.syncs == 2


def test_backend_map_validation() -> None:
    validate_backend_map({"m1": "be_1", "m2": "be-2.x"})
    for bad, needle in [({}, "at least one"), ({"m": "be 1"}, "not a valid"), ({"m": "b;x"}, "not a valid"),
                        ({"m1": "be", "m2": "be"}, "both")]:
        with pytest.raises(BackendsError, match=needle):
            validate_backend_map(bad)


@pytest.fixture
async def fake_socket(tmp_path: Path) -> AsyncIterator[tuple[str, list[str]]]:
    path = str(tmp_path / "admin.sock")
    received: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode().strip()
        received.append(line)
        writer.write(REAL_STATE.encode() if line == "show servers state" else b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, path)
    async with server:
        yield path, received


async def test_socket_client_speaks_one_command_per_connection(fake_socket: tuple[str, list[str]]) -> None:
    path, received = fake_socket
    for address in (path, f"unix@{path}"):
        api = SocketRuntimeApi(address)
        assert parse_servers_state(await api.command("show servers state"))["be_llama"]["node-a"].serving
        assert await api.command("set server be_llama/node-b state ready") == "\n"
    assert received == ["show servers state", "set server be_llama/node-b state ready"] * 2


async def test_socket_client_errors_name_socket_and_config(tmp_path: Path) -> None:
    api = SocketRuntimeApi(str(tmp_path / "missing.sock"))
    with pytest.raises(RuntimeApiError, match=r"missing\.sock.*level admin"):
        await api.command("show servers state")
    with pytest.raises(ValueError, match="one Runtime API command"):
        await api.command("show info; show stat")


def test_socket_address_forms() -> None:
    assert SocketRuntimeApi("ipv4@127.0.0.1:9999")._tcp == ("127.0.0.1", 9999)
    assert SocketRuntimeApi("localhost:9999")._tcp == ("localhost", 9999)
    assert SocketRuntimeApi("./run/admin.sock")._unix == "./run/admin.sock"
    with pytest.raises(ValueError, match="--socket"):
        SocketRuntimeApi("admin.sock")
