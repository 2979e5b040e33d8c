"""The demo's plan: its timeline, fleet, traffic and short-tick detector settings.

A :class:`Plan` is everything one run of the story needs to know before it
starts: the fleet (8 nodes of one model, lognormal latency), which node slows
down, by how much, when and for how long, optionally a second node slowing
later by less than the ejection rules see (the graded phase: tailguard weights
it down instead), the client request rate, and the
detector settings it runs with (short ticks, so that the story fits in a few
minutes; :func:`settings_lines` says why each one differs from its default).
``DEMO_PLAN`` is what ``./scripts/demo`` runs, ``TEST_PLAN`` the same story
with 1-s ticks for the end-to-end test. A plan validates itself at
construction (a bad node name or an onset inside the warm-up raises
``ValueError``) and writes the fleet's scenario file (:meth:`Plan.scenario_toml`).
No I/O here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tailguard.core.contract.config import DetectorSettings

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-3-70b"
RUN_PREFIX = "tgdemo"
SOURCES = ("emitter", "metrics")


class DemoError(Exception):
    """The demo could not run its story: a child died, the stack is unreachable, a wait timed out."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The story's timeline (seconds of fleet time, 0 = the simulated fleet started) and settings."""

    tick_interval_s: float = 5.0
    confirm_windows: int = 3
    warmup_s: float = 10.0
    window_size: int = 200
    min_samples: int = 100
    probe_min_samples: int = 20
    backoff_initial_s: float = 20.0
    nodes: int = 8
    slow_node: str = "gpu-node-05"
    slowdown: float = 3.0
    p50_ms: float = 180.0
    sigma: float = 0.3
    rate_per_s: float = 160.0          # client requests/s through the proxy, all nodes together
    probe_share: float = 0.02
    onset_s: float = 60.0              # the slow node degrades
    degraded_s: float | None = 30.0    # ... for this long (None: for good)
    interval_s: float = 2.5            # the load generator's reporting interval
    refresh_s: float = 2.5             # how often the table is refreshed
    settle_s: float = 15.0             # keep measuring this long after re-admission
    deadline_s: float = 200.0          # give up at this fleet time
    # Where latencies come from: "emitter" (each node reports every request to Kafka) or
    # "metrics" (each node serves /metrics as vLLM does; `tailguard scrape` polls it: no emitter).
    source: str = "emitter"
    # The graded phase: graded_node serves every request graded_slowdown x slower from
    # graded_onset_s on (below relative_p50_factor: weighted down, not removed); measured for
    # graded_s. None: no graded phase.
    graded_node: str | None = None
    graded_slowdown: float = 1.6
    graded_onset_s: float = 0.0
    graded_s: float = 50.0

    def __post_init__(self) -> None:
        detector = self.detector()  # validates
        if self.source not in SOURCES:
            raise ValueError(f"source={self.source!r} must be one of {', '.join(SOURCES)}")
        if self.graded_node is not None:
            if self.graded_node not in self.node_ids or self.graded_node == self.slow_node:
                raise ValueError(f"graded_node={self.graded_node!r} must be a node other than {self.slow_node}")
            if not 1.0 < self.graded_slowdown < detector.relative_p50_factor:
                raise ValueError(f"graded_slowdown={self.graded_slowdown!r} must be above 1 and below "
                                 f"relative_p50_factor ({detector.relative_p50_factor:g}): a graded node stays routed")
            if self.graded_onset_s < (self.end_s or self.onset_s) or self.graded_end_s > self.deadline_s:
                raise ValueError(f"graded_onset_s={self.graded_onset_s!r} must come after the slow node's story "
                                 f"and leave graded_s={self.graded_s!r} before deadline_s={self.deadline_s!r}")
        if not 1 <= int(self.slow_node.rsplit("-", 1)[-1]) <= self.nodes:
            raise ValueError(f"slow_node={self.slow_node!r} is not one of gpu-node-01..{self.nodes:02d}")
        if self.degraded_s is not None and self.degraded_s <= 0:
            raise ValueError(f"degraded_s={self.degraded_s!r} must be > 0 or None")
        if self.onset_s <= self.warmup_s + 2 * self.interval_s:
            raise ValueError(f"onset_s={self.onset_s} leaves no healthy phase after warm-up ({self.warmup_s} s)")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(f"gpu-node-{i:02d}" for i in range(1, self.nodes + 1))

    @property
    def end_s(self) -> float | None:
        return None if self.degraded_s is None else self.onset_s + self.degraded_s

    @property
    def graded_end_s(self) -> float:
        """When the graded phase has been measured long enough."""
        return self.graded_onset_s + self.graded_s

    def detector(self) -> DetectorSettings:
        return DetectorSettings().replace(
            tick_interval_s=self.tick_interval_s, confirm_windows=self.confirm_windows, warmup_s=self.warmup_s,
            window_size=self.window_size, min_samples=self.min_samples,
            probe_min_samples=self.probe_min_samples, backoff_initial_s=self.backoff_initial_s,
            max_sample_age_s=10 * self.tick_interval_s,
            backoff_max_s=max(self.backoff_initial_s, DetectorSettings().backoff_max_s))

    def scenario_toml(self) -> str:
        """The fleet's scenario file (see ``app/sim/scenario.py`` for the format)."""
        end = "" if self.end_s is None else f"end_s = {self.end_s:g}\n"
        recover = "" if self.end_s is None else f", recovers at {self.end_s:g} s"
        graded = ("" if self.graded_node is None else
                  f'\n[[faults]]\nnode = "{self.graded_node}"\nkind = "slowdown"\nonset_s = {self.graded_onset_s:g}\n'
                  f"factor = {self.graded_slowdown:g}\n")
        return (
            f'description = "tailguard demo: {self.slow_node} serves every request {self.slowdown:g}x slower '
            f'from {self.onset_s:g} s{recover}'
            + ("" if self.graded_node is None else
               f'; {self.graded_node} {self.graded_slowdown:g}x slower from {self.graded_onset_s:g} s')
            + '."\n'
            f"duration_s = {self.deadline_s + 60:g}\n"
            f"rate_per_s = {self.rate_per_s / self.nodes:g}\n\n"
            f'[[models]]\nname = "{MODEL}"\np50_ms = {self.p50_ms:g}\nsigma = {self.sigma:g}\n\n'
            f'[nodes]\ncount = {self.nodes}\nhardware = "A100"\n\n'
            f'[[faults]]\nnode = "{self.slow_node}"\nkind = "slowdown"\nonset_s = {self.onset_s:g}\n{end}'
            f"factor = {self.slowdown:g}\n{graded}")


#: What ./scripts/demo runs: the slow node's story, then gpu-node-03 1.6x slower (the graded phase).
DEMO_PLAN = Plan(graded_node="gpu-node-03", graded_onset_s=175.0, graded_s=50.0, deadline_s=260.0)
#: The end-to-end test's plan: the same story with 1-s ticks, as short as the windows allow.
TEST_PLAN = Plan(tick_interval_s=1.0, confirm_windows=3, warmup_s=3.0, window_size=100, min_samples=50,
                 backoff_initial_s=8.0, rate_per_s=200.0, onset_s=20.0, degraded_s=10.0, interval_s=1.0,
                 refresh_s=1.0, settle_s=5.0, deadline_s=110.0)



def with_source(plan: Plan, source: str) -> Plan:
    """``plan`` told from ``source``. From /metrics, latencies are 600 ms (not 180 ms): vLLM's
    e2e buckets start at 0.3 s, so 180 ms and its 3x would sit in its first two buckets."""
    if source == plan.source:
        return plan
    return dataclasses.replace(plan, source=source, p50_ms=600.0 if source == "metrics" else Plan().p50_ms)


_WHY = {
    "tick_interval_s": "evaluate every {v:g} s instead of 30 s, so the story fits in a few minutes",
    "confirm_windows": "a node must look slow in {v} consecutive windows ({c:g} s here) before it is removed",
    "warmup_s": "simulated nodes need no CUDA/weights warm-up, so new nodes are judged after {v:g} s",
    "window_size": "{v} samples span ~{w:.0f} s of this traffic ({r:g} req/s per node); 1000 would span "
                   "{k:.0f} s, longer than the slowdown lasts",
    "min_samples": "a P99 needs at least this many samples",
    "max_sample_age_s": "samples older than 10 ticks are not judged, as 300 s is 10 ticks of 30 s",
    "probe_min_samples": "probe requests needed before a removed node is judged again",
    "backoff_initial_s": "a removed node gets no traffic for {v:g} s, then a {p:.0%} probe share "
                         "(shorter, so that re-admission fits in the run)",
    "backoff_max_s": "(cap of the growing back-off)",
}


def settings_lines(plan: Plan) -> list[str]:
    """What the screen says about the detector settings used, and why they differ from the defaults."""
    d, default = plan.detector(), DetectorSettings()
    per_node = plan.rate_per_s / plan.nodes
    span_s = plan.window_size / per_node
    lines = []
    for name in ("tick_interval_s", "confirm_windows", "warmup_s", "window_size", "min_samples",
                 "max_sample_age_s", "probe_min_samples", "backoff_initial_s"):
        v, dv = getattr(d, name), getattr(default, name)
        why = _WHY[name].format(v=v, c=plan.confirm_windows * plan.tick_interval_s, w=span_s, r=per_node,
                                k=1000 / per_node, p=plan.probe_share)
        mark = "  " if v == dv else "* "
        lines.append(f"  {mark}{name:<18} = {v:<6g} (default {dv:g}): {why}")
    return lines
