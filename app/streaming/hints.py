"""Stage 2's hints for every stage 1: one value per model in the hints table, and its reading.

Each model's stage-2 owner writes the model's hints (:func:`encode_hints`) to the hints table;
every worker's stage 1 reads all models' hints (:func:`decode_hints`, through
:mod:`tailguard.streaming.hints_feed`) into one :class:`StageHints` per tick: from when each
series' samples are judged (``judge_since``), the series left out of the fleet-wide
``normalized`` fit (``out_of_fit``), each model's fresh-tail threshold (``tail_ref``) and its
signal (``signal``, :class:`~tailguard.core.window.signals.ModelChoice`).

Guarantees:

* :func:`decode_hints` reads the current form and the older bare ``{node: since_ts}`` (a
  changelog may still hold it). A part of a value that does not decode is skipped and
  logged; the model's other parts are kept.
* Values may be packed (:mod:`tailguard.streaming.table_values`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from tailguard.core.window.signals import ModelChoice
from tailguard.streaming.table_values import unpack_value

__all__ = ["StageHints", "decode_hints", "encode_hints"]

SeriesKey: TypeAlias = tuple[str, str]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StageHints:
    """What stage 2 tells every stage 1 (per (node, model)): see the module docstring."""

    judge_since: dict[SeriesKey, float] = field(default_factory=dict)
    out_of_fit: frozenset[SeriesKey] = frozenset()
    tail_refs: dict[str, float] = field(default_factory=dict)   # model -> fresh-tail threshold
    signals: dict[str, ModelChoice] = field(default_factory=dict)   # model -> its signal


def encode_hints(judge_since: Mapping[str, float], out_of_fit: Iterable[str],
                 tail_ref: float | None = None, signal: ModelChoice | None = None) -> dict[str, Any]:
    """One model's hints table value: ``{"judge_since": {node: ts}, "out_of_fit": [node, …],
    "tail_ref": threshold or null, "signal": ModelChoice.to_dict() or null}``
    (``FleetEvaluator.tail_ref``: stage 1 counts each series' fresh samples above it;
    ``signal``: the model's signal for every stage 1, :mod:`tailguard.core.judge.signal_choice`)."""
    return {"judge_since": dict(judge_since), "out_of_fit": sorted(out_of_fit), "tail_ref": tail_ref,
            "signal": None if signal is None else signal.to_dict()}


def decode_hints(items: Iterable[tuple[Any, Any]]) -> StageHints:
    """All models' hints from ``(key, value)`` pairs of the hints table.

    Accepts the current value (:func:`encode_hints`) and the older bare
    ``{node: since_ts}`` (no ``out_of_fit``), as a changelog may still hold it.
    """
    since: dict[SeriesKey, float] = {}
    unfit: set[SeriesKey] = set()
    refs: dict[str, float] = {}
    signals: dict[str, ModelChoice] = {}
    for key, value in items:
        model = key.decode() if isinstance(key, bytes) else str(key)
        try:
            value = unpack_value(value)
        except ValueError as e:
            log.warning("the hints of model %r are skipped: %s", model, e)
            continue
        if not isinstance(value, Mapping):
            continue
        ref = value.get("tail_ref")
        if isinstance(ref, int | float) and not isinstance(ref, bool) and ref > 0:
            refs[model] = float(ref)
        choice = value.get("signal")
        if isinstance(choice, Mapping):
            try:
                signals[model] = ModelChoice.from_dict(choice)
            except ValueError as e:     # stage 1 keeps its own choice for the model
                log.warning("the signal hint of model %r is skipped: %s", model, e)
        js = value.get("judge_since")
        if isinstance(js, Mapping):   # current form (an old-form node's value is a number)
            unfit.update((str(node), model) for node in value.get("out_of_fit") or ())
        else:
            js = value
        for node, ts in js.items():
            since[(str(node), model)] = float(ts)
    return StageHints(since, frozenset(unfit), refs, signals)
