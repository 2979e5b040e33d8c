"""Leader election through a Lease (fake apiserver, fake clock): one leader, takeover after
the duration and not before, a clean release hands over at once."""

from __future__ import annotations

from tailguard.k8s.api import Client
from tailguard.k8s.lease import LeaderElector
from tailguard.k8s.testing import FakeApiServer


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def pair(api: FakeApiServer, clock: Clock, duration_s: float = 15.0) -> tuple[LeaderElector, LeaderElector]:
    client = Client(api)
    return tuple(LeaderElector(client, "default", "tg", ident, duration_s=duration_s, retry_s=2.0, clock=clock,
                               wall=clock) for ident in ("a", "b"))  # type: ignore[return-value]


async def test_one_leader_then_takeover_within_the_duration_after_the_leader_dies() -> None:
    api, clock = FakeApiServer(), Clock()
    a, b = pair(api, clock)
    await a.step()
    await b.step()
    assert a.leader and not b.leader
    for _ in range(5):                      # a renews every retry_s; b never gets it
        clock.t += 2.0
        await a.step()
        assert b.leader is False
        await b.step()
        assert a.leader and not b.leader
    last_renewal = clock.t
    # a dies now. b polls at the times it asks for; it takes over by last_renewal + duration_s.
    while not b.leader:
        clock.t += await b.step() or 0.001
        assert clock.t <= last_renewal + 15.0 + 1e-6, "took longer than the Lease duration"
    assert clock.t - last_renewal >= 15.0 - 2.0 - 1e-6      # and not before the record could have aged out
    assert api.leases[("default", "tg")]["spec"]["holderIdentity"] == "b"
    assert api.leases[("default", "tg")]["spec"]["leaseTransitions"] == 1


async def test_a_leader_that_cannot_renew_stops_before_anyone_may_take_over() -> None:
    api, clock = FakeApiServer(), Clock()
    a, b = pair(api, clock)
    await a.step()
    await b.step()
    renewed = clock.t
    clock.t = renewed + a.renew_deadline_s
    assert not a.leader                     # stepped down at the renew deadline …
    assert a.renew_deadline_s <= 15.0 - 2 * 2.0   # … which leaves 2 × retry_s before b may take over


async def test_release_hands_over_at_once() -> None:
    api, clock = FakeApiServer(), Clock()
    a, b = pair(api, clock)
    await a.step()
    await b.step()
    await a.release()
    assert not a.leader
    clock.t += 0.5
    await b.step()
    assert b.leader


async def test_two_candidates_racing_for_a_new_lease_one_wins() -> None:
    api, clock = FakeApiServer(), Clock()
    a, b = pair(api, clock)
    await a.step()
    await b.step()
    await a.step()
    await b.step()
    assert [a.leader, b.leader].count(True) == 1
