"""Per-node rule statistics against their limits, for ``tailguard explain`` and the page.

:func:`rule_stats` takes one model's tick at the stage-2 edge — the window summaries the core
judged, the statuses it returned, the detector settings — and gives, per node, each rule's
statistic next to the limit it is held to: ``p50`` (the window's P50 of ``signal``, against
``relative_p50_factor`` × the peers' median P50), ``fresh_p50`` (the last tick's samples,
against the same factor × the peers' median fresh P50), ``p99`` (against
``relative_p99_factor`` × the peers' median P99), ``ratio`` (P99 / P50, against
max(``ratio_threshold``, ``fleet_ratio_factor`` × the peers' median ratio)) and ``err`` (the
failed share since the previous tick, from stage 1's cumulative counters, against
max(``max_error_share``, ``error_share_peer_factor`` × the peers' median share)). The table,
and how ``tailguard explain`` shows it: docs/operating.md.

Guarantees: peers are the model's routed, non-warming nodes with ``min_samples`` judged
samples, as in the core; below ``min_peers`` of them the relative limits are ``None`` (the
rule does not apply). These are the fleet-wide forms of the core's limits (with several
hardware classes, or the tail limit's allowance for the peers' spread, a shown limit is a
lower bound); the verdict itself (state, reason) is always the core's. Pure: no clock, no
I/O; the previous counters are passed in and the new ones returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import HealthState, NodeStatus, WindowSummary
from tailguard.core.judge.peers import median

Counts = dict[str, tuple[int, int]]   # node -> (requests_total, failed_total)


@dataclass(frozen=True, slots=True)
class Stat:
    """One rule's statistic and its limit (None: no data / the rule does not apply)."""

    value: float | None
    limit: float | None

    @property
    def over(self) -> bool:
        return self.value is not None and self.limit is not None and self.value > self.limit

    def to_list(self) -> list[float | None]:
        return [sig4(self.value), sig4(self.limit)]


def sig4(x: float | None) -> float | None:
    """``x`` to 4 significant digits (what explain shows; a third of the bytes in Redis)."""
    return None if x is None else float(f"{x:.4g}")


def _ref(values: list[float], settings: DetectorSettings, factor: float) -> float | None:
    return factor * median(values) if len(values) >= settings.min_peers else None


def rule_stats(summaries: Iterable[WindowSummary], statuses: Iterable[NodeStatus],
               settings: DetectorSettings, prev_counts: Mapping[str, tuple[int, int]],
               ) -> tuple[dict[str, dict[str, Stat]], Counts]:
    """``({node: {rule: Stat}}, new counters)`` for one model's tick (see the module docstring)."""
    by_node = {s.node_id: s for s in summaries}
    routed = {s.node_id for s in statuses
              if s.routed and s.state is not HealthState.WARMING}
    peers = [s for n, s in by_node.items() if n in routed and s.samples >= settings.min_samples
             and s.p50 is not None and s.p99 is not None and s.p50 > 0]
    factor = settings.relative_p50_factor
    p50_lim = _ref([s.p50 for s in peers if s.p50 is not None], settings, factor)
    p99_lim = _ref([s.p99 for s in peers if s.p99 is not None], settings,
                   settings.relative_p99_factor)
    fresh_lim = _ref([s.fresh_p50 for s in peers if s.fresh_p50 is not None], settings, factor)
    ratios = [s.p99 / s.p50 for s in peers if s.p50 and s.p99 is not None]
    ratio_lim = settings.ratio_threshold
    if len(ratios) >= settings.min_peers:
        ratio_lim = max(ratio_lim, settings.fleet_ratio_factor * median(ratios))
    counts: Counts = {}
    shares: dict[str, float] = {}
    for node, s in by_node.items():
        if s.requests_total or s.failed_total:
            counts[node] = (s.requests_total, s.failed_total)
            before = prev_counts.get(node)
            if before is not None:
                n, failed = s.requests_total - before[0], s.failed_total - before[1]
                if n >= settings.min_samples and 0 <= failed <= n:
                    shares[node] = failed / n
    err_lim = settings.max_error_share if settings.max_error_share > 0 else None
    peer_shares = [sh for node, sh in shares.items() if node in routed]
    if err_lim is not None and len(peer_shares) >= settings.min_peers:
        err_lim = max(err_lim, settings.error_share_peer_factor * median(peer_shares))
    out: dict[str, dict[str, Stat]] = {}
    for node, s in by_node.items():
        share = shares.get(node)
        judged = s.samples >= settings.min_samples
        out[node] = {
            "p50": Stat(s.p50 if judged else None, p50_lim),
            "fresh_p50": Stat(s.fresh_p50, fresh_lim),
            "p99": Stat(s.p99 if judged else None, p99_lim),
            "ratio": Stat(s.ratio if judged else None, ratio_lim),
            "err": Stat(share, err_lim),
        }
    return out, counts


def stats_dict(stats: Mapping[str, Stat]) -> dict[str, Any]:
    """``{rule: [value, limit]}`` (4 significant digits) for JSON."""
    return {k: v.to_list() for k, v in stats.items()}
