"""Stage 2's hints for every stage 1: one value per model in the hints table, and its reading.

Each model's stage-2 owner writes the model's hints (:func:`encode_hints`) to the hints table;
every worker's stage 1 reads all models' hints (:func:`decode_hints`, through
:mod:`tailguard.streaming.hints_feed`) into one :class:`StageHints` per tick: from when each
series' samples are judged (``judge_since``), the series left out of the fleet-wide
``normalized`` fit (``out_of_fit``), each model's fresh-tail threshold (``tail_ref``) and its
signal (``signal``, :class:`~tailguard.core.window.signals.ModelChoice`).

Guarantees:

* :func:`decode_hints` reads the current form and the older bare ``{node: since_ts}`` (a
  changelog may still hold it), packed or not (:mod:`tailguard.streaming.table_values`). A
  part of a value that does not decode is skipped, logged and reported by reason
  (:data:`BAD_HINT_REASONS`); the model's other parts are kept.
* :func:`hints_changed` says when a model's value is worth writing again: any part changed,
  the ``normalized`` fit only beyond :data:`FIT_REWRITE_TOLERANCE` of its expected latency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import numpy as np

from tailguard.core.window.signals import ModelChoice, fit_from_dict
from tailguard.streaming.table_values import unpack_value

__all__ = ["BAD_HINT_REASONS", "FIT_REWRITE_TOLERANCE", "WHOLLY_BAD", "StageHints", "decode_hints",
           "encode_hints", "hints_changed"]

SeriesKey: TypeAlias = tuple[str, str]

log = logging.getLogger(__name__)

#: Why a hints value, or a part of it, was skipped (``tailguard_bad_hints_total{reason}``):
#: ``not_json`` (the changelog record, :mod:`tailguard.streaming.hints_feed`), ``packed`` (a
#: packed value that does not unpack), ``not_object``, ``signal``, ``judge_since``.
BAD_HINT_REASONS: Final = ("not_json", "packed", "not_object", "signal", "judge_since")
#: See :func:`hints_changed`.
FIT_REWRITE_TOLERANCE: Final = 0.02
_REF_OUTPUT_TOKENS: Final = np.repeat([1.0, 16.0, 128.0, 1024.0], 2)
_REF_INPUT_TOKENS: Final = np.tile([0.0, 1024.0], 4)
#: The reasons that leave nothing of a value to use.
WHOLLY_BAD: Final = frozenset({"not_json", "packed", "not_object"})
_CURRENT_KEYS: Final = frozenset({"judge_since", "out_of_fit", "tail_ref", "signal"})


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


def hints_changed(written: Mapping[str, Any] | None, value: Mapping[str, Any],
                  rel_tol: float = FIT_REWRITE_TOLERANCE) -> bool:
    """Whether ``value`` (:func:`encode_hints`) tells stage 1 something ``written`` (the model's
    value last written, None if none) does not: any part differs, but the ``normalized`` fit
    only when its expected latency moved by more than ``rel_tol`` of it at some reference
    request size (1 to 1,024 output tokens, 0 or 1,024 input tokens). The fit follows every
    sample of the sliding windows, so otherwise a normalized model's hints would be rewritten
    (and read by every worker) each tick for changes far below what a verdict can notice."""
    if written is None:
        return True
    if written == value:
        return False
    old, new = written.get("signal"), value.get("signal")
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)) \
            or {**written, "signal": None} != {**value, "signal": None} \
            or {**old, "fit": None} != {**new, "fit": None}:
        return True
    fa, fb = old.get("fit"), new.get("fit")
    if not (isinstance(fa, Mapping) and isinstance(fb, Mapping)):
        return True
    try:
        ea = fit_from_dict(fa).expected_us(_REF_OUTPUT_TOKENS, _REF_INPUT_TOKENS)
        eb = fit_from_dict(fb).expected_us(_REF_OUTPUT_TOKENS, _REF_INPUT_TOKENS)
    except ValueError:      # not a fit stage 1 can read: nothing to compare, write it
        return True
    return not bool(np.all(np.abs(eb - ea) <= rel_tol * ea))


def decode_hints(items: Iterable[tuple[Any, Any]], on_bad: Callable[[str], None] | None = None) -> StageHints:
    """All models' hints from ``(key, value)`` pairs of the hints table.

    Accepts the current value (:func:`encode_hints`) and the older bare
    ``{node: since_ts}`` (no ``out_of_fit``), as a changelog may still hold it. What does not
    decode is logged and skipped, and its reason (:data:`BAD_HINT_REASONS`) given to
    ``on_bad``: a whole value (``packed``, ``not_object``) or one part of it (``signal``,
    ``judge_since``: the entries that are not numbers); the value's other parts are kept.
    """
    since: dict[SeriesKey, float] = {}
    unfit: set[SeriesKey] = set()
    refs: dict[str, float] = {}
    signals: dict[str, ModelChoice] = {}
    bad = on_bad if on_bad is not None else _ignore
    for key, value in items:
        model = key.decode() if isinstance(key, bytes) else str(key)
        try:
            value = unpack_value(value)
        except ValueError as e:
            log.warning("the hints of model %r are skipped: %s", model, e)
            bad("packed")
            continue
        if not isinstance(value, Mapping):
            log.warning("the hints of model %r are skipped: a %s, not an object", model, type(value).__name__)
            bad("not_object")
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
                bad("signal")
        js = value.get("judge_since")
        if isinstance(js, Mapping):   # current form (an old-form node's value is a number)
            unfit.update((str(node), model) for node in value.get("out_of_fit") or ())
        else:
            js = value
        skipped = 0
        for node, ts in js.items():
            if isinstance(ts, int | float) and not isinstance(ts, bool):
                since[(str(node), model)] = float(ts)
            elif js is not value or node not in _CURRENT_KEYS:
                skipped += 1
        if skipped:
            log.warning("%d judge_since hints of model %r are skipped: not numbers", skipped, model)
            bad("judge_since")
    return StageHints(since, frozenset(unfit), refs, signals)


def _ignore(reason: str) -> None:
    pass
