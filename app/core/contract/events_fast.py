"""The msgspec fast paths of the latency-event decoder (:mod:`tailguard.core.contract.events`).

Owns the typed ``msgspec`` decoders of the two JSON shapes that carry almost all traffic: a
single event whose fields have their contract's types (:meth:`FastDecoder.single`;
:meth:`FastDecoder.many`, the same over many lines in one C loop, the replay's) and a batch
whose samples are all ``[ts, latency_us]`` pairs or all five-field samples
(:meth:`FastDecoder.batch`, straight into one float64 array). Types and static bounds are
checked in C by msgspec.

Guarantees:

* Neither method raises for any input bytes. Each returns values only for a message it can
  vouch for, and ``None`` for anything else, after which the general path of
  :mod:`tailguard.core.contract.events` decides (it alone words errors).
* What it returns is what the general path would return for the same bytes; the batch
  policy and the id rule are applied by the caller to both (``tests/unit/test_binary.py``
  compares them message by message). :meth:`FastDecoder.many` leaves the checks of
  ``single`` to its caller (:meth:`tailguard.core.window.accumulate.Accumulator.add_decoded`).
* :func:`build` returns ``None`` when msgspec is missing: the general path then does all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.float64]
# One validated single event: (ts, latency_us, ok, probe, input_tokens, output_tokens, ttft_us).
Row: TypeAlias = tuple[float, float, bool, bool, float, float, float]
# The series and process a single event belongs to: (node_id, model, hardware, instance).
Group: TypeAlias = tuple[str, str, str | None, str | None]

_NAN: Final = float("nan")
_chain: Final = chain.from_iterable


class FastDecoder:
    """msgspec decoders bound to the contract's static limits (module docstring)."""

    __slots__ = ("_batch", "_errors", "_max_name", "_max_samples", "_refused", "_single")

    def __init__(self, msgspec: Any, max_name_chars: int, max_tokens: int,
                 max_batch_samples: int) -> None:
        self._max_name = max_name_chars
        self._max_samples = max_batch_samples
        self._errors: tuple[type[BaseException], ...] = (
            msgspec.MsgspecError, ValueError, TypeError, RecursionError)
        self._batch = _batch_decoders(msgspec)
        self._single = _single_decoder(msgspec, max_name_chars, max_tokens)
        # many()'s stand-in for a line that does not decode: no latency_us, so not taken.
        self._refused = self._single(b'{"node_id": "-", "model": "-"}')

    def single(self, raw: bytes, fut_limit: float, max_lat: float) -> Any:
        """A single event as a struct with the contract's fields (``node_id, model,
        hardware, instance, ts, latency_us, ok, probe, input_tokens, output_tokens,
        ttft_us``; None for an absent optional one), every value valid; None when the
        general path must decide. (A struct, not a tuple: the hot loop reads a few fields.)"""
        try:
            e = self._single(raw)
        except self._errors:
            return None
        lat = e.latency_us
        if e.samples is not None or lat is None or e.ts is None or lat > max_lat \
                or e.ts > fut_limit or (e.ttft_us is not None and e.ttft_us > lat):
            return None
        return e

    def many(self, raws: Sequence[bytes]) -> list[Any]:
        """The typed decoding of each line of ``raws`` (one struct per line), before the
        checks of :meth:`single`; a line that does not decode gets a stand-in without
        ``latency_us``, which those checks refuse. One C loop over the lines; each is
        decoded alone, so a line decodes here exactly when it does in :meth:`single`."""
        out: list[Any] = []
        decoded = map(self._single, raws)
        while True:
            try:
                out.extend(decoded)       # keeps the lines before one that raises
                return out
            except self._errors:          # that line is refused (the general path words why)
                out.append(self._refused)

    @staticmethod
    def is_plain(e: Any) -> bool:
        """The struct of :meth:`single` is an ok, non-probe sample without size fields."""
        return bool(e.ok and not e.probe and e.input_tokens is None and e.output_tokens is None
                    and e.ttft_us is None)

    @staticmethod
    def row(e: Any) -> Row:
        """The row of the struct of :meth:`single` (NaN for an absent size field)."""
        inp, out, ttft = e.input_tokens, e.output_tokens, e.ttft_us
        return (e.ts, e.latency_us, e.ok, e.probe, _NAN if inp is None else float(inp),
                _NAN if out is None else float(out), _NAN if ttft is None else ttft)

    def batch(self, raw: bytes) -> tuple[Any, FloatArray] | None:
        """A JSON batch: ``(header, columns)``; the header has ``node_id, model, hardware,
        instance, ok, probe, samples``, the columns are 2×n or 5×n float64 (NaN for a
        missing size field). None when the general path must decide."""
        for plain, dec in enumerate(self._batch, 1):    # pairs first, then five fields
            try:
                b = dec(raw)
            except self._errors:
                continue
            node, model, hw, samples = b.node_id, b.model, b.hardware, b.samples
            most = self._max_name
            if not (0 < len(node) <= most and 0 < len(model) <= most
                    and (hw is None or len(hw) <= most)
                    and (b.instance is None or len(b.instance) <= most)
                    and 0 < len(samples) <= self._max_samples):
                return None
            if plain == 1:    # [ts, latency_us] pairs of floats: 3-4x faster than np.array
                arr = np.fromiter(_chain(samples), np.float64, 2 * len(samples)).reshape(-1, 2).T
            else:             # five fields, None for a missing one (NaN in the array)
                arr = np.array(samples, dtype=np.float64).T
            return b, arr
        return None


def build(max_name_chars: int, max_tokens: int, max_batch_samples: int) -> FastDecoder | None:
    """The fast decoders for these limits; None when msgspec is not installed."""
    try:
        import msgspec
    except ImportError:  # pragma: no cover - msgspec is a declared dependency
        return None
    return FastDecoder(msgspec, max_name_chars, max_tokens, max_batch_samples)


def _batch_decoders(msgspec: Any) -> tuple[Callable[[bytes], Any], ...]:
    """Decoders of a batch whose samples are all ``[ts, latency_us]``, or all five-field."""

    class Plain(msgspec.Struct):  # type: ignore[misc]
        node_id: str
        model: str
        samples: list[tuple[float, float]]
        hardware: str | None = None
        instance: str | None = None
        ok: bool = True
        probe: bool = False

    class Sized(msgspec.Struct):  # type: ignore[misc]
        node_id: str
        model: str
        samples: list[tuple[float, float, float | None, float | None, float | None]]
        hardware: str | None = None
        instance: str | None = None
        ok: bool = True
        probe: bool = False

    return tuple(msgspec.json.Decoder(t).decode for t in (Plain, Sized))


def _single_decoder(msgspec: Any, max_name_chars: int, max_tokens: int) -> Callable[[bytes], Any]:
    """Decoder of a single event whose fields have their contract's types."""
    from typing import Annotated, Literal

    meta = msgspec.Meta
    name = Annotated[str, meta(min_length=1, max_length=max_name_chars)]
    tokens = Annotated[int, meta(ge=0, le=max_tokens)] | None
    # Types and static bounds are checked by msgspec (in C); what depends on the
    # settings or on other fields (max_latency_us, the future-ts limit, ttft <= latency)
    # is left to the caller. Unknown keys are ignored, as by the general path.
    single = msgspec.defstruct("Single", [
        ("node_id", name), ("model", name),
        # Optional here so that a batch decodes (samples set) rather than raising: cheaper.
        ("latency_us", Annotated[float, meta(gt=0)] | None, None),
        ("ts", Annotated[float, meta(ge=0)] | None, None),
        ("hardware", Annotated[str, meta(max_length=max_name_chars)] | None, None),
        ("instance", Annotated[str, meta(max_length=max_name_chars)] | None, None),
        ("ok", bool, True), ("probe", bool, False),
        ("input_tokens", tokens, None), ("output_tokens", tokens, None),
        ("ttft_us", Annotated[float, meta(ge=0)] | None, None),
        ("type", Literal["single"] | msgspec.UnsetType, msgspec.UNSET),   # null: general path
        ("samples", msgspec.Raw | None, None),  # a batch's samples: refused (only null decodes)
    ], gc=False)
    decode: Callable[[bytes], Any] = msgspec.json.Decoder(single).decode
    return decode
