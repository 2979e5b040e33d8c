"""Latency models of one simulated (node, model): pure, seeded, vectorized.

A :class:`NodeLatency` is a healthy *base* distribution plus a tuple of time-dependent
*effects* (warm-up, faults). :meth:`NodeLatency.sample` draws one request per given time
offset (seconds since the scenario's start) from a caller-owned
:class:`numpy.random.Generator`; nothing here reads a clock, a file or a global RNG, so the
same generator state and offsets always give the same samples.

Bases: :class:`Lognormal` — ``latency = p50_us × exp(sigma × Z)``, median ``p50_us``, P99/P50
``exp(2.326 × sigma)`` (``sigma = 0.3`` → 2.0); :class:`LLM` — ``latency = TTFT + TPOT ×
(output_tokens − 1)`` with ``TTFT = ttft_base_us + ttft_per_input_token_us × input_tokens``,
request sizes drawn from a :class:`RequestSizes` table (the Azure traces), TTFT and TPOT each
with a small independent lognormal jitter (the detector's ``tpot`` signal recovers TPOT).

Effects multiply one *channel* of each request: the whole ``latency``, or for an LLM base its
``tpot`` (decode) or ``ttft`` (prefill) part; ``errors`` marks a share of requests failed.
Every effect is active on ``[onset_s, end_s)`` (``end_s = None``: until the end), which is how
recovery is modelled. Scenario files: docs/simulator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

Channel = Literal["latency", "tpot", "ttft", "errors"]

#: z-score of the 99th percentile of a standard normal.
Z99 = 2.3263478740408408

#: Default speed of hardware classes: latency multiplier relative to an A100.
HARDWARE_SPEED: dict[str, float] = {
    "H100": 0.6,
    "A100": 1.0,
    "L40S": 1.4,
    "A10": 2.2,
    "L4": 2.6,
}


def sigma_for_ratio(p99_over_p50: float) -> float:
    """The lognormal ``sigma`` whose P99/P50 is ``p99_over_p50``."""
    if not p99_over_p50 > 1.0:
        raise ValueError(f"p99_over_p50 must be > 1, got {p99_over_p50!r}")
    return math.log(p99_over_p50) / Z99


@dataclass(frozen=True, slots=True)
class Draws:
    """One vector of simulated requests (all arrays of the same length).

    ``input_tokens``/``output_tokens``/``ttft_us`` are ``None`` for bases
    without request sizes.
    """

    latency_us: FloatArray
    ok: BoolArray
    input_tokens: IntArray | None = None
    output_tokens: IntArray | None = None
    ttft_us: FloatArray | None = None

    def __len__(self) -> int:
        return int(self.latency_us.shape[0])


@dataclass(frozen=True, slots=True, eq=False)
class RequestSizes:
    """A table of real request sizes: ``tokens[:, 0]`` input, ``tokens[:, 1]`` output."""

    name: str
    tokens: IntArray

    def __post_init__(self) -> None:
        t = self.tokens
        if t.ndim != 2 or t.shape[1] != 2 or t.shape[0] == 0:
            raise ValueError(f"request sizes {self.name!r}: expected an (n, 2) array, got {t.shape}")
        if int(t[:, 1].min()) < 1:
            raise ValueError(f"request sizes {self.name!r}: output tokens must be >= 1")

    def draw(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        """``n`` requests drawn with replacement: (input_tokens, output_tokens)."""
        idx = rng.integers(0, self.tokens.shape[0], size=n)
        rows = self.tokens[idx]
        return rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)


#: Given request sizes: (input_tokens, output_tokens), each of shape (n,).
Sizes = tuple[IntArray, IntArray]


class Base(Protocol):
    """A healthy latency distribution (time-independent)."""

    @property
    def has_tokens(self) -> bool: ...

    def draw(self, rng: np.random.Generator, n: int, sizes: Sizes | None = None) -> Draws: ...

    def scaled(self, factor: float) -> Base: ...


@dataclass(frozen=True, slots=True)
class Lognormal:
    """Lognormal latency with median ``p50_us`` and log-spread ``sigma``."""

    p50_us: float
    sigma: float = 0.3

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p50_us) and self.p50_us > 0):
            raise ValueError(f"p50_us must be a finite number > 0, got {self.p50_us!r}")
        if not (math.isfinite(self.sigma) and 0 <= self.sigma <= 5):
            raise ValueError(f"sigma must be in [0, 5], got {self.sigma!r}")

    @property
    def has_tokens(self) -> bool:
        return False

    def draw(self, rng: np.random.Generator, n: int, sizes: Sizes | None = None) -> Draws:
        lat = self.p50_us * np.exp(self.sigma * rng.standard_normal(n))
        return Draws(latency_us=lat, ok=np.ones(n, dtype=np.bool_))

    def scaled(self, factor: float) -> Lognormal:
        return Lognormal(self.p50_us * factor, self.sigma)


@dataclass(frozen=True, slots=True, eq=False)
class LLM:
    """LLM request latency: TTFT (growing with input tokens) + TPOT × decode steps."""

    sizes: RequestSizes
    ttft_base_us: float = 50_000.0
    ttft_per_input_token_us: float = 250.0
    tpot_us: float = 30_000.0
    jitter_sigma: float = 0.05

    def __post_init__(self) -> None:
        for name in ("ttft_base_us", "ttft_per_input_token_us", "tpot_us", "jitter_sigma"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.tpot_us <= 0:
            raise ValueError(f"tpot_us must be > 0, got {self.tpot_us!r}")

    @property
    def has_tokens(self) -> bool:
        return True

    def draw(self, rng: np.random.Generator, n: int, sizes: Sizes | None = None) -> Draws:
        """``n`` requests; sizes drawn from the table unless given (then ``sizes`` wins)."""
        if sizes is None:
            inp, out = self.sizes.draw(rng, n)
        else:
            inp = np.asarray(sizes[0], dtype=np.int64).reshape(n)
            out = np.maximum(np.asarray(sizes[1], dtype=np.int64).reshape(n), 1)
        jit = np.exp(self.jitter_sigma * rng.standard_normal((2, n)))
        ttft = (self.ttft_base_us + self.ttft_per_input_token_us * inp) * jit[0]
        decode = self.tpot_us * jit[1] * (out - 1)
        return Draws(latency_us=ttft + decode, ok=np.ones(n, dtype=np.bool_),
                     input_tokens=inp, output_tokens=out, ttft_us=ttft)

    def scaled(self, factor: float, *, ttft: float = 1.0, tpot: float = 1.0) -> LLM:
        return LLM(self.sizes, self.ttft_base_us * factor * ttft,
                   self.ttft_per_input_token_us * factor * ttft, self.tpot_us * factor * tpot,
                   self.jitter_sigma)


class Effect(Protocol):
    """A time-dependent change of one channel of a node's requests."""

    @property
    def channel(self) -> Channel: ...

    def multiplier(self, rng: np.random.Generator, t_s: FloatArray) -> FloatArray:
        """Per-request multiplier (for ``errors``: per-request failure probability)."""
        ...


def _active(t_s: FloatArray, onset_s: float, end_s: float | None) -> BoolArray:
    on = t_s >= onset_s
    if end_s is not None:
        on &= t_s < end_s
    return on


def _check_window(onset_s: float, end_s: float | None) -> None:
    if not math.isfinite(onset_s):
        raise ValueError(f"onset_s must be finite, got {onset_s!r}")
    if end_s is not None and not end_s > onset_s:
        raise ValueError(f"end_s ({end_s!r}) must be after onset_s ({onset_s!r})")


def _check_factor(name: str, v: float) -> None:
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Every request ×``factor`` (thermal throttling, a bad driver, load)."""

    factor: float
    onset_s: float = 0.0
    end_s: float | None = None
    channel: Channel = "latency"

    def __post_init__(self) -> None:
        _check_factor("factor", self.factor)
        _check_window(self.onset_s, self.end_s)
        if self.channel == "errors":
            raise ValueError("Slowdown channel must be latency, tpot or ttft")

    def multiplier(self, rng: np.random.Generator, t_s: FloatArray) -> FloatArray:
        return np.where(_active(t_s, self.onset_s, self.end_s), self.factor, 1.0)


@dataclass(frozen=True, slots=True)
class TailDegradation:
    """A random ``share`` of requests ×``factor``: raises P99, leaves P50."""

    share: float
    factor: float
    onset_s: float = 0.0
    end_s: float | None = None
    channel: Channel = "latency"

    def __post_init__(self) -> None:
        if not 0 < self.share < 0.5:
            raise ValueError(f"share must be in (0, 0.5) so that P50 is unchanged, got {self.share!r}")
        _check_factor("factor", self.factor)
        _check_window(self.onset_s, self.end_s)

    def multiplier(self, rng: np.random.Generator, t_s: FloatArray) -> FloatArray:
        hit = rng.random(t_s.shape[0]) < self.share
        return np.where(hit & _active(t_s, self.onset_s, self.end_s), self.factor, 1.0)


@dataclass(frozen=True, slots=True)
class Spikes:
    """Intermittent short spikes: ×``factor`` for ``spike_s`` every ``period_s``."""

    period_s: float
    spike_s: float
    factor: float
    onset_s: float = 0.0
    end_s: float | None = None
    channel: Channel = "latency"

    def __post_init__(self) -> None:
        if not 0 < self.spike_s < self.period_s:
            raise ValueError(f"need 0 < spike_s < period_s, got spike_s={self.spike_s!r}, "
                             f"period_s={self.period_s!r}")
        _check_factor("factor", self.factor)
        _check_window(self.onset_s, self.end_s)

    def multiplier(self, rng: np.random.Generator, t_s: FloatArray) -> FloatArray:
        in_spike = np.mod(t_s - self.onset_s, self.period_s) < self.spike_s
        return np.where(in_spike & _active(t_s, self.onset_s, self.end_s), self.factor, 1.0)


@dataclass(frozen=True, slots=True)
class Warmup:
    """A (re)started node: ×``factor`` at ``start_s``, decaying linearly to ×1 over ``duration_s``."""

    start_s: float
    duration_s: float
    factor: float
    channel: Channel = "latency"

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s!r}")
        if not self.factor >= 1:
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")

    def multiplier(self, rng: np.random.Generator, t_s: FloatArray) -> FloatArray:
        left = np.clip(1.0 - (t_s - self.start_s) / self.duration_s, 0.0, 1.0)
        left = np.where(t_s >= self.start_s, left, 0.0)
        return 1.0 + (self.factor - 1.0) * left


@dataclass(frozen=True, slots=True)
class Errors:
    """A ``share`` of requests fail (counted by the detector, not in quantiles)."""

    share: float
    onset_s: float = 0.0
    end_s: float | None = None
    channel: Channel = "errors"

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share!r}")
        _check_window(self.onset_s, self.end_s)

    def multiplier(self, rng: np.random.Generator, t_s: FloatArray) -> FloatArray:
        return np.where(_active(t_s, self.onset_s, self.end_s), self.share, 0.0)


@dataclass(frozen=True, slots=True, eq=False)
class NodeLatency:
    """The latency model of one (node, model): a base and its effects."""

    base: Lognormal | LLM
    effects: tuple[Slowdown | TailDegradation | Spikes | Warmup | Errors, ...] = field(default=())

    def __post_init__(self) -> None:
        for e in self.effects:
            if e.channel in ("tpot", "ttft") and not isinstance(self.base, LLM):
                raise ValueError(f"a {e.channel} effect needs an LLM base, not {type(self.base).__name__}")

    def sample(self, rng: np.random.Generator, t_s: npt.ArrayLike, sizes: Sizes | None = None) -> Draws:
        """One request per time offset in ``t_s`` (seconds since the scenario's start).

        ``sizes`` fixes the requests' (input, output) token counts (an LLM base
        draws them from its table otherwise; other bases ignore them). Draw
        order is fixed (base first, then effects in order), so a base's
        healthy draws do not depend on which effects follow it.
        """
        t = np.asarray(t_s, dtype=np.float64).reshape(-1)
        n = t.shape[0]
        d = self.base.draw(rng, n, sizes)
        mult = {"latency": np.ones(n), "tpot": np.ones(n), "ttft": np.ones(n)}
        p_ok = np.ones(n)
        for e in self.effects:
            f = e.multiplier(rng, t)
            if e.channel == "errors":
                p_ok *= 1.0 - f
            else:
                mult[e.channel] *= f
        fail_u = rng.random(n)
        ok = fail_u < p_ok
        if d.ttft_us is None:
            return Draws(latency_us=d.latency_us * mult["latency"], ok=ok)
        ttft = d.ttft_us * mult["ttft"] * mult["latency"]
        decode = (d.latency_us - d.ttft_us) * mult["tpot"] * mult["latency"]
        return Draws(latency_us=ttft + decode, ok=ok, input_tokens=d.input_tokens,
                     output_tokens=d.output_tokens, ttft_us=ttft)


def node_rng(seed: int, *key: int) -> np.random.Generator:
    """An independent generator for one stream (e.g. ``(node_index, model_index)``).

    Adding a node or a fault never changes another stream's draws.
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))
