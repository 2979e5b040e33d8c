"""The demo's picture: cluster P99 over time with the slow node's state changes marked (PNG).

Top panel: the client-side cluster P99 and P50 per load-generator interval,
each phase's P99 as a dashed line with its value, the degraded stretch
shaded. Bottom panel: the nodes' P50 as tailguard saw it (the other nodes'
min-max band and median, the slow node while routed), with a vertical line
at each of the slow node's health changes. matplotlib is imported only when
a plot is drawn (the ``plot`` extra, included in ``dev``), with the Agg
backend, so no display is needed.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from tailguard.demo.story import Story

_STATE_COLORS = {"suspect": "#e6a700", "unhealthy": "#d62728", "quarantined": "#9467bd", "healthy": "#2ca02c",
                 "retired": "#000000"}


def plot(s: Story, path: Path) -> None:
    """Cluster P99 over time with the slow node's state changes marked (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan, obs = s.plan, s.obs
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, height_ratios=(3, 2))
    ivs = [iv for iv in obs.intervals if iv.p99_ms is not None]
    xs = [(iv.t0_s + iv.t1_s) / 2 for iv in ivs]
    ax.plot(xs, [iv.p99_ms for iv in ivs], "-o", ms=3, color="#1f77b4",
            label=f"cluster P99, client-side ({plan.interval_s:g}-s intervals)")
    ax.plot(xs, [iv.p50_ms for iv in ivs], "-", lw=1, color="#7fb3e0", label="cluster P50, client-side")
    for p in (s.healthy, s.degraded, s.removed, s.readmitted):
        if p.p99_ms is None:
            continue
        color = "#d62728" if p is s.degraded else "#333333"
        ax.hlines(p.p99_ms, p.t0_s, p.t1_s, colors=color, linestyles="--", lw=1.5)
        ax.annotate(f"{p.p99_ms:.0f} ms", ((p.t0_s + p.t1_s) / 2, p.p99_ms), textcoords="offset points",
                    xytext=(0, 7), ha="center", color=color, fontsize=9, fontweight="bold",
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.plot([], [], "--", color="#333333", lw=1.5, label="phase P99 (median of intervals)")
    last_s = max([iv.t1_s for iv in ivs] + [plan.onset_s + 1])
    deg_end = plan.end_s if plan.end_s is not None else last_s
    out_end = s.readmitted_s if s.readmitted_s is not None else last_s
    for a in (ax, ax2):
        a.axvspan(plan.onset_s, deg_end, color="#d62728", alpha=0.08, lw=0)
        if s.removed_s is not None:
            a.axvspan(s.removed_s, out_end, ymin=0, ymax=0.06, color="#9467bd", alpha=0.5, lw=0)
    ax.text(plan.onset_s, 0.995, f" {plan.slow_node} {plan.slowdown:g}x slower", transform=ax.get_xaxis_transform(),
            va="top", fontsize=9, color="#d62728")
    if s.removed_s is not None:
        ax.text(s.removed_s, 0.07, f" {plan.slow_node} out of routing", transform=ax.get_xaxis_transform(),
                va="bottom", fontsize=8, color="#9467bd")
    marks = [c for c in obs.changes if c.node_id == plan.slow_node and c.t_s >= plan.onset_s]
    for i, c in enumerate(marks):
        color = _STATE_COLORS.get(c.to_state, "gray")
        for a in (ax, ax2):
            a.axvline(c.t_s, color=color, lw=1.2, ls=":")
        label = c.to_state if c.routed or c.to_state != "unhealthy" else "unhealthy: removed"
        if c.reason == "probe_failed":
            label = "probe round failed"
        elif c.reason == "probe_passed":
            label = "healthy: re-admitted"
        ax2.text(c.t_s, 0.97 - 0.16 * (i % 3), f" {label}", transform=ax2.get_xaxis_transform(), va="top",
                 fontsize=8, color=color)
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0, top=max([iv.p99_ms or 0.0 for iv in ivs] + [100.0]) * 1.12)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"tailguard demo: {plan.nodes} nodes behind a round-robin proxy, one {plan.slowdown:g}x slower "
                 f"(tick {plan.tick_interval_s:g} s)")
    slow_snaps = [sn for sn in obs.snapshots
                  if plan.slow_node in sn.nodes and sn.nodes[plan.slow_node].p50_ms is not None]
    slow_pts = [(sn.t_s, sn.nodes[plan.slow_node].p50_ms) for sn in slow_snaps]
    band = []
    for sn in obs.snapshots:
        vals = [v.p50_ms for n, v in sn.nodes.items() if n != plan.slow_node and v.p50_ms is not None]
        if vals:
            band.append((sn.t_s, min(vals), statistics.median(vals), max(vals)))
    if band:
        ax2.fill_between([b[0] for b in band], [b[1] for b in band], [b[3] for b in band], step="post",
                         color="#999999", alpha=0.35, lw=0, label="other nodes (min-max)")
        ax2.plot([b[0] for b in band], [b[2] for b in band], color="#777777", lw=1, drawstyle="steps-post",
                 label="other nodes (median)")
    if slow_pts:
        # Only while routed: out of routing, its numbers describe a quarantine window, not served traffic.
        routed_y = [y if plan.slow_node in sn.routing else math.nan
                    for (_, y), sn in zip(slow_pts, slow_snaps, strict=True)]
        ax2.plot([p[0] for p in slow_pts], routed_y, color="#d62728", lw=2, drawstyle="steps-post",
                 label=f"{plan.slow_node} (while routed)")
    ax2.set_ylabel("node P50 in tailguard (ms)")
    ax2.set_xlabel("time since the simulated fleet started (s)")
    tops = [y for _, y in slow_pts if y is not None] + [b[3] for b in band] + [100.0]
    ax2.set_ylim(bottom=0, top=max(tops) * 1.2)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
