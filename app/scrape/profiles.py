"""Server profiles: which exposition series of an inference server carry request latency.

Owns the mapping from a server's metric names and labels to the histogram-event contract's
metrics (``e2e``, ``ttft``, ``itl``) and request counts: the five built-in profiles
(:data:`PROFILES`: vLLM, SGLang, TGI, Triton, Dynamo), detection of the profile from the
metric names a scrape shows (:func:`detect`), and :func:`profile_from_mapping`, which builds a
profile for any other server from a small JSON/YAML mapping (docs/contracts.md, docs/scrape.md).

Guarantees: pure data and pure functions (no I/O, no clock); every profile's names are the
servers' own (checked against their sources, see docs/scrape.md); a bad mapping fails with a
``ValueError`` naming the key at fault. Reading and watching a mapping file is the bridge's job.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

METRICS: Final = ("e2e", "ttft", "itl")
COUNTER_ROLES: Final = ("requests", "success", "failed", "outcome")


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    """One latency series of a server: a Prometheus histogram (``<name>_bucket``/``_sum``/
    ``_count``), or, with ``mean_of``, a cumulative duration counter whose mean per interval
    is its delta over the delta of the request counters (Triton's default metrics)."""

    metric: str                      # "e2e" | "ttft" | "itl"
    names: tuple[str, ...]           # candidates, the first one the scrape shows is used
    scale_s: float = 1.0             # the series' unit in seconds (µs: 1e-6, ms: 1e-3)
    mean_of: bool = False            # a duration counter, not a histogram


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """A request counter. ``role``: ``requests`` (every request), ``success``, ``failed``, or
    ``outcome`` (one counter whose ``label`` says how each request ended; the values in
    ``failed_values`` count as failed)."""

    role: str
    name: str
    label: str | None = None
    failed_values: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ServerProfile:
    name: str
    histograms: tuple[HistogramSpec, ...]
    counters: tuple[CounterSpec, ...] = ()
    model_label: str | None = None   # None: one model per server, from the target's model

    def names(self) -> frozenset[str]:
        """Every base name this profile reads (for detection), escaped forms included."""
        return frozenset(e for h in self.histograms for n in h.names for e in escaped(n))


VLLM: Final = ServerProfile(
    "vllm",
    (HistogramSpec("e2e", ("vllm:e2e_request_latency_seconds",)),
     HistogramSpec("ttft", ("vllm:time_to_first_token_seconds",)),
     # vLLM >= 0.11 exports inter_token_latency; older releases time_per_output_token.
     HistogramSpec("itl", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"))),
    # abort: a request the engine ended without finishing it (its failures, and client cancels).
    (CounterSpec("outcome", "vllm:request_success", "finished_reason", frozenset({"abort", "error"})),),
    model_label="model_name",
)
SGLANG: Final = ServerProfile(
    "sglang",
    (HistogramSpec("e2e", ("sglang:e2e_request_latency_seconds",)),
     HistogramSpec("ttft", ("sglang:time_to_first_token_seconds",)),
     HistogramSpec("itl", ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"))),
    # Aborted requests are SGLang's failures (it has no error counter).
    (CounterSpec("requests", "sglang:num_requests"), CounterSpec("failed", "sglang:num_aborted_requests")),
    model_label="model_name",
)
TGI: Final = ServerProfile(
    "tgi",
    (HistogramSpec("e2e", ("tgi_request_duration",)),
     HistogramSpec("itl", ("tgi_request_mean_time_per_token_duration",))),
    (CounterSpec("requests", "tgi_request_count"), CounterSpec("success", "tgi_request_success")),
    model_label=None,
)
TRITON: Final = ServerProfile(
    "triton",
    (HistogramSpec("e2e", ("nv_inference_request_duration_us",), scale_s=1e-6, mean_of=True),
     # Only with --metrics-config histogram_latencies=true; the first response of a
     # decoupled (streaming) model, in ms.
     HistogramSpec("ttft", ("nv_inference_first_response_histogram_ms",), scale_s=1e-3)),
    (CounterSpec("success", "nv_inference_request_success"),
     CounterSpec("failed", "nv_inference_request_failure")),
    model_label="model",
)
DYNAMO: Final = ServerProfile(
    "dynamo",
    (HistogramSpec("e2e", ("dynamo_frontend_request_duration_seconds",)),
     HistogramSpec("ttft", ("dynamo_frontend_time_to_first_token_seconds",)),
     HistogramSpec("itl", ("dynamo_frontend_inter_token_latency_seconds",))),
    (CounterSpec("outcome", "dynamo_frontend_requests", "status", frozenset({"error"})),),
    model_label="model",
)

PROFILES: Final[Mapping[str, ServerProfile]] = {p.name: p for p in (VLLM, SGLANG, TGI, TRITON, DYNAMO)}


def escaped(name: str) -> tuple[str, ...]:
    """``name`` and, for a name with ``:``, its underscore form: ``prometheus_client`` writes
    ``vllm:…`` as ``vllm_…`` in OpenMetrics samples unless asked for UTF-8 names, and a
    Prometheus that scraped it so stores (and federates) the underscore names (docs/scrape.md)."""
    return (name, name.replace(":", "_")) if ":" in name else (name,)


def detect(sample_names: Collection[str], profiles: Mapping[str, ServerProfile] = PROFILES,
           ) -> ServerProfile | None:
    """The profile whose latency series the scrape shows most of (ties: the first); None if
    no profile's names appear. ``sample_names``: the exposition's sample names."""
    bases = {_base(n) for n in sample_names}
    best: ServerProfile | None = None
    best_hits = 0
    for p in profiles.values():
        hits = len(p.names() & bases)
        if hits > best_hits:
            best, best_hits = p, hits
    return best


def _base(sample_name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name


# ---------------------------------------------------------------- mapping files

def profiles_from_text(text: str, source: str = "the mapping file") -> dict[str, ServerProfile]:
    """The profiles of a mapping file's text (JSON or YAML): one mapping, a list of them, or
    ``{"profiles": [...]}``. Merge them over :data:`PROFILES` to give them to the converter
    (``TargetConverter(target, {**PROFILES, **profiles_from_text(text)})``). Raises
    ``ValueError`` naming ``source`` and the key at fault."""
    import yaml  # YAML is a superset of JSON: one parser for both

    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source} is neither JSON nor YAML: {e}"[:300]) from None
    if isinstance(obj, Mapping) and "profiles" in obj:
        obj = obj["profiles"]
    items = obj if isinstance(obj, list) else [obj]
    out: dict[str, ServerProfile] = {}
    for item in items:
        try:
            p = profile_from_mapping(item)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        if p.name in out:
            raise ValueError(f"{source}: profile {p.name!r} is defined twice")
        out[p.name] = p
    return out


def profile_from_mapping(obj: Any) -> ServerProfile:
    """A profile from a decoded mapping file (docs/scrape.md)::

        {"name": "myserver", "model_label": "model",
         "histograms": {"e2e": {"name": "my_request_seconds", "scale_s": 1.0},
                        "itl": {"name": "my_token_ms", "scale_s": 0.001}},
         "counters": [{"role": "outcome", "name": "my_requests", "label": "code",
                       "failed_values": ["500", "503"]}]}
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"a profile mapping must be an object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("profile mapping: 'name' must be a non-empty string")
    where = f"profile mapping {name!r}"
    model_label = obj.get("model_label")
    if model_label is not None and (not isinstance(model_label, str) or not model_label):
        raise ValueError(f"{where}: 'model_label' must be a label name or absent")
    hists = obj.get("histograms")
    if not isinstance(hists, Mapping) or not hists:
        raise ValueError(f"{where}: 'histograms' must map at least one of {', '.join(METRICS)}"
                         " to {\"name\": …}")
    specs = tuple(_histogram_spec(where, metric, spec) for metric, spec in hists.items())
    counters = obj.get("counters", [])
    if not isinstance(counters, list):
        raise ValueError(f"{where}: 'counters' must be a list")
    return ServerProfile(name, specs, tuple(_counter_spec(where, i, c) for i, c in enumerate(counters)),
                         model_label)


def _histogram_spec(where: str, metric: object, spec: object) -> HistogramSpec:
    if metric not in METRICS:
        raise ValueError(f"{where}: histograms key {metric!r} is not one of {', '.join(METRICS)}")
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: histograms.{metric} must be an object with 'name'")
    names = spec.get("name")
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{where}: histograms.{metric}.name must be a metric name (or a list of them)")
    scale = spec.get("scale_s", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < float("inf"):
        raise ValueError(f"{where}: histograms.{metric}.scale_s must be a number > 0 (the unit in"
                         f" seconds: 0.001 for ms), got {scale!r}")
    mean_of = spec.get("mean_of", False)
    if not isinstance(mean_of, bool):
        raise ValueError(f"{where}: histograms.{metric}.mean_of must be true or false")
    return HistogramSpec(str(metric), tuple(names), float(scale), mean_of)


def _counter_spec(where: str, i: int, c: object) -> CounterSpec:
    if not isinstance(c, Mapping):
        raise ValueError(f"{where}: counters[{i}] must be an object")
    role, name, label = c.get("role"), c.get("name"), c.get("label")
    if role not in COUNTER_ROLES:
        raise ValueError(f"{where}: counters[{i}].role must be one of {', '.join(COUNTER_ROLES)}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: counters[{i}].name must be a metric name")
    if role == "outcome" and (not isinstance(label, str) or not label):
        raise ValueError(f"{where}: counters[{i}] (role outcome) needs 'label'")
    failed = c.get("failed_values", [])
    if not isinstance(failed, list) or not all(isinstance(v, str) for v in failed):
        raise ValueError(f"{where}: counters[{i}].failed_values must be a list of strings")
    return CounterSpec(str(role), name, label if isinstance(label, str) else None, frozenset(failed))
