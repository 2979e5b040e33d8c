"""haproxy-sync's routing weights: `set weight <backend>/<server> <N>%`, only when HAProxy's weight differs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_lb_haproxy import REAL_STATE

from tailguard.lb.haproxy import HaproxySync
from tailguard.lb.haproxy_plan import (
    FDRAIN,
    FMAINT,
    OP_RUNNING,
    ServerState,
    effective_weight,
    parse_servers_state,
    plan_backend,
    plan_weights,
    weight_percent,
)
from tailguard.lb.testing import StaticSource


def srv(name: str, iweight: int = 100, uweight: int | None = None, admin: int = 0) -> ServerState:
    return ServerState("be", name, OP_RUNNING, admin, iweight if uweight is None else uweight, iweight)


class WeightedHaproxy:
    """A RuntimeApi keeping admin states and weights like HAProxy 2.6 (src/server.c arithmetic)."""

    def __init__(self, servers: dict[str, int], *, iweight: int = 100, static: bool = False) -> None:
        self.admin = dict.fromkeys(servers, 0)
        self.iweight = {s: w or iweight for s, w in servers.items()}
        self.uweight = dict(self.iweight)
        self.static = static
        self.commands: list[str] = []

    async def command(self, line: str) -> str:
        self.commands.append(line)
        if line == "show servers state":
            rows = ["1", "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state "
                         "srv_uweight srv_iweight srv_time_since_last_change"]
            for i, s in enumerate(self.admin):
                rows.append(f"3 be {i} {s} 127.0.0.1 2 {self.admin[s]} {self.uweight[s]} {self.iweight[s]} 0")
            return "\n".join(rows) + "\n\n"
        parts = line.split()
        if parts[:2] == ["set", "weight"]:
            s = parts[2].partition("/")[2]
            pct = int(parts[3].rstrip("%"))
            w = min(256, self.iweight[s] * pct // 100)
            if self.static and w not in (0, self.iweight[s]):
                return "Backend is using a static LB algorithm and only accepts weights '0%' and '100%'.\n\n"
            self.uweight[s] = w
            return "\n"
        if parts[:2] == ["set", "server"]:
            s = parts[2].partition("/")[2]
            self.admin[s] = (self.admin[s] & ~(FMAINT | FDRAIN)) if parts[4] == "ready" else self.admin[s] | FMAINT
            return "\n"
        return "Unknown command.\n"


def test_parse_reads_the_weight_columns_when_present() -> None:
    a = parse_servers_state(REAL_STATE)["be_llama"]["node-a"]
    assert (a.uweight, a.iweight) == (1, 1)
    bare = parse_servers_state("1\n# be_id be_name srv_id srv_name srv_op_state srv_admin_state\n3 be 1 s 2 0\n")
    assert (bare["be"]["s"].uweight, bare["be"]["s"].iweight) == (None, None)


@pytest.mark.parametrize(("weight", "percent"), [(1.0, 100), (0.625, 62), (0.626, 63), (0.1, 10),
                                                 (0.001, 1), (0.004, 1), (0.999, 100)])
def test_weight_percent(weight: float, percent: int) -> None:
    assert weight_percent(weight) == percent


def test_effective_weight_is_haproxys_integer_arithmetic() -> None:
    # Measured on HAProxy 2.6: weight 100 at 62% -> 62, weight 10 -> 6, weight 1 -> 0.
    assert [effective_weight(iw, 62) for iw in (100, 10, 1)] == [62, 6, 0]
    assert effective_weight(256, 100) == 256 and effective_weight(200, 100) == 200


def test_plan_weights_sets_routed_weights_and_full_weight_elsewhere() -> None:
    servers = {"a": srv("a"), "b": srv("b"), "c": srv("c", uweight=62), "new": srv("new", uweight=50)}
    commands, notes = plan_weights("be", servers, frozenset(servers), frozenset({"a", "b", "c"}),
                                   {"b": 0.625, "new": 0.3})
    # b goes down; c recovered (no weight) back to 100%; new is not routed: 100% whatever the hash says
    assert commands == ("set weight be/b 62%", "set weight be/c 100%", "set weight be/new 100%")
    assert notes == ()


def test_plan_weights_sends_nothing_when_haproxy_already_agrees() -> None:
    servers = {"a": srv("a"), "b": srv("b", uweight=62)}
    assert plan_weights("be", servers, frozenset(servers), frozenset(servers), {"b": 0.625}) == ((), ())


def test_plan_weights_follows_the_server_map() -> None:
    servers = {"srv1": srv("srv1"), "srv2": srv("srv2")}
    commands, _ = plan_weights("be", servers, frozenset(servers), frozenset({"gpu-1", "gpu-2"}),
                               {"gpu-2": 0.5, "srv1": 0.2}, {"gpu-1": "srv1", "gpu-2": "srv2"})
    assert commands == ("set weight be/srv2 50%",)


def test_a_server_configured_with_weight_1_keeps_full_weight_with_a_note() -> None:
    servers = {"a": srv("a", iweight=1), "b": srv("b", iweight=10)}
    commands, notes = plan_weights("be", servers, frozenset(servers), frozenset(servers), {"a": 0.5, "b": 0.5})
    assert commands == ("set weight be/b 50%",)
    assert len(notes) == 1 and "be/a" in notes[0] and "weight 100" in notes[0]


def test_held_out_servers_keep_their_weight_and_weights_none_sends_no_weight() -> None:
    servers = {"a": srv("a", uweight=30), "b": srv("b", uweight=62)}
    plan = plan_backend("be", servers, frozenset({"b"}), held_out=frozenset({"a"}), weights={})
    assert plan.commands == ("set server be/a state maint", "set weight be/b 100%")
    assert plan_backend("be", servers, frozenset({"b"}), held_out=frozenset({"a"}), weights=None).commands == (
        "set server be/a state maint",)


async def test_sync_weights_down_then_back_to_full_on_recovery() -> None:
    fake = WeightedHaproxy({"a": 0, "b": 0, "c": 0})
    source = StaticSource({"m": frozenset({"a", "b", "c"})}, weights={"m": {"b": 0.625}})
    sync = HaproxySync(fake, source, {"m": "be"})
    r = await sync.sync_once()
    assert r.sent == ["set weight be/b 62%"] and not r.errors
    assert fake.uweight == {"a": 100, "b": 62, "c": 100}
    fake.commands.clear()
    assert (await sync.sync_once()).sent == [] and fake.commands == ["show servers state"]
    source.weight["m"] = {}                                  # recovered
    assert (await sync.sync_once()).sent == ["set weight be/b 100%"]
    assert fake.uweight["b"] == 100


async def test_no_weights_leaves_haproxy_weights_alone() -> None:
    fake = WeightedHaproxy({"a": 0, "b": 0})
    fake.uweight["a"] = 7                                    # set by hand
    source = StaticSource({"m": frozenset({"a", "b"})}, weights={"m": {"b": 0.5}})
    sync = HaproxySync(fake, source, {"m": "be"}, weights=False)
    assert (await sync.sync_once()).sent == []
    assert fake.uweight == {"a": 7, "b": 100}


async def test_a_static_algorithm_refusal_is_reported_with_a_hint() -> None:
    fake = WeightedHaproxy({"a": 0, "b": 0}, static=True)
    sync = HaproxySync(fake, StaticSource({"m": frozenset({"a", "b"})}, weights={"m": {"b": 0.5}}), {"m": "be"})
    r = await sync.sync_once()
    assert r.sent == [] and len(r.errors) == 1
    assert "static" in r.errors[0] and "roundrobin" in r.errors[0] and "--no-weights" in r.errors[0]


@given(weights=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.floats(0.001, 1.0)),
       iweight=st.sampled_from([1, 3, 10, 100, 256]))
async def test_applying_the_plan_converges(weights: dict[str, float], iweight: int) -> None:
    fake = WeightedHaproxy(dict.fromkeys("abcd", iweight))
    state = parse_servers_state(await fake.command("show servers state"))["be"]
    routed = frozenset("abcd")
    commands, _ = plan_weights("be", state, routed, routed, weights)
    for c in commands:
        assert await fake.command(c) == "\n"
    for s in "abcd":
        assert fake.uweight[s] >= 1                          # never weighted to 0 (that is maint's job)
    again = parse_servers_state(await fake.command("show servers state"))["be"]
    assert plan_weights("be", again, routed, routed, weights)[0] == ()
