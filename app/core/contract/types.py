"""Value types that cross the core's seams (stage 1 → stage 2 → the edges).

All are small frozen dataclasses (``WindowSummary``, made 10,000 times per
tick, is a ``NamedTuple`` for speed). Every type that travels over Kafka or into
a snapshot has ``to_dict()`` / ``from_dict()`` producing plain JSON-able data.
"No data" is ``None``, never NaN or 0.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

_NO_EXTRA: Mapping[str, Any] = MappingProxyType({})


def p99_p50_ratio(p50: float | None, p99: float | None) -> float | None:
    """``p99 / p50``, or ``None`` when either is missing, not finite, or ``p50 <= 0``."""
    if p50 is None or p99 is None or not (math.isfinite(p50) and math.isfinite(p99)) or p50 <= 0:
        return None
    return p99 / p50


def _opt_ts(v: object) -> bool:
    """None, or a finite number (not a bool)."""
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))


class HealthState(enum.StrEnum):
    """Per-(node, model) health. ``routed`` says whether LBs may use it."""

    UNKNOWN = "unknown"          # never seen
    WARMING = "warming"          # first warmup_s after first seen (or a restart); routed once admitted
    HEALTHY = "healthy"          # routed
    SUSPECT = "suspect"          # abnormal in < confirm_windows consecutive windows; routed
    UNHEALTHY = "unhealthy"      # confirmed; out of routing unless a fleet guard keeps it in
    QUARANTINED = "quarantined"  # out of routing, waiting for back-off / being probed
    RETIRED = "retired"          # failed too many probe rounds or diagnostics said unrecoverable
    GONE = "gone"                # silent for silent_after_s: out of routing, in no guard's count


class Reason(enum.StrEnum):
    P99_P50_RATIO = "p99_p50_ratio"          # tail: ratio above threshold (and above the fleet's)
    RELATIVE_P50 = "relative_p50"            # P50 far above its peers' median
    RELATIVE_P99 = "relative_p99"            # P99 far above its peers' median P99
    WARMUP = "warmup"
    WARMUP_DONE = "warmup_done"
    FIRST_SEEN = "first_seen"
    NORMAL = "normal"                        # abnormal streak ended
    CONFIRMED = "confirmed"
    EJECTION_CAP = "ejection_cap"            # confirmed, kept in routing by max_ejected_fraction / last node
    QUARANTINE = "quarantine"
    PROBE_PASSED = "probe_passed"
    PROBE_FAILED = "probe_failed"
    DIAGNOSTICS_RECOVERABLE = "diagnostics_recoverable"
    DIAGNOSTICS_UNRECOVERABLE = "diagnostics_unrecoverable"
    TOO_MANY_PROBE_FAILURES = "too_many_probe_failures"
    FORGOTTEN = "forgotten"                  # retired, then silent for forget_after_s
    ERROR_RATE = "error_rate"                # failed requests far above max_error_share
    STALLED = "stalled"                      # completed no request while its peers served many
    SILENT = "silent"                        # no sample or heartbeat for silent_after_s: gone
    RETURNED = "returned"                    # a gone pair reported again: warming (or probed)
    RESTARTED = "restarted"                  # a new process instance, or back after a gap: warming
    ADMITTED = "admitted"                    # a new pair's first judged window was normal: routed


class WindowSummary(NamedTuple):
    """Stage 1's per-tick summary of one (node, model) window.

    ``p50``/``p99`` are of ``signal`` (µs for "latency", µs/token for "tpot",
    dimensionless for "normalized"); ``None`` when the window holds fewer
    than one judged sample. ``latency_p50_us``/``latency_p99_us`` are always
    raw latency, for dashboards. ``samples`` counts judged (ok, non-probe,
    within the age bound) samples; ``probe_*`` the probe samples since
    ``probe_since_ts`` (see WindowStore). ``fresh_samples`` counts the judged
    samples (with a value of ``signal``) from the last ``tick_interval_s`` of
    event time, ``fresh_p50`` is their P50 of ``signal`` — ``None`` below a
    quarter of ``min_samples`` of them (stage 2 takes only those of ``min_samples``
    as a reference; fewer are judged). After an onset the fresh P50 moves a tick before
    the window's, which still holds older samples (see tailguard.core.judge.evaluate).
    ``requests_total``/``failed_total`` count every request stage 1 has taken
    for the series (ok or failed, probes included) and the failed ones, since
    the series was first seen by this stage 1: stage 2 takes the difference
    between ticks (the failed share since the previous tick).
    Both default to "none" so that a summary from a stage 1 that did not send
    them decodes as before.

    Immutable like the dataclasses here, but a ``NamedTuple``: stage 1 makes one
    per series per tick, and a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) costs several times more (docs/performance.md).
    Copy with ``_replace``.
    """

    node_id: str
    model: str
    tick_ts: float
    signal: str
    samples: int
    p50: float | None
    p99: float | None
    latency_p50_us: float | None
    latency_p99_us: float | None
    failed: int = 0
    hardware: str | None = None
    first_seen_ts: float | None = None
    last_seen_ts: float | None = None
    probe_samples: int = 0
    probe_p50: float | None = None
    probe_p99: float | None = None
    extra: Mapping[str, Any] = _NO_EXTRA
    fresh_samples: int = 0
    fresh_p50: float | None = None
    requests_total: int = 0
    failed_total: int = 0
    # When the series last restarted, as stage 1 saw it: a new ``instance`` (``instance_ts``),
    # or signs of life resuming after a gap (``resumed_ts``); None when never.
    instance_ts: float | None = None
    resumed_ts: float | None = None
    # Of the fresh samples, how many lie above the threshold stage 2 handed down for the model
    # (``tail_refs``: its peers' P99 with a margin); None when there was no threshold or too
    # many fresh samples for the count to matter (the window rules see those nodes in time).
    fresh_over: int | None = None

    @property
    def ratio(self) -> float | None:
        if self.p50 is None or self.p99 is None or self.p50 <= 0:
            return None
        return self.p99 / self.p50

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WindowSummary:
        """The inverse of :meth:`to_dict`. Keys it does not know are ignored; the optional
        ``fresh_*`` fields, when missing (an older stage 1) or not a valid count / positive
        finite P50, are left at "none" — the summary is then judged on its window alone."""
        s = cls(**{k: d[k] for k in cls._fields if k in d})
        n, p50 = s.fresh_samples, s.fresh_p50
        if (not isinstance(n, int) or isinstance(n, bool) or n < 0
                or (p50 is not None and (not isinstance(p50, int | float) or isinstance(p50, bool)
                                         or not math.isfinite(p50) or p50 <= 0))):
            s = s._replace(fresh_samples=0, fresh_p50=None)
        if not _opt_ts(s.instance_ts) or not _opt_ts(s.resumed_ts):
            s = s._replace(instance_ts=s.instance_ts if _opt_ts(s.instance_ts) else None,
                           resumed_ts=s.resumed_ts if _opt_ts(s.resumed_ts) else None)
        over = s.fresh_over
        if over is not None and (type(over) is not int or not 0 <= over <= s.fresh_samples):
            s = s._replace(fresh_over=None)
        req, fail = s.requests_total, s.failed_total
        if not (type(req) is int and type(fail) is int and 0 <= fail <= req):
            s = s._replace(requests_total=0, failed_total=0)
        return s


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change of one (node, model), with the numbers behind it.

    Serialized by :meth:`to_event` into the contract's health-change JSON.
    ``event_id`` is a pure function of (model, node, from, to, from_since_ts):
    a pair leaves the state it entered at ``from_since_ts`` once, so the same
    change derived twice — by a new stage-2 owner that restored a state older
    than the last published change — carries the same id (``ts`` when
    ``from_since_ts`` is unknown). ``p50``/``p99``/``ratio`` are of
    ``signal``; ``latency_p50_us``/``latency_p99_us`` are raw latency.
    """

    ts: float
    node_id: str
    model: str
    from_state: HealthState
    to_state: HealthState
    routed: bool
    reason: str
    signal: str | None = None
    p50: float | None = None
    p99: float | None = None
    ratio: float | None = None
    samples: int | None = None
    peers_p50: float | None = None
    latency_p50_us: float | None = None
    latency_p99_us: float | None = None
    hardware: str | None = None
    detail: str | None = None
    fresh_p50: float | None = None
    peers_fresh_p50: float | None = None
    from_since_ts: float | None = None

    @property
    def latency_ratio(self) -> float | None:
        """P99/P50 of raw latency (the event's ``ratio``)."""
        return p99_p50_ratio(self.latency_p50_us, self.latency_p99_us)

    @property
    def event_id(self) -> str:
        at = self.ts if self.from_since_ts is None else self.from_since_ts
        key = f"{self.model}\x1f{self.node_id}\x1f{self.from_state}\x1f{self.to_state}\x1f{at!r}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_event(self) -> dict[str, Any]:
        """The contract's health-change JSON (ARCHITECTURE.md).

        ``p50_us``/``p99_us``/``ratio`` are raw latency (``ratio`` = ``p99_us / p50_us``,
        ``None`` when either is missing); ``signal_p50``/``signal_p99``/``signal_ratio``
        are of ``signal``, the values the verdict used.
        """
        return {
            "event_id": self.event_id, "ts": self.ts, "node_id": self.node_id, "model": self.model,
            "from": str(self.from_state), "to": str(self.to_state), "routed": self.routed,
            "reason": self.reason, "signal": self.signal,
            "p50_us": self.latency_p50_us, "p99_us": self.latency_p99_us,
            "ratio": self.latency_ratio, "samples": self.samples,
            "signal_p50": self.p50, "signal_p99": self.p99, "signal_ratio": self.ratio,
            "peers_p50": self.peers_p50,
            "signal_fresh_p50": self.fresh_p50, "peers_fresh_p50": self.peers_fresh_p50,
            "hardware": self.hardware, "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """A model-level event: many nodes abnormal at once, or the baseline moved.

    Reported (topic ``fleet-health-events`` and replay output), never a
    reason to eject.
    """

    ts: float
    model: str
    kind: str                  # "load_event" | "baseline_shift" | "error_storm" | …_end
    abnormal_nodes: int
    judged_nodes: int
    fleet_p50: float | None = None
    baseline_p50: float | None = None
    signal: str | None = None
    detail: str | None = None

    @property
    def event_id(self) -> str:
        key = f"{self.model}\x1f{self.kind}\x1f{self.ts!r}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_event(self) -> dict[str, Any]:
        d: dict[str, Any] = {"event_id": self.event_id, "type": "fleet"}
        d.update({k: getattr(self, k) for k in self.__dataclass_fields__})
        return d


@dataclass(frozen=True, slots=True)
class WeightEvidence:
    """Why a node has its target: its P50 of ``signal`` against its peers' reference."""

    signal: str
    value: float             # the node's window P50 of the signal
    ref: float               # its peers' reference P50 (class median)
    band: float              # the noise band as a factor of ref (1.12: 12 % above ref is noise)
    target: float            # the target weight this window (quantized)
    samples: int
    peers: int               # peers of the node's class behind ref and the band

    @property
    def slower(self) -> float:
        return self.value / self.ref

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.signal, "p50": self.value, "peers_p50": self.ref,
                "slower": round(self.slower, 4), "noise_band": round(self.band, 4),
                "target": self.target, "samples": self.samples, "peers": self.peers}

    def text(self) -> str:
        return (f"P50 {self.slower:.2f}x its {self.peers} peers' ({self.signal}); noise band "
                f"{self.band:.2f}x; target {self.target:g}")


@dataclass(frozen=True, slots=True)
class WeightChange:
    """A routed node's published weight moved (``previous_weight`` 1.0: it was unweighted)."""

    ts: float
    node_id: str
    model: str
    weight: float
    previous_weight: float
    reason: str              # "slower_than_peers" | "recovering" | "total_weight_guard"
    evidence: WeightEvidence | None = None

    def to_event(self) -> dict[str, Any]:
        """The health-change topic's ``weight`` event (docs/contracts.md)."""
        return {"type": "weight", "ts": self.ts, "node_id": self.node_id, "model": self.model,
                "weight": self.weight, "previous_weight": self.previous_weight,
                "reason": self.reason,
                "evidence": None if self.evidence is None else self.evidence.to_dict()}

    def replay_line(self) -> dict[str, Any]:
        """What ``tailguard replay`` prints for it."""
        return {"type": "weight", "ts": self.ts, "node_id": self.node_id, "model": self.model,
                "weight": self.weight}


@dataclass(frozen=True, slots=True)
class DiagnosticsRequest:
    """Ask the node's agent to collect evidence (one per node that becomes unhealthy)."""

    ts: float
    node_id: str
    model: str
    reason: str
    collect: tuple[str, ...] = ("kernel_profile", "gpu_memory_state", "ecc_xid_errors")

    @property
    def request_id(self) -> str:
        return hashlib.sha256(f"{self.model}\x1f{self.node_id}\x1f{self.ts!r}".encode()).hexdigest()[:32]

    def to_event(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "ts": self.ts, "node_id": self.node_id,
                "model": self.model, "reason": self.reason, "collect": list(self.collect)}


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """What dashboards and ``tailguard status`` show for one (node, model).

    ``p50``/``p99``/``ratio`` are of ``signal``; ``latency_*`` are raw latency.
    """

    node_id: str
    model: str
    state: HealthState
    routed: bool
    since_ts: float
    reason: str
    p50: float | None = None
    p99: float | None = None
    ratio: float | None = None
    samples: int = 0
    latency_p50_us: float | None = None
    latency_p99_us: float | None = None
    signal: str | None = None
    hardware: str | None = None
    probe_after_ts: float | None = None
    # Routing weight (tailguard.core.judge.weights): 1.0 for a routed node at full weight, None when not
    # routed (or weights are off); ``weight_detail`` says why it is below 1.0.
    weight: float | None = None
    weight_detail: str | None = None

    @property
    def latency_ratio(self) -> float | None:
        """P99/P50 of raw latency."""
        return p99_p50_ratio(self.latency_p50_us, self.latency_p99_us)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["state"] = str(self.state)
        return d


@dataclass(frozen=True, slots=True)
class ModelTick:
    """Stage 2's verdict for one model at one tick."""

    model: str
    ts: float
    transitions: tuple[Transition, ...]
    routing: frozenset[str]
    quarantine: dict[str, float]           # node -> earliest probe/re-admission ts
    statuses: tuple[NodeStatus, ...]
    fleet_events: tuple[FleetEvent, ...] = ()
    diagnostics: tuple[DiagnosticsRequest, ...] = ()
    # Cluster-wide raw-latency P50/P99 of the model (the SLA figure): exact quantiles of an
    # even thinning of every node's judged samples (``WindowStore.model_pools``); None when
    # the caller did not compute them or no sample was judged.
    fleet_latency_p50_us: float | None = None
    fleet_latency_p99_us: float | None = None
    # Routing weights of routed nodes below 1.0 (tailguard.core.judge.weights; a routed node not in it has
    # weight 1.0) and how they changed since the model's last tick.
    weights: Mapping[str, float] = field(default_factory=dict)
    weight_changes: tuple[WeightChange, ...] = ()
    # Stage 2 forgot the model (no pair left, no summary for forget_after_s): its routing
    # state is removed (no statuses, no routing; the writer deletes its keys).
    forgotten: bool = False
    # Histogram models: (metric, first bound in s) of each metric whose P50 the buckets cannot
    # resolve (most peers' P50 below the first bound; tailguard.core.judge.hist_resolution).
    unresolved: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TickResult:
    """The detector façade's answer for one tick over all models."""

    ts: float
    models: tuple[ModelTick, ...]

    @property
    def transitions(self) -> tuple[Transition, ...]:
        return tuple(t for m in self.models for t in m.transitions)

    @property
    def fleet_events(self) -> tuple[FleetEvent, ...]:
        return tuple(e for m in self.models for e in m.fleet_events)

    @property
    def weight_changes(self) -> tuple[WeightChange, ...]:
        return tuple(c for m in self.models for c in m.weight_changes)

    def routing(self) -> dict[str, frozenset[str]]:
        return {m.model: m.routing for m in self.models}


def utc_text(ts: float | None) -> str:
    """An event time for people: ISO 8601 UTC to the millisecond (``repr`` if not a date)."""
    if ts is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"
    except (OverflowError, ValueError, OSError):
        return repr(ts)
