"""Whether a histogram model's buckets can resolve its P50: the first-bucket check.

Owns :func:`unresolved`: for one model's histogram peers (summaries carrying ``extra["hist"]``,
:mod:`tailguard.core.judge.hist_rules`), each metric on which most peers' P50 — or the P50 of
all peers' counts pooled — lies in the first bucket (below ``bounds_s[0]``), when no metric of
the model resolves it (one that does is judged: any metric abnormal is). There the buckets say
only "faster than the first bound": a slower node whose requests stay below it looks like its
peers, one a few times slower is seen only once it crosses the bound (docs/scrape.md,
"Resolution"). :func:`advice` is what the replay summary (:func:`summary_text`) and the
worker's log tell the operator of one such metric; the worker's gauge is
``tailguard_unresolved_first_bound_seconds``.

Guarantees: pure; it marks a model, it judges no node (the marked metrics' means are judged:
:mod:`tailguard.core.judge.hist_mean`, :mod:`tailguard.core.judge.hist_weights`); a metric whose
pairs carry no finite bounds (counters only) is never marked; metrics in sorted order, each
with the first bound most of its peers share (the smallest on a tie).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from tailguard.core.contract.types import WindowSummary
from tailguard.core.judge.hist_rules import windows_of


def unresolved(peers: Iterable[WindowSummary]) -> tuple[tuple[str, float], ...]:
    """``(metric, first bound in s)`` for each metric the buckets cannot resolve (module docstring)."""
    below: Counter[str] = Counter()       # peers whose P50 lies in the first bucket, by metric
    seen: Counter[str] = Counter()        # peers with bucket counts, by metric
    first: dict[str, int] = {}            # pooled first-bucket counts, by metric
    total: dict[str, int] = {}            # pooled observations, by metric
    bounds: dict[str, Counter[float]] = {}
    for s in peers:
        for metric, w in (windows_of(s) or {}).items():
            if not w.bounds_s:
                continue
            seen[metric] += 1
            below[metric] += 2 * w.counts[0] > w.observations
            first[metric] = first.get(metric, 0) + w.counts[0]
            total[metric] = total.get(metric, 0) + w.observations
            bounds.setdefault(metric, Counter())[w.bounds_s[0]] += 1
    out = []
    for metric in sorted(seen):
        if 2 * below[metric] > seen[metric] or 2 * first[metric] > total[metric]:
            common = bounds[metric].most_common()
            out.append((metric, min(b for b, n in common if n == common[0][1])))
    return tuple(out) if len(out) == len(seen) else ()    # another metric resolves it: judged there


def advice(model: str, metric: str, bound_s: float) -> str:
    """What to tell the operator about one unresolved metric of ``model``."""
    others = "/".join(m for m in ("e2e", "ttft", "itl") if m != metric)
    return (f"buckets cannot resolve model {model}'s {metric}: most requests below the first "
            f"bound {bound_s:g} s, so its nodes are judged on their mean per window only (a slower "
            f"tail under the bound is not seen); judge it on another metric ({others}) or give the "
            "server finer buckets")


def summary_text(found: Mapping[tuple[str, str], float]) -> str:
    """The replay summary's part for every ``(model, metric) -> first bound`` found: one
    :func:`advice` each, sorted, each after "; " ("" when none)."""
    return "".join("; " + advice(model, metric, b) for (model, metric), b in sorted(found.items()))
