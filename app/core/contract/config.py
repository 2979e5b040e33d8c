"""Detector settings: one frozen, validated value object.

Guarantees: a :class:`DetectorSettings` that exists is valid; every bad value
raises :class:`SettingError` at construction naming the setting, the value
and what is allowed. This module reads no environment: ``tailguard.settings`` maps
``TAILGUARD_*`` variables onto it and ``tailguard replay --set`` does the same
for ``KEY=VALUE`` pairs, both through :func:`parse_overrides`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SIGNALS = ("auto", "latency", "tpot", "normalized")
WEIGHT_MODES = ("enforce", "observe", "off")


class SettingError(ValueError):
    """A setting has a value outside what is allowed.

    ``name`` is the setting (or environment variable) at fault, ``value`` the
    offending text or value, ``allowed`` a human description of what is.
    """

    def __init__(self, name: str, value: object, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not allowed: expected {allowed}")


def _rng(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> Any:
    return field(metadata={"lo": lo, "hi": hi, "lo_open": lo_open})


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    """Everything the pure detector can be tuned by. Defaults are the original design's."""

    tick_interval_s: float = field(default=30.0, metadata={"lo": 0.0, "lo_open": True, "hi": 3600.0})
    window_size: int = field(default=1000, metadata={"lo": 10, "hi": 1_000_000})
    min_samples: int = field(default=100, metadata={"lo": 1, "hi": 1_000_000})
    ratio_threshold: float = field(default=3.0, metadata={"lo": 1.0, "lo_open": True, "hi": 1000.0})
    confirm_windows: int = field(default=3, metadata={"lo": 1, "hi": 1000})
    relative_p50_factor: float = field(default=2.0, metadata={"lo": 1.0, "lo_open": True, "hi": 1000.0})
    # P99 above this × the peers' P99 is abnormal (reason relative_p99).
    relative_p99_factor: float = field(default=2.0, metadata={"lo": 1.0, "lo_open": True, "hi": 1000.0})
    # A failed share past max_error_share is abnormal only when also above this × the peers' median.
    error_share_peer_factor: float = field(default=2.0, metadata={"lo": 1.0, "lo_open": True, "hi": 1000.0})
    min_peers: int = field(default=3, metadata={"lo": 2, "hi": 100_000})
    max_ejected_fraction: float = field(default=0.5, metadata={"lo": 0.0, "hi": 1.0})
    warmup_s: float = field(default=120.0, metadata={"lo": 0.0, "hi": 86_400.0})
    # Age bound of a window: samples older than this (event time) are not judged.
    max_sample_age_s: float = field(default=300.0, metadata={"lo": 0.0, "lo_open": True, "hi": 86_400.0})
    # Tail rule is fleet-relative too: ratio must also exceed fleet median ratio × this.
    fleet_ratio_factor: float = field(default=1.5, metadata={"lo": 1.0, "hi": 1000.0})
    # On a heavy-tailed model (the peers' median P99/P50 above ratio_threshold: raw LLM latency
    # without token counts), P50, P99 and fresh P50 all above this × the peers' is abnormal too:
    # a per-token slowdown that request sizes dilute below relative_p50_factor. 0 = off.
    shift_factor: float = field(default=1.5, metadata={"lo": 0.0, "hi": 1000.0})
    # A node whose failed share of requests since the previous tick is above this (and above
    # error_share_peer_factor x its peers' median share) is abnormal: a node that fails fast
    # leaves no latency to judge. 0 = off.
    max_error_share: float = field(default=0.1, metadata={"lo": 0.0, "hi": 1.0})
    # A routed node that completed no request since the previous tick while its peers' median
    # is at least this many is abnormal (reason stalled): a hung node whose heartbeats go on
    # would otherwise stay routed with nothing to judge. 0 = off.
    stall_peer_requests: int = field(default=20, metadata={"lo": 0, "hi": 1_000_000})
    # "auto" | "latency" | "tpot" | "normalized"; per-model overrides in model_signals.
    signal: str = field(default="auto", metadata={"choices": SIGNALS})
    # "model=signal,model=signal" overrides of `signal` for single models.
    model_signals: str = field(default="", metadata={"mapping_of": SIGNALS})
    # Share of a model's judged nodes abnormal in one tick that makes it a load event.
    load_event_fraction: float = field(default=0.5, metadata={"lo": 0.0, "lo_open": True, "hi": 1.0})
    # Re-admission: probe samples needed, first back-off, cap, and probe rounds before retirement.
    probe_min_samples: int = field(default=20, metadata={"lo": 1, "hi": 1_000_000})
    backoff_initial_s: float = field(default=30.0, metadata={"lo": 0.0, "hi": 86_400.0})
    backoff_max_s: float = field(default=300.0, metadata={"lo": 0.0, "hi": 86_400.0})
    retire_after_failed_probes: int = field(default=10, metadata={"lo": 1, "hi": 1_000_000})
    # Forget what has shown no sign of life (no sample, no heartbeat; event time) for this long:
    # a retired pair (it no longer counts against max_ejected_fraction, and a node that comes
    # back under its id starts over) and stage 1's window of any series. 0 = never.
    forget_after_s: float = field(default=900.0, metadata={"lo": 0.0, "hi": 31_536_000.0})
    # Liveness: a pair with no sample and no heartbeat (event time) for this long, while its
    # model's other nodes still report, is gone: out of routing, in no guard's count, back
    # through warm-up when it reports again. 0 = never.
    silent_after_s: float = field(default=120.0, metadata={"lo": 0.0, "hi": 86_400.0})
    # When at least this share of a model's live pairs is silent at once, the telemetry is
    # lost, not the nodes: nobody is taken out and routing stays as it was (fail open).
    telemetry_loss_fraction: float = field(default=0.75, metadata={"lo": 0.0, "lo_open": True, "hi": 1.0})
    # A series whose signs of life (samples, heartbeats) resume after a gap longer than this
    # (and than 20 of its usual gaps) restarted: it warms up again. 0 = only instance changes.
    restart_gap_s: float = field(default=10.0, metadata={"lo": 0.0, "hi": 86_400.0})
    # Input validation bounds.
    max_latency_us: float = field(default=3.6e9, metadata={"lo": 1.0, "hi": 1e15})
    max_future_skew_s: float = field(default=300.0, metadata={"lo": 0.0, "hi": 1e9})
    # Node ids and model names must match this regular expression (whole); "" = the default
    # rule of tailguard.core.contract.ids: 1-128 characters of printable ASCII 0x21-0x7E except '|'.
    id_pattern: str = ""
    # Floods: new (node, model) pairs stage 1 admits to its windows per model per tick; the
    # samples and heartbeats of further new pairs are dropped (counted, logged once per tick).
    # A pair over the limit is admitted at a later tick when it reports again. 0 = no limit.
    max_new_pairs_per_tick: int = field(default=1000, metadata={"lo": 0, "hi": 100_000_000})
    # Routing weights (tailguard.core.judge.weights) for routed nodes slower than their peers but not
    # abnormal: "enforce" computes, publishes and writes them where load balancers read them
    # (P:weights:<m>), "observe" computes and publishes them only, "off" computes none.
    weights: str = field(default="enforce", metadata={"choices": WEIGHT_MODES})
    # The lowest weight a routed node gets (an abnormal node is ejected instead).
    min_weight: float = field(default=0.1, metadata={"lo": 0.0, "lo_open": True, "hi": 1.0})
    # The routed nodes' total weight stays at least this share of their number (weights are
    # raised together when it would fall below).
    min_total_weight_share: float = field(default=0.75, metadata={"lo": 0.0, "hi": 1.0})
    # Floods of model names: the models stage 1 keeps windows of, and stage 2 judges, at most;
    # the samples and summaries of further models are dropped (counted, logged once per
    # tick) until a model is forgotten (forget_after_s). 0 = no limit.
    max_models: int = field(default=1000, metadata={"lo": 0, "hi": 100_000_000})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        if self.min_samples > self.window_size:
            raise SettingError("min_samples", self.min_samples, f"at most window_size ({self.window_size})")
        if 0.0 < self.shift_factor <= 1.0:
            raise SettingError("shift_factor", self.shift_factor, "0 (off) or a factor above 1")
        if 0.0 < self.silent_after_s <= self.restart_gap_s:
            raise SettingError("silent_after_s", self.silent_after_s,
                               f"0 (off) or more than restart_gap_s ({self.restart_gap_s})")
        if self.id_pattern:
            check_regex("id_pattern", self.id_pattern, "ids")
        if self.backoff_max_s < self.backoff_initial_s:
            raise SettingError("backoff_max_s", self.backoff_max_s, f">= backoff_initial_s ({self.backoff_initial_s})")

    def signal_for(self, model: str) -> str:
        """The signal configured for ``model`` ("auto" unless overridden)."""
        return self.model_signal_map().get(model, self.signal)

    def model_signal_map(self) -> dict[str, str]:
        return _parse_mapping(self.model_signals)

    def replace(self, **changes: Any) -> DetectorSettings:
        return dataclasses.replace(self, **changes)


def check_regex(name: str, pattern: str, what: str) -> None:
    """Raise :class:`SettingError` naming ``name`` unless ``pattern`` is a regular expression."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise SettingError(name, pattern, f"a Python regular expression for whole {what} ({e})") from None


def _parse_mapping(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, sep, sig = part.rpartition("=")
        if not sep or not model:
            raise SettingError("model_signals", text, "comma-separated model=signal pairs")
        out[model.strip()] = sig.strip()
    return out


def _check(f: dataclasses.Field[Any], value: Any) -> None:
    meta = f.metadata
    want = f.type if isinstance(f.type, type) else {"float": float, "int": int, "str": str}[str(f.type)]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, want) or isinstance(value, bool):
        raise SettingError(f.name, value, f"a {want.__name__}")
    if "choices" in meta and value not in meta["choices"]:
        raise SettingError(f.name, value, f"one of {', '.join(meta['choices'])}")
    if "mapping_of" in meta:
        for model, sig in _parse_mapping(str(value)).items():
            if sig not in meta["mapping_of"]:
                raise SettingError(f.name, value, f"signal for {model!r} one of {', '.join(meta['mapping_of'])}")
    lo, hi = meta.get("lo"), meta.get("hi")
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise SettingError(f.name, value, "a finite number")
        if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
            bound = f"{'>' if meta.get('lo_open') else '>='} {lo}"
            raise SettingError(f.name, value, bound + (f" and <= {hi}" if hi is not None else ""))
        if hi is not None and value > hi:
            raise SettingError(f.name, value, f"<= {hi}")


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(DetectorSettings))


def coerce(name: str, text: str, *, source: str | None = None) -> Any:
    """Convert ``text`` to the type of detector setting ``name``.

    ``source`` is how the user spelled it (``TAILGUARD_WINDOW_SIZE`` or
    ``--set window_size``) so that the error names what they typed.
    """
    label = source or name
    fields = {f.name: f for f in dataclasses.fields(DetectorSettings)}
    if name not in fields:
        raise SettingError(label, text, "one of the detector settings: " + ", ".join(fields))
    typ = str(fields[name].type)
    try:
        if typ == "int":
            return int(text)
        if typ == "float":
            return float(text)
    except ValueError:
        raise SettingError(label, text, f"a number ({typ})") from None
    return text


def parse_overrides(pairs: Mapping[str, str], base: DetectorSettings | None = None,
                    *, labels: Mapping[str, str] | None = None) -> DetectorSettings:
    """Build settings from textual ``name -> value`` pairs over ``base``.

    ``labels`` maps a name to how the user spelled it, for error messages.
    """
    labels = labels or {}
    changes = {k: coerce(k, v, source=labels.get(k)) for k, v in pairs.items()}
    try:
        return dataclasses.replace(base or DetectorSettings(), **changes)
    except SettingError as e:
        label = labels.get(e.name, e.name)
        raise SettingError(label, pairs.get(e.name, e.value), e.allowed) from None  # as the user typed it
