"""Each pair's own slow P50 baseline: the reference when a model has too few peers.

A model with fewer than ``min_peers`` judged pairs has no peer median to compare with.
:class:`OwnBaselines` keeps, per pair, an EWMA of its log window P50 (half-life
``HALF_LIFE_S`` of event time), fed only by healthy windows judged normal. With at least
two judged pairs, :func:`reference` gives a pair's P50 reference: its own baseline times
how much the *other* pairs moved since theirs (median of P50 / own baseline, leave-one-out),
once every baseline involved has ``MIN_TICKS`` updates behind it. A node that slows alone
is far above its reference; pairs that slow together move each other's reference and flag
nobody. Baselines are in the units of the model's signal: a new signal starts them over.

Pure data and arithmetic: no clock (``now_s`` is passed), plain-data snapshot;
:func:`judge_own` is the rule on top of it.
Rationale: docs/rules.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.core.contract.types import Reason, WindowSummary
from tailguard.core.judge.health import Evidence, Judgement, Verdict
from tailguard.core.judge.peers import median

HALF_LIFE_S = 600.0
MIN_TICKS = 4


@dataclass(slots=True)
class OwnBaselines:
    log_p50: dict[str, float] = field(default_factory=dict)
    ticks: dict[str, int] = field(default_factory=dict)
    ts: dict[str, float] = field(default_factory=dict)

    def drop(self, node: str) -> None:
        for d in (self.log_p50, self.ticks, self.ts):
            d.pop(node, None)

    def clear(self) -> None:
        self.log_p50.clear()
        self.ticks.clear()
        self.ts.clear()

    def update(self, node: str, p50: float, now_s: float, default_dt_s: float) -> None:
        """Fold one normal window's P50 into ``node``'s baseline."""
        cur = math.log(p50)
        old = self.log_p50.get(node)
        last = self.ts.get(node)
        dt = default_dt_s if last is None else max(0.0, now_s - last)
        alpha = 1.0 - 0.5 ** (dt / HALF_LIFE_S)
        self.log_p50[node] = cur if old is None else old + alpha * (cur - old)
        self.ticks[node] = self.ticks.get(node, 0) + 1
        self.ts[node] = now_s

    def ready(self, node: str) -> bool:
        return self.ticks.get(node, 0) >= MIN_TICKS

    def reference(self, node: str, p50s: Mapping[str, float]) -> tuple[float, float] | None:
        """``(reference P50, movement of the others)`` for ``node`` given every judged pair's
        current P50 (``p50s``, ``node`` included); None without ready baselines."""
        if not self.ready(node):
            return None
        moved = [p / math.exp(self.log_p50[n]) for n, p in p50s.items() if n != node and self.ready(n)]
        if not moved:
            return None
        m = median(moved)
        return math.exp(self.log_p50[node]) * m, m

    def to_dict(self) -> dict[str, Any]:
        return {"log_p50": dict(sorted(self.log_p50.items())), "ticks": dict(sorted(self.ticks.items())),
                "ts": dict(sorted(self.ts.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OwnBaselines:
        return cls({str(k): float(v) for k, v in d["log_p50"].items()},
                   {str(k): int(v) for k, v in d["ticks"].items()},
                   {str(k): float(v) for k, v in d["ts"].items()})


def judge_own(base: OwnBaselines, s: WindowSummary, p50: float, ratio: float,
              p50s: Mapping[str, float], factor: float) -> Judgement | None:
    """Abnormal (``relative_p50``) when ``p50`` is above ``factor ×`` the pair's own baseline
    moved as the other pairs moved (:meth:`OwnBaselines.reference`); else None."""
    ref = base.reference(s.node_id, p50s)
    if ref is None:
        return None
    r, moved = ref
    limit = factor * r
    if p50 <= limit:
        return None
    ev = Evidence(signal=s.signal, p50=p50, p99=p50 * ratio, ratio=ratio, samples=s.samples,
                  peers_p50=r, latency_p50_us=s.latency_p50_us, latency_p99_us=s.latency_p99_us,
                  hardware=s.hardware)
    return Judgement(Verdict.ABNORMAL, Reason.RELATIVE_P50.value, ev, p50 / limit,
                     f"p50 {p50:.1f} > {factor:g} x its own baseline moved as the other nodes "
                     f"moved (x{moved:.2f}): {r:.1f}")

