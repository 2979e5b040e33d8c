"""Stage 2's state of one model, and its snapshot as plain data.

Owns :class:`ModelState`: the :class:`~app.core.health.PairState` of every
pair of the model, the slow baseline (see :mod:`app.core.baseline`), the
open fleet episodes (load event, baseline shift, error storm) and the
per-pair bookkeeping of the rules (onset credit, new-evidence clock, sample
rate, error counters, last sign of life of retired pairs), liveness and the
pairs' own P50 baselines.

Guarantees:

* ``ModelState.from_dict(s.to_dict())`` equals ``s``, and the dict is plain
  JSON (sorted keys where order is free), so equal states give equal
  snapshots and a restored evaluator produces the same future.
* A snapshot carries ``version`` (:data:`SNAPSHOT_VERSION`); any other
  version, or a snapshot missing a field, raises :class:`ValueError` naming
  the problem. There are no defaults for absent fields: a snapshot is
  either complete and current or refused.

Rationale: docs/rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from app.core.health import PairState
from app.core.liveness import Liveness
from app.core.own_history import OwnBaselines

SNAPSHOT_VERSION: Final = 2


@dataclass(slots=True)
class ModelState:
    pairs: dict[str, PairState] = field(default_factory=dict)
    baseline_p50: dict[str, float] = field(default_factory=dict)   # hardware class -> log p50
    baseline_ratio: float | None = None                          # log of the median ratio
    baseline_ts: float | None = None
    baseline_signal: str | None = None
    baseline_ticks: dict[str, int] = field(default_factory=dict)   # class -> updates so far
    load_event: bool = False
    shifted: bool = False
    error_storm: bool = False          # most routed pairs past max_error_share
    # Pairs whose relative severity at the last tick was in [ONSET_CREDIT_FRACTION, 1].
    elevated: dict[str, float] = field(default_factory=dict)
    # Per pair: the tick of the window that last advanced its abnormal streak, and the judged
    # sample rate (per s) last measured on a window not yet full (see rules.new_fraction).
    advanced_ts: dict[str, float] = field(default_factory=dict)
    rate_per_s: dict[str, float] = field(default_factory=dict)
    # Retired pairs: their last sign of life (sample or heartbeat; at least the retirement).
    retired_seen: dict[str, float] = field(default_factory=dict)
    # Per pair: stage 1's cumulative (requests, failed) at the last tick (rules.error_judgements).
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Last signs of life, gone pairs, restarts handled, telemetry loss (app.core.liveness).
    live: Liveness = field(default_factory=Liveness)
    # Per-pair P50 baselines: the reference below min_peers (app.core.own_history).
    own: OwnBaselines = field(default_factory=OwnBaselines)
    # The threshold stage 1 counts fresh samples above (rules.judge_fresh_tail): the peers'
    # P99 with a margin, in the signal's units; None without one (few peers, several classes).
    tail_ref: float | None = None

    def forget_pair(self, node: str) -> None:
        """Drop everything kept about ``node``."""
        self.pairs.pop(node, None)
        for d in (self.retired_seen, self.advanced_ts, self.rate_per_s, self.elevated,
                  self.counts):
            d.pop(node, None)
        self.live.drop(node)
        self.own.drop(node)

    def to_dict(self) -> dict[str, Any]:
        return {"version": SNAPSHOT_VERSION,
                "pairs": {n: p.to_dict() for n, p in sorted(self.pairs.items())},
                "baseline_p50": dict(sorted(self.baseline_p50.items())),
                "baseline_ratio": self.baseline_ratio, "baseline_ts": self.baseline_ts,
                "baseline_signal": self.baseline_signal,
                "baseline_ticks": dict(sorted(self.baseline_ticks.items())),
                "load_event": self.load_event, "shifted": self.shifted,
                "error_storm": self.error_storm,
                "elevated": dict(sorted(self.elevated.items())),
                "advanced_ts": dict(sorted(self.advanced_ts.items())),
                "rate_per_s": dict(sorted(self.rate_per_s.items())),
                "retired_seen": dict(sorted(self.retired_seen.items())),
                "counts": {n: list(c) for n, c in sorted(self.counts.items())},
                "live": self.live.to_dict(), "own": self.own.to_dict(), "tail_ref": self.tail_ref}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelState:
        check_version(d, "model state")
        try:
            return cls(
                pairs={n: PairState.from_dict(p) for n, p in d["pairs"].items()},
                baseline_p50={str(k): float(v) for k, v in d["baseline_p50"].items()},
                baseline_ratio=d["baseline_ratio"], baseline_ts=d["baseline_ts"],
                baseline_signal=d["baseline_signal"],
                baseline_ticks={str(k): int(v) for k, v in d["baseline_ticks"].items()},
                load_event=bool(d["load_event"]), shifted=bool(d["shifted"]),
                error_storm=bool(d["error_storm"]),
                elevated={str(k): float(v) for k, v in d["elevated"].items()},
                advanced_ts={str(k): float(v) for k, v in d["advanced_ts"].items()},
                rate_per_s={str(k): float(v) for k, v in d["rate_per_s"].items()},
                retired_seen={str(k): float(v) for k, v in d["retired_seen"].items()},
                counts={str(k): (int(v[0]), int(v[1])) for k, v in d["counts"].items()},
                live=Liveness.from_dict(d["live"]), own=OwnBaselines.from_dict(d["own"]),
                tail_ref=None if d["tail_ref"] is None else float(d["tail_ref"]))
        except KeyError as e:
            raise ValueError(f"model state snapshot (version {SNAPSHOT_VERSION}) lacks the "
                             f"field {e.args[0]!r}; cannot restore") from None
        except (TypeError, AttributeError, IndexError) as e:
            raise ValueError(f"model state snapshot (version {SNAPSHOT_VERSION}) is malformed "
                             f"({e}); cannot restore") from None


def check_version(data: Any, what: str) -> None:
    """Raise :class:`ValueError` unless ``data`` is a dict of the current snapshot version."""
    version = data.get("version") if isinstance(data, dict) else None
    if version != SNAPSHOT_VERSION:
        raise ValueError(f"{what} snapshot version {version!r} is not supported "
                         f"({SNAPSHOT_VERSION}); cannot restore")
