"""The slow per-model baseline: where each hardware class's P50 (and the ratio) usually sit.

Owns the baseline kept in :class:`~tailguard.core.judge.model_state.ModelState` — an EWMA
in log space, half-life :data:`BASELINE_HALF_LIFE_S` of event time, of each
hardware class's median P50 and of the peers' median P99/P50 — its limits
(a node past them counts towards a load event, never towards its own
ejection), and the ``baseline_shift`` fleet event.

Guarantees: a baseline is in the units of one signal; a new signal starts a
new one. The shift event opens once per episode, when the fleet's median
movement (P50 / class baseline) passes :data:`BASELINE_SHIFT_FACTOR` either
way, and closes when back within :data:`BASELINE_CLEAR_FACTOR`; it is a
report only (it ejects and holds nobody). The baseline follows a lasting
shift, so a permanent change stops being an event after a few half-lives.

Rationale: docs/rules.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tailguard.core.contract.config import DetectorSettings
from tailguard.core.contract.types import FleetEvent
from tailguard.core.judge.model_state import ModelState
from tailguard.core.judge.peers import Peer, classes_of, hw_class, median, signal_of

BASELINE_HALF_LIFE_S = 600.0
# Below the factor the node rules use on purpose: the baseline takes in the onset tick
# (a window half old, half new) before the shift is measured.
BASELINE_SHIFT_FACTOR = 1.5
BASELINE_CLEAR_FACTOR = 1.25


def follow_signal(ms: ModelState, peers: Sequence[Peer]) -> None:
    """Start a new baseline when the peers' signal is not the baseline's."""
    signal = signal_of(peers)
    if peers and signal != ms.baseline_signal:
        ms.baseline_p50, ms.baseline_ratio, ms.baseline_ts = {}, None, None
        ms.baseline_ticks = {}
        ms.baseline_signal, ms.shifted = signal, False


def baseline_limits(ms: ModelState, st: DetectorSettings) -> tuple[dict[str, float], float]:
    """Per class, the P50 above which a node is off the model's slow baseline; the ratio too."""
    p50 = {c: st.relative_p50_factor * math.exp(b) for c, b in ms.baseline_p50.items()}
    ratio = (math.inf if ms.baseline_ratio is None else
             max(st.ratio_threshold, st.fleet_ratio_factor * math.exp(ms.baseline_ratio)))
    return p50, ratio


def baseline_fleet_p50(ms: ModelState) -> float | None:
    if not ms.baseline_p50:
        return None
    return math.exp(median(list(ms.baseline_p50.values())))


def baseline_shift(model: str, ms: ModelState, peers: Sequence[Peer], now_s: float,
                   abnormal: int, fleet_p50: float | None,
                   factor: float | None) -> FleetEvent | None:
    """The ``baseline_shift``/``baseline_shift_end`` event when the fleet's movement
    ``factor`` opens or closes an episode."""
    if factor is None:
        return None
    off = max(factor, 1.0 / factor)
    if not ms.shifted and off > BASELINE_SHIFT_FACTOR:
        ms.shifted = True
        kind = "baseline_shift"
        detail = f"fleet median P50 is {factor:.2f}x its baseline"
    elif ms.shifted and off < BASELINE_CLEAR_FACTOR:
        ms.shifted = False
        kind = "baseline_shift_end"
        detail = f"fleet median P50 back to {factor:.2f}x its baseline"
    else:
        return None
    return FleetEvent(ts=now_s, model=model, kind=kind, abnormal_nodes=abnormal,
                      judged_nodes=len(peers), fleet_p50=fleet_p50,
                      baseline_p50=baseline_fleet_p50(ms), signal=signal_of(peers),
                      detail=detail)


def update_baseline(ms: ModelState, peers: Sequence[Peer], now_s: float,
                    st: DetectorSettings) -> None:
    """Move the baseline towards this tick's class medians and median ratio."""
    if not peers:
        return
    classes: dict[str, list[float]] = {}
    one = classes_of(peers)
    if len(one) == 1:
        classes[one.pop()] = [p.p50 for p in peers]
    else:
        for p in peers:
            classes.setdefault(hw_class(p.summary.hardware), []).append(p.p50)
    fold_baseline(ms, {c: median(v) for c, v in classes.items()},
                  median([p.ratio for p in peers]), now_s, st)


def fold_baseline(ms: ModelState, class_p50: Mapping[str, float], ratio: float, now_s: float,
                  st: DetectorSettings) -> None:
    """:func:`update_baseline` given the peers' medians: P50 per class (``class_p50``) and
    P99/P50 (``ratio``), as :class:`~tailguard.core.judge.peers.PeerNorms` holds them."""
    dt = st.tick_interval_s if ms.baseline_ts is None else max(0.0, now_s - ms.baseline_ts)
    alpha = 1.0 - 0.5 ** (dt / BASELINE_HALF_LIFE_S)
    ms.baseline_ts = now_s
    for c, med in class_p50.items():
        cur = math.log(med)
        old = ms.baseline_p50.get(c)
        ms.baseline_p50[c] = cur if old is None else old + alpha * (cur - old)
        ms.baseline_ticks[c] = ms.baseline_ticks.get(c, 0) + 1
    cur_r = math.log(ratio)
    ms.baseline_ratio = cur_r if ms.baseline_ratio is None else (
        ms.baseline_ratio + alpha * (cur_r - ms.baseline_ratio))
