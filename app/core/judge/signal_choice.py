"""One signal per model across stage-1 workers: stage 2's choice from every worker's summaries.

With several workers each stage 1 holds a share of a model's series; choosing the ``auto``
signal (and fitting ``normalized``) on a share would judge one model's nodes in different
units. :func:`choose_for_model` makes the choice once, from the evidence every stage-1
summary carries (``WindowStore.summaries(evidence=True)``: the ``signal_counts`` and
``fit_vote`` extras of :mod:`tailguard.core.window.signals`), and stage 2 hands it to every
stage 1 through its hints, which applies it instead of its own.

Guarantees: the choice is the one a single store holding every series would make
(:func:`tailguard.core.window.signals.choose_model` on the summed counts, the ``normalized``
fit the median of the same per-series votes), so a worker and ``tailguard replay`` agree;
histogram summaries are no evidence; an ``auto``/``normalized`` model with no sample-path
summary has no choice (``None``: each stage 1 keeps its own). Pure: summaries in, a value out.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tailguard.core.contract.types import WindowSummary
from tailguard.core.window import signals as sig

Votes = list[list[float | None]]


def model_counts(summaries: Iterable[WindowSummary], min_samples: int) -> tuple[sig.ModelCounts, Votes] | None:
    """The summed counts of one model's sample-path summaries and their fit votes; ``None``
    when there is no such summary."""
    judged = tpot = out = inout = 0.0
    tpot_all = out_all = True
    votes: Votes = []
    seen = False
    for s in summaries:
        if s.signal not in sig.SIGNALS:
            continue
        seen = True
        extra = s.extra
        n_judged = int(extra.get("judged_samples", s.samples))
        n_tpot, n_out, n_inout = extra.get(sig.COUNTS_KEY) or (0, 0, 0)
        judged += n_judged
        tpot += n_tpot
        out += n_out
        inout += n_inout
        if n_judged >= min_samples:     # a judgeable window short of the signal's values
            tpot_all = tpot_all and n_tpot >= min_samples
            out_all = out_all and n_out >= min_samples
        vote = extra.get(sig.VOTE_KEY)
        if vote is not None:
            votes.append(list(vote))
    if not seen:
        return None
    one = np.array
    return sig.ModelCounts(one([judged]), one([tpot]), one([out]), one([inout]),
                           one([tpot_all]), one([out_all])), votes


def choose_for_model(configured: str, summaries: Iterable[WindowSummary],
                     min_samples: int) -> sig.ModelChoice | None:
    """``configured`` (``auto`` or a signal) resolved for the whole model (module docstring).

    ``normalized`` carries the fleet fit of every series' vote; with no vote at all (no worker
    fitted the model last tick) ``fit`` is ``None`` and each stage 1 fits its share once.
    """
    if configured in (sig.LATENCY, sig.TPOT):       # nothing to choose or fit
        return sig.ModelChoice(configured)
    got = model_counts(summaries, min_samples)
    if got is None:
        return None
    mc, votes = got
    signal, use_input = sig.choose_model(configured, mc, 0)
    fit = None
    if signal == sig.NORMALIZED and votes:
        v = np.array(votes, dtype=np.float64)       # None → NaN
        valid = ~np.isnan(v[:, :3]).any(axis=1)
        fit = sig.fleet_fit(v[valid, 0], v[valid, 1], v[valid, 2], v[~np.isnan(v[:, 3]), 3])
    return sig.ModelChoice(signal, use_input, fit)
