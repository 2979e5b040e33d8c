"""The signal a node is judged on: raw latency, time per output token, or latency normalized by
the fleet's expectation for the request's size.

* ``latency``    — raw ``latency_us``, µs;
* ``tpot``       — ``(latency_us − ttft_us) / (output_tokens − 1)``, µs per generated token,
  for samples with ``ttft_us`` and ``output_tokens >= 2``;
* ``normalized`` — ``latency_us / expected_us(output_tokens, input_tokens)``, where the
  expectation ``a + b·out + c·in`` is fitted per model over the whole fleet: a least-squares
  fit per node, then the coordinate-wise median of the per-node coefficients, so a minority
  of slow nodes cannot drag it; clamped to a positive floor.

``auto`` picks, per model and tick: ``tpot`` if most judged samples carry ``ttft_us`` and
``output_tokens >= 2``; else ``normalized`` if most carry ``output_tokens``; else ``latency``.
With several workers stage 2 makes that choice once per model (:class:`ModelChoice`).

Guarantees: everything here is pure numpy on arrays; the row-wise functions take 2-D
``[rows, slots]`` matrices with a boolean mask, so the window store fits thousands of nodes in
one vectorized call. Why (a healthy LLM node's raw P99/P50 is the request mix, not the node)
and what each signal measures on real traffic: docs/rules.md ("signal").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.floating[Any]]
F64: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]

LATENCY: Final = "latency"
TPOT: Final = "tpot"
NORMALIZED: Final = "normalized"
AUTO: Final = "auto"

# A node's own fit needs this many sized samples to vote in the fleet median.
MIN_FIT_SAMPLES: Final = 20
# The expectation never drops below this share of the fleet's typical mean latency (nor 1 µs).
FLOOR_SHARE: Final = 0.05
# Fit latency on input tokens too when at least this share of sized samples carry them.
INPUT_COVERAGE: Final = 0.95


# Summary extras of a model's choice across workers (stage 1 → stage 2; ``evidence=True``):
#: ``[judged with ttft and output_tokens >= 2, judged with output_tokens, … and input_tokens]``
COUNTS_KEY: Final = "signal_counts"
#: ``[a, b, c, mean_us]`` of the series' own fit (``None`` where it has none)
VOTE_KEY: Final = "fit_vote"
#: ``True`` when the model's signal was chosen on this worker's share alone (no stage-2 choice yet)
LOCAL_KEY: Final = "signal_local"
SIGNALS: Final = (LATENCY, TPOT, NORMALIZED)


def uses_input(with_output: float, with_input: float) -> bool:
    """Fit on input tokens too: at least :data:`INPUT_COVERAGE` of the sized samples carry them."""
    return bool(with_output > 0 and with_input >= INPUT_COVERAGE * with_output)


@dataclass(frozen=True, slots=True)
class ModelCounts:
    """Judged samples per model (arrays indexed by model): all, with a TPOT value, with
    ``output_tokens``, with ``input_tokens`` too; whether every series with a judgeable window
    has ``min_samples`` of TPOT / of ``output_tokens`` (see :func:`choose_signal`)."""

    judged: F64
    tpot: F64
    output: F64
    inout: F64
    tpot_everywhere: BoolArray
    output_everywhere: BoolArray


def choose_model(configured: str, mc: ModelCounts, i: int) -> tuple[str, bool]:
    """Model ``i``'s signal and whether its ``normalized`` fit uses input tokens. The one
    choice: a store's own (one worker, ``tailguard replay``) and stage 2's across workers."""
    return (choose_signal(configured, int(mc.judged[i]), int(mc.tpot[i]), int(mc.output[i]),
                          tpot_everywhere=bool(mc.tpot_everywhere[i]),
                          output_everywhere=bool(mc.output_everywhere[i])),
            uses_input(mc.output[i], mc.inout[i]))


def choose_signal(configured: str, judged: int, with_tpot: int, with_output: int, *,
                  tpot_everywhere: bool = True, output_everywhere: bool = True) -> str:
    """Resolve ``configured`` (``auto`` or a signal) from the model's sample counts.

    ``judged`` is the number of judged samples of the model, ``with_tpot``
    those with ``ttft_us`` and ``output_tokens >= 2``, ``with_output`` those
    with ``output_tokens``. "Most" means strictly more than half. A signal is
    chosen only when every series with a judgeable window has one of it
    (``tpot_everywhere``, ``output_everywhere``): a node whose events carry no
    token counts (an emitter not yet rolled out) would otherwise never be judged.
    """
    if configured != AUTO:
        return configured
    if judged > 0 and 2 * with_tpot > judged and tpot_everywhere:
        return TPOT
    if judged > 0 and 2 * with_output > judged and output_everywhere:
        return NORMALIZED
    return LATENCY


def tpot_us(latency_us: FloatArray, ttft_us: FloatArray, output_tokens: FloatArray) -> F64:
    """Time per output token after the first, µs/token; NaN where not computable."""
    lat = np.asarray(latency_us, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.asarray(output_tokens, dtype=np.float64)
        val = (lat - np.asarray(ttft_us, dtype=np.float64)) / (out - 1.0)
        return np.where(out >= 2.0, val, np.nan)


@dataclass(frozen=True, slots=True)
class RowFits:
    """Per-row least-squares fits ``latency ≈ a + b·out + c·in``.

    ``valid`` rows had at least :data:`MIN_FIT_SAMPLES` samples and spread in
    ``out`` (or, with one output length throughout, in ``in``: ``b`` is 0 then); ``c`` is
    0 where the fit used ``out`` alone. ``mean_us`` is the
    row's mean latency over the fitted samples (NaN for empty rows).
    """

    n: npt.NDArray[np.int64]
    a: F64
    b: F64
    c: F64
    mean_us: F64
    valid: BoolArray


def row_fits(latency_us: FloatArray, output_tokens: FloatArray,
             input_tokens: FloatArray | None, mask: BoolArray,
             *, min_samples: int = MIN_FIT_SAMPLES) -> RowFits:
    """Fit each row's masked samples; centred sums keep it well conditioned.

    ``mask`` must exclude samples without ``output_tokens`` (and without
    ``input_tokens`` when those are given).
    """
    n = mask.sum(axis=1)
    nf = np.maximum(n, 1).astype(np.float64)

    def centred(x: FloatArray) -> tuple[F64, F64]:
        xs = np.where(mask, x, 0.0).astype(np.float64)
        mean = xs.sum(axis=1) / nf
        return np.where(mask, xs - mean[:, None], 0.0), mean

    yc, ym = centred(latency_us)
    oc, om = centred(output_tokens)
    voo = np.einsum("ij,ij->i", oc, oc)
    voy = np.einsum("ij,ij->i", oc, yc)
    spread = voo > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        b = np.where(spread, voy / voo, np.nan)
        c = np.zeros_like(b)
        im = np.zeros_like(b)
        if input_tokens is not None:
            ic, im = centred(input_tokens)
            vii = np.einsum("ij,ij->i", ic, ic)
            voi = np.einsum("ij,ij->i", oc, ic)
            viy = np.einsum("ij,ij->i", ic, yc)
            det = voo * vii - voi * voi
            two = (vii > 0) & (det > 1e-9 * voo * vii)
            b = np.where(two, (voy * vii - viy * voi) / det, b)
            c = np.where(two, (viy * voo - voy * voi) / det, 0.0)
            # One output length throughout (classification, output_tokens = 1): the input
            # alone explains the size.
            in_only = ~spread & (vii > 0)
            b = np.where(in_only, 0.0, b)
            c = np.where(in_only, viy / vii, c)
            spread = spread | in_only
    a = ym - b * om - c * im
    valid = (n >= min_samples) & spread & np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    mean = np.where(n > 0, ym, np.nan)
    return RowFits(n.astype(np.int64), a, b, c, mean, valid)


@dataclass(frozen=True, slots=True)
class FleetFit:
    """The model's expected latency for a request of a given size, µs.

    ``expected_us = max(a_us + b_us_per_token·out + c_us_per_input_token·in,
    floor_us)``. ``nodes`` is how many node fits voted; 0 means no node
    could be fitted and the expectation is the fleet's typical mean latency
    (``a_us``), i.e. normalized = latency / typical latency.
    """

    a_us: float
    b_us_per_token: float
    c_us_per_input_token: float
    floor_us: float
    nodes: int

    def expected_us(self, output_tokens: FloatArray, input_tokens: FloatArray | None = None) -> F64:
        exp = self.a_us + self.b_us_per_token * np.asarray(output_tokens, dtype=np.float64)
        if input_tokens is not None and self.c_us_per_input_token != 0.0:
            exp = exp + self.c_us_per_input_token * np.asarray(input_tokens, dtype=np.float64)
        return np.maximum(exp, self.floor_us)

    def to_dict(self) -> dict[str, float | int]:
        return {"a_us": self.a_us, "b_us_per_token": self.b_us_per_token,
                "c_us_per_input_token": self.c_us_per_input_token,
                "floor_us": self.floor_us, "nodes": self.nodes}


def fit_from_dict(d: Mapping[str, object]) -> FleetFit:
    """The :meth:`FleetFit.to_dict` form back; ValueError when a field is missing or not finite."""
    try:
        keys = ("a_us", "b_us_per_token", "c_us_per_input_token", "floor_us")
        vals = [float(d[k]) for k in keys]  # type: ignore[arg-type]
        nodes = int(d["nodes"])  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"a fleet fit needs numbers a_us, b_us_per_token, c_us_per_input_token, "
                         f"floor_us and nodes: {e!r}") from e
    if not all(np.isfinite(vals)) or vals[3] <= 0:
        raise ValueError(f"a fleet fit's numbers must be finite, floor_us > 0: {vals}")
    return FleetFit(vals[0], vals[1], vals[2], vals[3], nodes)


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """A model's signal for every stage-1 worker, as stage 2 chose it from all their summaries.

    ``use_input``: the ``normalized`` fit uses ``input_tokens``; ``fit``: the fleet's
    expectation for ``normalized`` (``None``: each worker fits its own share this tick, as
    before the first choice).
    """

    signal: str
    use_input: bool = False
    fit: FleetFit | None = None

    def to_dict(self) -> dict[str, object]:
        return {"signal": self.signal, "use_input": self.use_input,
                "fit": None if self.fit is None else self.fit.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ModelChoice:
        """:meth:`to_dict`'s form back; ValueError names what is wrong."""
        signal = d.get("signal")
        if signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {signal!r}")
        fit = d.get("fit")
        if fit is not None and not isinstance(fit, Mapping):
            raise ValueError(f"fit must be an object or null, got {fit!r}")
        return cls(str(signal), bool(d.get("use_input")), None if fit is None else fit_from_dict(fit))


def fleet_fit(a: Sequence[float] | FloatArray, b: Sequence[float] | FloatArray,
              c: Sequence[float] | FloatArray, mean_us: Sequence[float] | FloatArray) -> FleetFit:
    """Robust fleet expectation from per-node coefficients (valid fits only) and
    per-node mean latencies (all nodes with samples).

    The coordinate-wise median: with fewer than half the nodes slow, the
    result is a healthy node's coefficient.
    """
    means = np.asarray(mean_us, dtype=np.float64)
    means = means[np.isfinite(means)]
    typical = float(np.median(means)) if means.size else 1.0
    floor = max(1.0, FLOOR_SHARE * typical)
    av = np.asarray(a, dtype=np.float64)
    if av.size == 0:
        return FleetFit(max(typical, floor), 0.0, 0.0, floor, 0)
    return FleetFit(float(np.median(av)), float(np.median(np.asarray(b, dtype=np.float64))),
                    float(np.median(np.asarray(c, dtype=np.float64))), floor, int(av.size))


def fit_fleet_1d(nodes: Sequence[tuple[FloatArray, FloatArray, FloatArray | None]]) -> FleetFit:
    """Convenience for 1-D data: ``nodes`` = [(latency_us, output_tokens, input_tokens|None)]."""
    coefs: list[tuple[float, float, float]] = []
    means: list[float] = []
    for lat, out, inp in nodes:
        lat2 = np.asarray(lat, dtype=np.float64)[None, :]
        out2 = np.asarray(out, dtype=np.float64)[None, :]
        inp2 = None if inp is None else np.asarray(inp, dtype=np.float64)[None, :]
        mask = np.isfinite(lat2) & np.isfinite(out2)
        if inp2 is not None:
            mask &= np.isfinite(inp2)
        f = row_fits(lat2, out2, inp2, mask)
        if f.n[0] > 0:
            means.append(float(f.mean_us[0]))
        if f.valid[0]:
            coefs.append((float(f.a[0]), float(f.b[0]), float(f.c[0])))
    arr = np.array(coefs, dtype=np.float64).reshape(-1, 3)
    return fleet_fit(arr[:, 0], arr[:, 1], arr[:, 2], means)


def normalized(latency_us: FloatArray, output_tokens: FloatArray,
               input_tokens: FloatArray | None, fit: FleetFit) -> F64:
    """``latency / expected`` per sample; NaN where ``output_tokens`` is missing."""
    with np.errstate(invalid="ignore"):
        return np.asarray(latency_us, dtype=np.float64) / fit.expected_us(output_tokens,
                                                                           input_tokens)
