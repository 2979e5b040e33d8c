"""What the demo prints: the live screen and the final report (text only).

:class:`Screen` redraws a node table on a terminal (state, routed, P50, P99,
P99/P50, samples, requests per interval, the latest health changes) and
prints one compact line per refresh otherwise (a log file, CI).
:func:`render_report` turns a :class:`~tailguard.demo.story.Story` into the
report: the cluster P99 of each phase and its ratio to the all-healthy
phase, when and why the slow node was removed and re-admitted, failed probe
rounds, the graded phase (a node weighted down: the P99 before and after),
warnings (another node removed, the node removed again after it recovered)
and ``result: ok`` or ``INCOMPLETE``. Pure formatting: no I/O
beyond writing to the given stream.
"""

from __future__ import annotations

import math
import time
from typing import TextIO

from tailguard.demo.plan import MODEL, Plan
from tailguard.demo.story import Graded, NodeView, Phase, Story, View
from tailguard.text import printable


def _f(x: float | None, fmt: str = ".0f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def render_table(plan: Plan, view: View) -> list[str]:
    """The node table and the latest client-side numbers."""
    out = [f"t = {view.t_s:5.1f} s   {view.phase}"]
    if view.last is not None:
        out.append(f"cluster (client-side, last {plan.interval_s:g} s): P50 {_f(view.last.p50_ms)} ms, "
                   f"P99 {_f(view.last.p99_ms)} ms, {view.last.completed} requests, {view.last.errors} errors")
    out.append(f"{'node':<13}{'state':<13}{'routed':<8}{'P50 ms':>8}{'P99 ms':>8}{'P99/P50':>9}{'samples':>9}"
               f"{'req/interval':>14}")
    snap = view.snapshot
    for n in plan.node_ids:
        v = snap.nodes.get(n) if snap is not None else None
        served = view.last.by_node.get(n, 0) if view.last is not None else 0
        if v is None:
            out.append(f"{n:<13}{'(not yet)':<13}{'-':<8}{'-':>8}{'-':>8}{'-':>9}{'-':>9}{served:>14}")
            continue
        routed = "yes" if snap is not None and n in snap.routing else "NO"
        if routed == "yes" and v.weight is not None and v.weight < 1.0:
            routed = f"w {v.weight:g}"
        mark = " <" if n in (plan.slow_node, plan.graded_node) else ""
        out.append(f"{n:<13}{v.state:<13}{routed:<8}{_f(v.p50_ms):>8}{_f(v.p99_ms):>8}{_f(v.ratio, '.2f'):>9}"
                   f"{v.samples:>9}{served:>14}{mark}")
    return out


def _out(state: str, routed: bool) -> str:
    """The mark of a node not in the routing set: taken out, or new and not admitted yet."""
    if routed:
        return ""
    return " (not admitted yet)" if state == "warming" else " (out)"


def compact_line(plan: Plan, view: View) -> str:
    """One line per refresh when stdout is not a terminal: nodes grouped by state, the slow node in full."""
    snap = view.snapshot
    parts = [f"t={view.t_s:5.1f}s", f"cluster P99 {_f(view.last.p99_ms if view.last else None)} ms"]
    if snap is None:
        return " | ".join([*parts, "no node statuses in Redis yet"])
    parts.append(f"routed {len(snap.routing)}/{plan.nodes}")
    groups: dict[str, list[NodeView]] = {}
    for n, v in sorted(snap.nodes.items()):
        if n != plan.slow_node:
            groups.setdefault(v.state + _out(v.state, n in snap.routing), []).append(v)
    for state, views in groups.items():
        p50s = [v.p50_ms for v in views if v.p50_ms is not None]
        rng = f" (P50 {min(p50s):.0f}-{max(p50s):.0f} ms)" if p50s else ""
        parts.append(f"{len(views)} {state}{rng}")
    slow = snap.nodes.get(plan.slow_node)
    if slow is not None:
        parts.append(f"{plan.slow_node}: {slow.state}{_out(slow.state, plan.slow_node in snap.routing)} "
                     f"P50 {_f(slow.p50_ms)} P99 {_f(slow.p99_ms)} ms ratio {_f(slow.ratio, '.2f')}")
    graded = snap.nodes.get(plan.graded_node) if plan.graded_node is not None else None
    if graded is not None and graded.weight is not None and graded.weight < 1.0:
        parts.append(f"{plan.graded_node}: weight {graded.weight:g}")
    return " | ".join(parts)


class Screen:
    """Live output: a redrawn table on a terminal, compact lines otherwise."""

    def __init__(self, plan: Plan, out: TextIO) -> None:
        self.plan, self.out = plan, out
        self.tty = out.isatty()
        self.log: list[str] = []
        self._shown_changes = 0

    def progress(self, msg: str) -> None:
        line = f"[demo {time.strftime('%H:%M:%S')}] {msg}"
        self.log.append(line)
        print(line, file=self.out, flush=True)

    def show(self, view: View) -> None:
        new = view.changes[self._shown_changes:]
        self._shown_changes = len(view.changes)
        if not self.tty:
            print(compact_line(self.plan, view), file=self.out)
            for c in new:
                print(f"  health change: {c.describe()}", file=self.out)
            self.out.flush()
            return
        pl = self.plan
        lines = [f"tailguard demo — one slow node among {pl.nodes} (Ctrl-C stops and cleans up)",
                 f"short-tick settings: tick {pl.tick_interval_s:g} s (default 30), confirm_windows "
                 f"{pl.confirm_windows}, warm-up {pl.warmup_s:g} s, window {pl.window_size} samples, "
                 f"back-off {pl.backoff_initial_s:g} s (why: see the lines printed before this table)", ""]
        lines += render_table(self.plan, view)
        lines += ["", "health changes (topic node-health-changes):"]
        lines += [f"  {c.describe()}" for c in view.changes[-8:]] or ["  (none yet)"]
        lines += ["", *self.log[-3:]]
        self.out.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        self.out.flush()


# --------------------------------------------------------------------------- report


def _phase_line(p: Phase, healthy: Phase | None = None) -> str:
    if p.p99_ms is None:
        return f"  {p.label + ':':<44} (not measured)"
    rel = ""
    if healthy is not None and healthy.p99_ms:
        rel = f"  = {p.p99_ms / healthy.p99_ms:.2f}x healthy"
    return (f"  {p.label + ':':<44} P99 {p.p99_ms:6.0f} ms  (P50 {_f(p.p50_ms)} ms; t={p.t0_s:.0f}-{p.t1_s:.0f}s, "
            f"{p.requests} requests){rel}")


def _graded_lines(plan: Plan, g: Graded, healthy: Phase) -> list[str]:
    lines = ["", f"graded: {g.node} serves every request {plan.graded_slowdown:g}x slower from "
                 f"t={plan.graded_onset_s:g}s on, below the ejection rules:",
             _phase_line(g.full, healthy), _phase_line(g.weighted, healthy)]
    if g.weighted_s is not None and g.settled_s is not None:
        lines.append(f"  weighted down from t={g.weighted_s:.1f}s ({g.weighted_s - plan.graded_onset_s:.1f} s after "
                     f"it slowed down), to {_f(g.weight, 'g')} at t={g.settled_s:.1f}s; "
                     + ("taken out later (see the warning below)." if g.left_routing else "never out of routing."))
    if g.full_share is not None and g.weighted_share is not None:
        lines.append(f"  its share of the requests: {g.full_share:.1%} at full weight (1/{plan.nodes} = "
                     f"{1 / plan.nodes:.1%}), {g.weighted_share:.1%} weighted down.")
    elif g.weighted_s is None:
        lines.append(f"  {g.node} was NOT weighted down before the run ended"
                     + (" (it was taken out)." if g.left_routing else "."))
    else:
        lines.append(f"  the run ended before {g.node}'s requests at its final weight were measured.")
    if g.full.p99_ms and g.weighted.p99_ms:
        lines.append(f"  cluster P99 {g.full.p99_ms:.0f} ms at full weight, {g.weighted.p99_ms:.0f} ms weighted "
                     f"down ({g.weighted.p99_ms / g.full.p99_ms:.2f}x).")
    return lines


def render_report(s: Story) -> str:
    plan = s.plan
    lines = ["", "=" * 78, "tailguard demo — the weak-link effect and its cure, in numbers", "=" * 78,
             f"{plan.nodes} nodes serving {MODEL} (P50 {plan.p50_ms:g} ms), round-robin by the reference proxy, "
             f"{plan.rate_per_s:g} req/s;",
             f"{plan.slow_node} serves every request {plan.slowdown:g}x slower from t={plan.onset_s:g}s"
             + ("" if plan.end_s is None else f" to t={plan.end_s:g}s") + f"; tick {plan.tick_interval_s:g} s.",
             "", "cluster latency, client-side (median of the load generator's "
             f"{plan.interval_s:g}-s interval P99s in each phase):",
             _phase_line(s.healthy), _phase_line(s.degraded, s.healthy), _phase_line(s.removed, s.healthy)]
    if plan.end_s is not None:
        lines.append(_phase_line(s.readmitted, s.healthy))
    lines.append("")
    if s.removal is not None and s.removed_s is not None:
        r = s.removal
        lines.append(f"removed: {plan.slow_node} left the routing set at t={s.removed_s:.1f}s, "
                     f"{s.removed_s - plan.onset_s:.1f} s after it slowed down"
                     + (f" (suspect from t={s.suspect_s:.1f}s)" if s.suspect_s is not None else "") + ".")
        lines.append(f"  why: {r.reason}" + (f" — {r.detail}" if r.detail else ""))
        lines.append(f"  health change: {r.describe()}")
        if s.obs.explain:
            lines.append(f"  `tailguard explain {plan.slow_node}` when it was out:")
            lines += ["    " + line for line in s.obs.explain.splitlines()]
    else:
        lines.append(f"removed: {plan.slow_node} was NOT removed before the run ended.")
    if plan.end_s is not None:
        if s.readmission is not None and s.readmitted_s is not None:
            lines.append(f"re-admitted: at t={s.readmitted_s:.1f}s ({s.readmitted_s - plan.end_s:.1f} s after it "
                         f"recovered; probes from t={_f(s.probe_after_s, '.1f')}s), reason {s.readmission.reason}.")
        for c in s.probe_failures:
            why = (c.detail or c.reason).split(";")[0]
            lines.append(f"  probe round failed at t={c.t_s:.1f}s ({why}: P50 {_f(c.p50_ms)} ms, "
                         f"P99 {_f(c.p99_ms)} ms, P99/P50 {_f(c.ratio, '.2f')}); the back-off doubled")
        if not (s.readmission is not None and s.readmitted_s is not None):
            lines.append(f"re-admitted: NO — {plan.slow_node} was not back in the routing set when the run ended.")
    wl, cure = s.weak_link_factor, s.cured_factor
    if wl is not None and cure is not None:
        lines.append("")
        lines.append(f"weak link: one slow node of {plan.nodes} (1/{plan.nodes} of the traffic) took the cluster P99 "
                     f"to {wl:.2f}x; after removal it is {cure:.2f}x the all-healthy P99.")
    if s.graded is not None:
        lines += _graded_lines(plan, s.graded, s.healthy)
    if s.reejected_s is not None:
        lines.append(f"WARNING: {plan.slow_node} was removed again at t={s.reejected_s:.1f}s, after it had recovered")
    if s.others_removed:
        lines.append(f"WARNING: other nodes left the routing set too: {', '.join(map(printable, s.others_removed))}")
    if s.errors:
        lines.append(f"client errors: {s.errors}")
    if s.obs.page_url:
        lines.append(f"status page (served by the worker while it ran): {s.obs.page_url}")
    lines.append(f"result: {'ok' if s.complete else 'INCOMPLETE (see above)'}")
    return "\n".join(lines)
