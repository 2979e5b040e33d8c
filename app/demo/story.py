"""What a demo run observed, and what it means: observations in, a :class:`Story` out.

The observation types (load-generator :class:`Interval`, Redis
:class:`Snapshot` of the node statuses, :class:`HealthChange` events) are in
fleet time (0 = the simulated fleet started). :func:`analyze` cuts the run
into phases at the slow node's health changes — all healthy, slow and still
routed, removed, re-admitted — and, with a graded node, at its weight
(:class:`Graded`: slower at full weight, then weighted down), and gives each
phase the median of the load generator's per-interval P50/P99 over the
intervals wholly inside it.
It is pure (no I/O, no clock), so the unit tests drive it with made-up
observations; :func:`story_done` and :func:`current_phase` are what the live
loop asks of it. :func:`save_run` / :func:`load_run` write and re-read the
raw observations as JSON (``--replot``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailguard.demo.plan import Plan
from tailguard.text import printable

# A graded phase is measured from this long after the snapshot that shows its weight (the
# proxy reads the new weights within a second).
GRADED_LAG_S = 1.0

# --------------------------------------------------------------------------- observations


@dataclass(frozen=True, slots=True)
class Interval:
    """One load-generator interval, in fleet time."""

    t0_s: float
    t1_s: float
    completed: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    by_node: dict[str, int]


@dataclass(frozen=True, slots=True)
class NodeView:
    state: str
    routed: bool
    p50_ms: float | None
    p99_ms: float | None
    ratio: float | None
    samples: int
    probe_after_s: float | None     # fleet time
    weight: float | None = None     # routing weight (routed nodes; None: not written)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The model's status in Redis at one moment (fleet time)."""

    t_s: float
    nodes: dict[str, NodeView]
    routing: frozenset[str]


@dataclass(frozen=True, slots=True)
class HealthChange:
    """One health-change event (topic ``node-health-changes``), its time in fleet time."""

    t_s: float
    node_id: str
    from_state: str
    to_state: str
    routed: bool
    reason: str
    p50_ms: float | None
    p99_ms: float | None
    ratio: float | None
    peers_p50_ms: float | None
    detail: str | None

    @classmethod
    def from_event(cls, ev: dict[str, Any], t0: float) -> HealthChange:
        def ms(key: str) -> float | None:
            v = ev.get(key)
            return float(v) / 1e3 if isinstance(v, int | float) else None
        ratio = ev.get("ratio")
        return cls(float(ev["ts"]) - t0, str(ev["node_id"]), str(ev["from"]), str(ev["to"]), bool(ev["routed"]),
                   str(ev.get("reason") or ""), ms("p50_us"), ms("p99_us"),
                   float(ratio) if isinstance(ratio, int | float) else None,
                   ms("peers_p50") if ev.get("signal") in (None, "latency") else None, ev.get("detail"))

    @property
    def left_routing(self) -> bool:
        """Out of routing after it (a new node awaiting admission, warming, was never in it)."""
        return not self.routed and self.to_state != "warming"

    def describe(self) -> str:
        nums = []
        if self.p50_ms is not None:
            nums.append(f"P50 {self.p50_ms:.0f} ms")
        if self.peers_p50_ms is not None:
            nums.append(f"peers' P50 {self.peers_p50_ms:.0f} ms")
        if self.p99_ms is not None:
            nums.append(f"P99 {self.p99_ms:.0f} ms")
        if self.ratio is not None:
            nums.append(f"P99/P50 {self.ratio:.2f}")
        tail = f" [{', '.join(nums)}]" if nums else ""
        return (f"t={self.t_s:6.1f}s  {printable(self.node_id)}: {self.from_state} -> {self.to_state}"
                f" ({printable(self.reason)}{'' if self.routed else ', out of routing'}){tail}")


@dataclass
class Observations:
    """Everything seen during the run, in fleet time."""

    intervals: list[Interval] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    changes: list[HealthChange] = field(default_factory=list)
    load_start_s: float | None = None
    page_url: str | None = None        # the worker's status page during the run
    explain: str | None = None         # `tailguard explain` of the slow node when it was out


def parse_interval(line: dict[str, Any], t0: float, interval_s: float) -> Interval:
    t1 = float(line["ts"]) - t0
    return Interval(t1 - interval_s, t1, int(line["completed"]), int(line["errors"]),
                    line.get("p50_ms"), line.get("p99_ms"), dict(line.get("by_node") or {}))


def node_view(obj: dict[str, Any], t0: float) -> NodeView:
    def ms(key: str) -> float | None:
        v = obj.get(key)
        return float(v) / 1e3 if isinstance(v, int | float) and not isinstance(v, bool) else None
    ratio, pa = obj.get("ratio"), obj.get("probe_after")
    weight = obj.get("weight")
    return NodeView(str(obj.get("state", "?")), bool(obj.get("routed")), ms("p50_us"), ms("p99_us"),
                    float(ratio) if isinstance(ratio, int | float) else None, int(obj.get("samples") or 0),
                    float(pa) - t0 if isinstance(pa, int | float) else None,
                    float(weight) if isinstance(weight, int | float) and not isinstance(weight, bool) else None)


# --------------------------------------------------------------------------- the story


@dataclass(frozen=True, slots=True)
class Phase:
    """Client-side latency over one phase: medians of the per-interval P50/P99 wholly inside it."""

    label: str
    t0_s: float
    t1_s: float
    intervals: int
    requests: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class Graded:
    """The graded phase: the graded node slower than its peers, at full weight, then weighted down."""

    node: str
    full: Phase                     # from its onset until the proxy has a weight below 1.0
    weighted: Phase                 # from its lowest weight on, to the end
    weighted_s: float | None        # the first snapshot with its weight below 1.0 (fleet time)
    weight: float | None            # its lowest weight seen
    settled_s: float | None         # the first snapshot at that weight
    left_routing: bool              # taken out after its onset (it should not be)
    full_share: float | None = None       # its share of the requests in ``full``
    weighted_share: float | None = None   # … and in ``weighted``

    @property
    def ok(self) -> bool:
        return self.weighted_s is not None and not self.left_routing


@dataclass(frozen=True, slots=True)
class Story:
    """What happened, in fleet time; ``None`` for what did not happen."""

    plan: Plan
    healthy: Phase
    degraded: Phase
    removed: Phase
    readmitted: Phase
    suspect_s: float | None
    removed_s: float | None
    removal: HealthChange | None
    probe_after_s: float | None
    readmitted_s: float | None
    readmission: HealthChange | None
    reejected_s: float | None          # removed again after re-admission (it had recovered)
    probe_failures: tuple[HealthChange, ...]
    others_removed: tuple[str, ...]
    errors: int
    obs: Observations
    end_s: float
    graded: Graded | None = None

    @property
    def weak_link_factor(self) -> float | None:
        return _ratio(self.degraded.p99_ms, self.healthy.p99_ms)

    @property
    def cured_factor(self) -> float | None:
        return _ratio(self.removed.p99_ms, self.healthy.p99_ms)

    @property
    def complete(self) -> bool:
        """The node was removed, the P99 came back within 20 %, and (if it recovered) it was re-admitted."""
        cured = self.cured_factor
        return (self.removed_s is not None and cured is not None and abs(cured - 1) <= 0.2
                and not self.others_removed and self.reejected_s is None
                and (self.plan.end_s is None or self.readmitted_s is not None)
                and (self.graded is None or self.graded.ok))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def phase(label: str, intervals: Sequence[Interval], t0_s: float, t1_s: float) -> Phase:
    inside = [iv for iv in intervals if iv.t0_s >= t0_s - 1e-6 and iv.t1_s <= t1_s + 1e-6 and iv.completed]
    p99 = [iv.p99_ms for iv in inside if iv.p99_ms is not None]
    p50 = [iv.p50_ms for iv in inside if iv.p50_ms is not None]
    return Phase(label, t0_s, t1_s, len(inside), sum(iv.completed for iv in inside),
                 statistics.median(p50) if p50 else None, statistics.median(p99) if p99 else None)


def analyze_graded(plan: Plan, obs: Observations, end_s: float) -> Graded | None:
    """The graded phase, cut at the first snapshot that shows the graded node's weight below 1.0."""
    node = plan.graded_node
    if node is None:
        return None
    on, lag = plan.graded_onset_s, GRADED_LAG_S
    views = [(sn.t_s, sn.nodes.get(node)) for sn in obs.snapshots if sn.t_s >= on]
    weights = [(t, v.weight) for t, v in views if v is not None and v.weight is not None]
    weighted_s = next((t for t, w in weights if w < 1.0), None)
    lowest = min((w for _, w in weights), default=None)
    settled_s = next((t for t, w in weights if w == lowest), None) if weighted_s is not None else None
    label = f"{node} {plan.graded_slowdown:g}x slower"
    full = phase(f"{label}, full weight", obs.intervals, on, weighted_s + lag if weighted_s is not None else end_s)
    weighted = (phase(f"{label}, weighted {lowest:g}", obs.intervals, settled_s + lag, end_s)
                if settled_s is not None else phase(f"{label}, weighted down", [], end_s, end_s))
    left = any(c.node_id == node and c.t_s >= on and c.left_routing for c in obs.changes)
    return Graded(node, full, weighted, weighted_s, lowest, settled_s, left,
                  _share(node, obs.intervals, full), _share(node, obs.intervals, weighted))


def _share(node: str, intervals: Sequence[Interval], p: Phase) -> float | None:
    """``node``'s share of the requests of the intervals wholly inside ``p``."""
    inside = [iv for iv in intervals if iv.t0_s >= p.t0_s - 1e-6 and iv.t1_s <= p.t1_s + 1e-6]
    total = sum(sum(iv.by_node.values()) for iv in inside)
    return sum(iv.by_node.get(node, 0) for iv in inside) / total if total else None


def analyze(plan: Plan, obs: Observations, end_s: float) -> Story:
    """Cut the run into phases at the slow node's health changes (pure: no I/O)."""
    story_end = end_s
    if plan.graded_node is not None:
        end_s = min(end_s, plan.graded_onset_s)       # the slow node's phases end where the graded one begins
    slow = [c for c in obs.changes if c.node_id == plan.slow_node]
    after_onset = [c for c in slow if c.t_s >= plan.onset_s]
    suspect = next((c.t_s for c in after_onset if c.to_state == "suspect"), None)
    removal = next((c for c in after_onset if not c.routed and c.from_state in ("healthy", "suspect", "unhealthy")),
                   None)
    removed_s = removal.t_s if removal is not None else None
    readmission = None
    if removal is not None:
        readmission = next((c for c in slow if c.t_s > removal.t_s and c.routed and c.to_state == "healthy"), None)
    readmitted_s = readmission.t_s if readmission is not None else None
    reejected_s = None
    if readmission is not None:
        reejected_s = next((c.t_s for c in slow if c.t_s > readmission.t_s and not c.routed), None)
    probe_after = None
    if removed_s is not None:
        seen = [v.probe_after_s for s in obs.snapshots if s.t_s >= removed_s
                for n, v in s.nodes.items() if n == plan.slow_node and v.probe_after_s is not None]
        probe_after = min(seen) if seen else removed_s + plan.backoff_initial_s
    lag = 1.0      # the proxy learns a routing change within its poll interval (1 s; pub/sub is faster)
    skip = max(2 * plan.interval_s, 3.0)   # the first seconds of load include connection set-up
    healthy = phase("all nodes healthy", obs.intervals, (obs.load_start_s or 0.0) + skip, plan.onset_s)
    deg_end = removed_s + lag if removed_s is not None else end_s
    degraded = phase(f"{plan.slow_node} {plan.slowdown:g}x slower, still routed", obs.intervals,
                     plan.onset_s, deg_end)
    removed = phase(f"{plan.slow_node} removed", [], end_s, end_s)
    if removed_s is not None and probe_after is not None:
        # Probes reach the node from probe_after on: they are client requests too, so they count
        # only once the node has recovered.
        recovered_first = plan.end_s is not None and plan.end_s <= probe_after
        out_end = (readmitted_s if readmitted_s is not None else end_s) if recovered_first else probe_after
        removed = phase(f"{plan.slow_node} removed", obs.intervals, removed_s + lag, out_end)
    back = phase(f"{plan.slow_node} re-admitted", [], end_s, end_s)
    if readmitted_s is not None:
        back = phase(f"{plan.slow_node} re-admitted", obs.intervals, readmitted_s + lag,
                     reejected_s if reejected_s is not None else end_s)
    failed = tuple(c for c in slow if removed_s is not None and c.t_s > removed_s and c.reason == "probe_failed"
                   and (readmitted_s is None or c.t_s < readmitted_s))
    others = tuple(sorted({c.node_id for c in obs.changes if c.node_id != plan.slow_node and c.left_routing}))
    return Story(plan, healthy, degraded, removed, back, suspect, removed_s, removal, probe_after,
                 readmitted_s, readmission, reejected_s, failed, others, sum(iv.errors for iv in obs.intervals), obs,
                 story_end, analyze_graded(plan, obs, story_end))


def save_run(story: Story, path: Path) -> None:
    """The run's plan and raw observations as JSON (``--replot`` re-reads it)."""
    obs = story.obs
    data = {"plan": dataclasses.asdict(story.plan), "end_s": story.end_s, "load_start_s": obs.load_start_s,
            "intervals": [dataclasses.asdict(iv) for iv in obs.intervals],
            "snapshots": [{"t_s": sn.t_s, "routing": sorted(sn.routing),
                           "nodes": {n: dataclasses.asdict(v) for n, v in sn.nodes.items()}} for sn in obs.snapshots],
            "changes": [dataclasses.asdict(c) for c in obs.changes],
            "page_url": obs.page_url, "explain": obs.explain}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")


def load_run(path: Path) -> Story:
    """Inverse of :func:`save_run`: the story re-analysed from the saved observations."""
    d = json.loads(path.read_text(encoding="utf-8"))
    obs = Observations(
        intervals=[Interval(**iv) for iv in d["intervals"]],
        snapshots=[Snapshot(sn["t_s"], {n: NodeView(**v) for n, v in sn["nodes"].items()},
                            frozenset(sn["routing"])) for sn in d["snapshots"]],
        changes=[HealthChange(**c) for c in d["changes"]], load_start_s=d["load_start_s"],
        page_url=d.get("page_url"), explain=d.get("explain"))
    return analyze(Plan(**d["plan"]), obs, float(d["end_s"]))


def story_done(plan: Plan, obs: Observations, now_s: float) -> bool:
    """Enough seen: removed, and re-admitted (when the node recovers) ``settle_s`` ago; with a
    graded node, also its phase measured for ``graded_s``, and ``settle_s`` at its final weight."""
    if plan.graded_node is not None and now_s < plan.graded_end_s:
        return False
    s = analyze(plan, obs, now_s)
    g = s.graded
    if g is not None and g.settled_s is not None and now_s < g.settled_s + GRADED_LAG_S + plan.settle_s:
        return False        # its weight settled late: measure the weighted phase too
    if s.removed_s is None:
        return False
    if plan.end_s is None:
        return now_s >= s.removed_s + plan.backoff_initial_s
    return s.readmitted_s is not None and now_s >= s.readmitted_s + plan.settle_s


@dataclass(frozen=True, slots=True)
class View:
    """What the screen shows at one refresh."""

    t_s: float
    phase: str
    snapshot: Snapshot | None
    last: Interval | None
    changes: tuple[HealthChange, ...]


Show = Callable[[View], None]


def current_phase(plan: Plan, obs: Observations, t_s: float) -> str:
    if plan.graded_node is not None and t_s >= plan.graded_onset_s:
        g = analyze_graded(plan, obs, t_s)
        now = "" if g is None or g.settled_s is None else f": weighted down to {g.weight:g} at t={g.settled_s:.0f}s"
        return (f"graded phase: {plan.graded_node} is {plan.graded_slowdown:g}x slower, below the ejection rules"
                + (now or ": waiting for tailguard to weight it down"))
    if t_s < plan.onset_s:
        return f"healthy phase: {plan.slow_node} degrades at t={plan.onset_s:g}s"
    s = analyze(plan, obs, t_s)
    if s.removed_s is None:
        if plan.end_s is not None and t_s >= plan.end_s:
            return f"{plan.slow_node} recovered before it was removed"
        return f"{plan.slow_node} is {plan.slowdown:g}x slower and still routed: waiting for tailguard"
    if s.readmitted_s is not None:
        return f"{plan.slow_node} re-admitted at t={s.readmitted_s:.0f}s: measuring"
    rec = ("" if plan.end_s is None or t_s < plan.end_s
           else f"; it recovered at t={plan.end_s:g}s, probes follow")
    return f"{plan.slow_node} removed at t={s.removed_s:.0f}s (quarantined){rec}"
