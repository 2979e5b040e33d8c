"""Leader election through a ``coordination.k8s.io/v1`` Lease, so that two ``k8s-sync``
replicas never patch pods at the same time.

Owns :class:`LeaderElector`. The algorithm is client-go's (``leaderelection``): the holder
renews ``spec.renewTime`` every ``retry_s``; a candidate takes the Lease over only after the
Lease record has not changed for ``duration_s`` *by its own clock* (clocks of different
machines are never compared), and writes with the record's ``resourceVersion``, so of two
candidates only one wins.

Guarantees:

* **Never two leaders.** A leader counts itself leader only until ``renew_deadline_s`` after
  its last successful renewal, and ``renew_deadline_s <= duration_s - 2 × retry_s``: it has
  stopped before any candidate may take over.
* **Takeover within the duration.** A candidate dates the record from the poll *before* the
  one that saw it change, and polls again exactly when it may take over: a killed leader's
  Lease is taken at most ``duration_s`` after its last renewal.
* :meth:`LeaderElector.release` (on a clean stop) hands the Lease over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from tailguard.k8s import K8sError
from tailguard.k8s.api import Client, Lease

log = logging.getLogger(__name__)


def micro_time(ts: float) -> str:
    """A Unix time as Kubernetes' MicroTime (RFC 3339, microseconds, UTC)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease ``namespace/name`` (see module docstring)."""

    def __init__(self, client: Client, namespace: str, name: str, identity: str, *,
                 duration_s: float = 15.0, retry_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 on_change: Callable[[bool], Any] | None = None) -> None:
        if not duration_s >= 1:
            raise ValueError(f"TAILGUARD_K8S_LEASE_DURATION_S must be >= 1, got {duration_s!r}")
        self.retry_s = retry_s if retry_s is not None else max(0.2, duration_s / 7.5)
        if not 0 < self.retry_s <= duration_s / 4:
            raise ValueError(f"retry_s must be in (0, duration_s / 4], got {self.retry_s!r}")
        self.client, self.namespace, self.name, self.identity = client, namespace, name, identity
        self.duration_s = duration_s
        self.renew_deadline_s = duration_s - 2 * self.retry_s
        self._clock, self._wall = clock, wall
        self._on_change = on_change
        self._renewed_at: float | None = None       # our last successful write (clock)
        self._observed: tuple[str, str] | None = None  # (holder, resourceVersion) last seen
        self._observed_at = 0.0                     # clock time the record last changed (see step)
        self._last_poll: float | None = None
        self._leader = False
        self.transitions = 0

    @property
    def leader(self) -> bool:
        """True while our last renewal is younger than ``renew_deadline_s``."""
        if self._renewed_at is None or self._clock() - self._renewed_at >= self.renew_deadline_s:
            self._set_leader(False)
        return self._leader

    def _set_leader(self, value: bool) -> None:
        if value != self._leader:
            self._leader = value
            if value:
                self.transitions += 1
            log.info("k8s-sync: %s the leader (Lease %s/%s, identity %s)", "became" if value else "is no longer",
                     self.namespace, self.name, self.identity)
            if self._on_change is not None:
                self._on_change(value)

    def _spec(self, now_wall: float, lease: Lease | None, acquire: bool) -> dict[str, Any]:
        spec: dict[str, Any] = dict((lease.raw.get("spec") or {}) if lease is not None else {})
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=round(self.duration_s),
                    renewTime=micro_time(now_wall))
        if acquire:
            spec["acquireTime"] = micro_time(now_wall)
            spec["leaseTransitions"] = (lease.transitions + 1) if lease is not None else 0
        return spec

    async def step(self) -> float:
        """Try to acquire or renew once; the seconds until the next try."""
        now = self._clock()
        previous_poll, self._last_poll = self._last_poll, now
        lease = await self.client.get_lease(self.namespace, self.name)
        if lease is None:
            spec = self._spec(self._wall(), None, True)
            written = await self.client.write_lease(self.namespace, self.name, spec, None)
            return self._wrote(written, now)
        if lease.holder == self.identity:
            written = await self.client.write_lease(self.namespace, self.name, self._spec(self._wall(), lease, False),
                                                    lease.resource_version)
            return self._wrote(written, now)
        self._set_leader(False)
        self._renewed_at = None
        record = (lease.holder, lease.resource_version)
        if record != self._observed:
            self._observed = record
            # It changed after our previous poll: date it from there, but never more than retry_s back
            # (the margin renew_deadline_s leaves the old leader is 2 × retry_s).
            self._observed_at = max(previous_poll if previous_poll is not None else now, now - self.retry_s)
        free_at = self._observed_at + (lease.duration_s or self.duration_s)
        if lease.holder and now < free_at:
            return max(0.0, min(self.retry_s, free_at - now))
        log.info("k8s-sync: Lease %s/%s of %r expired; taking it over", self.namespace, self.name, lease.holder)
        written = await self.client.write_lease(self.namespace, self.name, self._spec(self._wall(), lease, True),
                                                lease.resource_version)
        return self._wrote(written, now)

    def _wrote(self, written: Lease | None, at: float) -> float:
        if written is None:            # someone else wrote first: read again soon
            return min(self.retry_s, 0.2)
        self._renewed_at = at
        self._observed = (written.holder, written.resource_version)
        self._set_leader(True)
        return self.retry_s

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire and renew until ``stop`` is set; apiserver errors are logged, never raised."""
        failing = False
        while not stop.is_set():
            try:
                wait_s = await self.step()
                if failing:
                    log.info("k8s-sync: Lease %s/%s reachable again", self.namespace, self.name)
                failing = False
            except K8sError as e:
                if not failing:
                    log.error("k8s-sync: leader election: %s", e)
                failing = True
                wait_s = self.retry_s
                _ = self.leader   # drops leadership once the renew deadline has passed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait_s)

    async def release(self) -> None:
        """Give the Lease up (a clean stop): the next candidate takes it at its next try."""
        if not self._leader:
            return
        self._set_leader(False)
        self._renewed_at = None
        try:
            lease = await self.client.get_lease(self.namespace, self.name)
            if lease is not None and lease.holder == self.identity:
                spec = dict(lease.raw.get("spec") or {})
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self._wall()))
                await self.client.write_lease(self.namespace, self.name, spec, lease.resource_version)
        except K8sError as e:
            log.warning("k8s-sync: could not release Lease %s/%s: %s", self.namespace, self.name, e)
