"""The demos: a slow node drags the cluster's P99 up, tailguard takes it out, then lets it back in.

``python -m tailguard.demo`` (or ``./scripts/demo``) runs the real system on 127.0.0.1 against
the Kafka and Redis of ``scripts/up``, as child processes: ``tailguard worker`` with short
ticks, ``tailguard simulate fleet`` (8 nodes reporting through the emitter SDK; ``gpu-node-05``
serves 3x slower for a while, later ``gpu-node-03`` 1.6x slower for good, which tailguard
weights down), ``tailguard proxy`` and ``tailguard simulate load`` (open-loop traffic measuring
the client-side cluster P99). It shows each node's state live, then reports the cluster P99
in each phase and draws ``out/demo.png``.

Modules, one job each: :mod:`~tailguard.demo.plan` (the timeline and settings),
:mod:`~tailguard.demo.stack` (names, environment, child processes, cleanup),
:mod:`~tailguard.demo.observe` (the live loop over Kafka, Redis and the load generator),
:mod:`~tailguard.demo.story` (observations → phases, pure), :mod:`~tailguard.demo.render`
(screen and report), :mod:`~tailguard.demo.plot` (PNG), ``__main__`` (the command line).
:mod:`~tailguard.demo.minimal` is the Kafka-free demo (``python -m tailguard.demo.minimal``).
"""

from tailguard.demo.observe import HealthFeed, observe, run_story
from tailguard.demo.plan import DEMO_PLAN, MODEL, ROOT, RUN_PREFIX, TEST_PLAN, DemoError, Plan, settings_lines
from tailguard.demo.plot import plot
from tailguard.demo.render import Screen, compact_line, render_report, render_table
from tailguard.demo.stack import Child, RunNames, Stack, child_env, running_stack
from tailguard.demo.story import (
    Graded,
    HealthChange,
    Interval,
    NodeView,
    Observations,
    Phase,
    Snapshot,
    Story,
    View,
    analyze,
    current_phase,
    load_run,
    save_run,
    story_done,
)

__all__ = [
    "DEMO_PLAN",
    "MODEL",
    "ROOT",
    "RUN_PREFIX",
    "TEST_PLAN",
    "Child",
    "DemoError",
    "Graded",
    "HealthChange",
    "HealthFeed",
    "Interval",
    "NodeView",
    "Observations",
    "Phase",
    "Plan",
    "RunNames",
    "Screen",
    "Snapshot",
    "Stack",
    "Story",
    "View",
    "analyze",
    "child_env",
    "compact_line",
    "current_phase",
    "load_run",
    "observe",
    "plot",
    "render_report",
    "render_table",
    "run_story",
    "running_stack",
    "save_run",
    "settings_lines",
    "story_done",
]
