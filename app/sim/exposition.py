"""What a simulated node shows on ``/metrics``: the five servers' own metric names, labels and buckets.

Owns :data:`SERVERS` (one :class:`ServerDef` per server kind: ``vllm``, ``sglang``,
``tgi``, ``triton``, ``dynamo``) and :class:`NodeExposition`, the cumulative
counters and histograms of one simulated server process, exposed through a
``prometheus_client`` :class:`~prometheus_client.CollectorRegistry` of its own.

Guarantees:

- names, label names and default bucket bounds are the servers' own, as their
  sources define them (vLLM ``vllm/v1/metrics/loggers.py``, SGLang
  ``sglang/srt/metrics/collector.py``, TGI ``router/src/server.rs``, Triton's
  metrics guide, Dynamo ``lib/llm/src/http/service/metrics.rs``); the table is
  in docs/scrape.md;
- everything is cumulative since the process started; a new
  :class:`NodeExposition` is a restart (every counter starts again at zero);
- servers written in Rust or C++ (TGI, Triton, Dynamo) answer in the text
  format only, and TGI's and Triton's counters carry no ``_total`` suffix, as
  theirs do; the Python servers (vLLM, SGLang) also answer OpenMetrics when asked;
- values only: no clock, no I/O; the caller says what was observed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_float_text: Callable[[float], str] = floatToGoString     # how prometheus_client writes numbers


def tgi_buckets() -> tuple[float, ...]:
    """TGI's duration buckets: 0.0001 × 1.5^k, k = 1 … 35 (computed as its router does)."""
    out, value = [], 0.0001
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


def dynamo_buckets(lo: float, hi: float, count: int) -> tuple[float, ...]:
    """Dynamo's ``generate_log_buckets``: 0, then log-spaced ``lo``…``hi`` at 2 significant figures."""
    out = [0.0]
    for i in range(1, count):
        v = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (count - 1))
        scale = 10.0 ** (1 - math.floor(math.log10(v)))
        out.append(math.floor(v * scale + 0.5) / scale)
    return tuple(dict.fromkeys(out))


VLLM_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0)
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0)
SGLANG_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
              400.0, 600.0, 1200.0, 1800.0, 2400.0)
SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
              0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)


@dataclass(frozen=True, slots=True)
class HistogramDef:
    """One latency histogram family: its name and finite upper bounds (seconds)."""

    name: str
    bounds_s: tuple[float, ...]
    per_token: bool = False       # one observation per generated token after the first (not per request)


@dataclass(frozen=True, slots=True)
class ServerDef:
    """What one kind of server exports: its histograms, model label and constant labels."""

    kind: str
    model_label: str | None                    # None: one model per server, no label (TGI)
    const_labels: tuple[tuple[str, str], ...]
    e2e: HistogramDef | None
    ttft: HistogramDef | None
    itl: HistogramDef | None
    openmetrics: bool                          # answers OpenMetrics when the scraper asks for it


SERVERS: dict[str, ServerDef] = {
    "vllm": ServerDef(
        "vllm", "model_name", (("engine", "0"),),
        HistogramDef("vllm:e2e_request_latency_seconds", VLLM_E2E),
        HistogramDef("vllm:time_to_first_token_seconds", VLLM_TTFT),
        HistogramDef("vllm:inter_token_latency_seconds", VLLM_ITL, per_token=True), openmetrics=True),
    "sglang": ServerDef(
        "sglang", "model_name", (),
        HistogramDef("sglang:e2e_request_latency_seconds", SGLANG_E2E),
        HistogramDef("sglang:time_to_first_token_seconds", SGLANG_TTFT),
        HistogramDef("sglang:inter_token_latency_seconds", SGLANG_ITL, per_token=True), openmetrics=True),
    "tgi": ServerDef(
        "tgi", None, (),
        HistogramDef("tgi_request_duration", tgi_buckets()), None,
        HistogramDef("tgi_request_mean_time_per_token_duration", tgi_buckets()), openmetrics=False),
    "triton": ServerDef("triton", "model", (("version", "1"),), None, None, None, openmetrics=False),
    "dynamo": ServerDef(
        "dynamo", "model", (),
        HistogramDef("dynamo_frontend_request_duration_seconds", dynamo_buckets(1.0, 512.0, 10)),
        HistogramDef("dynamo_frontend_time_to_first_token_seconds", dynamo_buckets(0.001, 480.0, 18)),
        HistogramDef("dynamo_frontend_inter_token_latency_seconds", dynamo_buckets(0.001, 2.0, 13),
                     per_token=True), openmetrics=False),
}


class _Hist:
    """Cumulative bucket counts (non-cumulative storage, one slot per bucket and +Inf) and sum."""

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds = np.asarray(bounds_s, dtype=np.float64)
        self.counts: IntArray = np.zeros(len(bounds_s) + 1, dtype=np.int64)
        self.sum_s = 0.0

    def observe(self, values_s: FloatArray, weights: IntArray) -> None:
        # le is inclusive: a value equal to a bound falls in that bound's bucket.
        idx = np.searchsorted(self.bounds, values_s, side="left")
        self.counts += np.bincount(idx, weights=weights, minlength=self.counts.shape[0]).astype(np.int64)
        self.sum_s += float(np.dot(values_s, weights))

    def cumulative(self) -> list[tuple[str, float]]:
        cum = np.cumsum(self.counts)
        les = [_float_text(b) for b in self.bounds] + ["+Inf"]
        return [(le, float(c)) for le, c in zip(les, cum, strict=True)]


@dataclass
class _ModelState:
    e2e: _Hist | None
    ttft: _Hist | None
    itl: _Hist | None
    ok: int = 0
    failed: int = 0
    duration_us: float = 0.0


class NodeExposition:
    """The ``/metrics`` of one server process of kind ``server`` (a fresh one per restart)."""

    def __init__(self, server: str) -> None:
        if server not in SERVERS:
            raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {server!r}")
        self.server = SERVERS[server]
        self._models: dict[str, _ModelState] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)   # a custom collector: collect() below

    def _state(self, model: str) -> _ModelState:
        st = self._models.get(model)
        if st is None:
            d = self.server
            e2e, ttft, itl = (_Hist(h.bounds_s) if h is not None else None for h in (d.e2e, d.ttft, d.itl))
            st = _ModelState(e2e, ttft, itl)
            self._models[model] = st
        return st

    def observe(self, model: str, latency_s: FloatArray, ok: npt.NDArray[np.bool_],
                ttft_s: FloatArray | None = None, output_tokens: IntArray | None = None) -> None:
        """Requests of ``model`` that finished: latencies, success, and (LLMs) TTFT and tokens."""
        st = self._state(model)
        n = latency_s.shape[0]
        if n == 0:
            return
        ones = np.ones(n, dtype=np.int64)
        n_ok = int(np.count_nonzero(ok))
        st.ok += n_ok
        st.failed += n - n_ok
        st.duration_us += float(latency_s.sum()) * 1e6
        if st.e2e is not None:
            st.e2e.observe(latency_s, ones)
        if ttft_s is not None and output_tokens is not None:
            if st.ttft is not None:
                st.ttft.observe(ttft_s, ones)
            itl = self.server.itl
            if st.itl is not None and itl is not None:
                decode = np.maximum(output_tokens - 1, 0)
                has = decode > 0
                per_token = (latency_s[has] - ttft_s[has]) / decode[has]
                if itl.per_token:
                    st.itl.observe(per_token, decode[has].astype(np.int64))
                else:      # TGI: one mean time per token per request
                    st.itl.observe(per_token, ones[has])

    def collect(self) -> Iterator[Metric]:
        d = self.server
        names = ([d.model_label] if d.model_label else []) + [k for k, _ in d.const_labels]
        for which in ("e2e", "ttft", "itl"):
            h: HistogramDef | None = getattr(d, which)
            if h is None:
                continue
            fam = HistogramMetricFamily(h.name, f"simulated {d.kind} {which} latency (seconds)", labels=names)
            for model, st in sorted(self._models.items()):
                hist: _Hist | None = getattr(st, which)
                if hist is not None:
                    fam.add_metric(self._values(model), hist.cumulative(), sum_value=hist.sum_s)
            yield fam
        for m in self._counters():
            if isinstance(m, Metric):
                yield m

    def _counters(self) -> list[Metric | PlainCounter]:
        d = self.server
        names = ([d.model_label] if d.model_label else []) + [k for k, _ in d.const_labels]
        return list(_counters(d, names, {m: (st, self._values(m)) for m, st in sorted(self._models.items())}))

    def _values(self, model: str) -> list[str]:
        d = self.server
        return ([model] if d.model_label else []) + [v for _, v in d.const_labels]

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type (OpenMetrics only where the server offers it)."""
        if self.server.openmetrics and accept:
            encoder, content_type = choose_encoder(accept)
            return encoder(self.registry), content_type
        plain = "".join(c.text() for c in self._counters() if isinstance(c, PlainCounter))
        return generate_latest(self.registry) + plain.encode(), TEXT_CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class PlainCounter:
    """A counter whose sample has no ``_total`` suffix, as TGI's Rust and Triton's C++ exporters
    write them (``prometheus_client`` would add one), rendered in the text format by hand."""

    name: str
    doc: str
    labels: tuple[str, ...]
    rows: tuple[tuple[tuple[str, ...], float], ...]

    def text(self) -> str:
        out = [f"# HELP {self.name} {self.doc}\n", f"# TYPE {self.name} counter\n"]
        for values, v in self.rows:
            pairs = ",".join(f'{k}="{_escape(x)}"' for k, x in zip(self.labels, values, strict=True))
            out.append(f"{self.name}{{{pairs}}} {_float_text(v)}\n" if pairs else
                       f"{self.name} {_float_text(v)}\n")
        return "".join(out)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _plain_counter(name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> PlainCounter:
    return PlainCounter(name, doc, tuple(labels), tuple((tuple(v), float(x)) for v, x in rows))


def _counters(d: ServerDef, names: list[str],
              models: dict[str, tuple[_ModelState, list[str]]]) -> Iterator[Metric | PlainCounter]:
    rows = list(models.values())
    if d.kind == "vllm":
        fam = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=[*names, "finished_reason"])
        for st, vals in rows:
            fam.add_metric([*vals, "length"], st.ok)
            fam.add_metric([*vals, "abort"], st.failed)
        yield fam
    elif d.kind == "sglang":
        total = CounterMetricFamily("sglang:num_requests_total", "Number of requests processed.", labels=names)
        aborted = CounterMetricFamily("sglang:num_aborted_requests_total", "Number of requests aborted.",
                                      labels=names)
        for st, vals in rows:
            total.add_metric(vals, st.ok + st.failed)
            aborted.add_metric(vals, st.failed)
        yield total
        yield aborted
    elif d.kind == "tgi":
        ok = sum(st.ok for st, _ in rows)
        failed = sum(st.failed for st, _ in rows)
        yield _plain_counter("tgi_request_count", "Total number of requests", [], [([], ok + failed)])
        yield _plain_counter("tgi_request_success", "Number of successful requests", [], [([], ok)])
        yield _plain_counter("tgi_request_failure", "Number of failed requests", ["err"], [(["backend"], failed)])
    elif d.kind == "triton":
        yield _plain_counter("nv_inference_request_success", "Number of successful inference requests", names,
                             [(vals, st.ok) for st, vals in rows])
        yield _plain_counter("nv_inference_request_failure", "Number of failed inference requests",
                             [*names, "reason"], [([*vals, "BACKEND"], st.failed) for st, vals in rows])
        yield _plain_counter("nv_inference_count", "Number of inferences performed", names,
                             [(vals, st.ok + st.failed) for st, vals in rows])
        yield _plain_counter("nv_inference_request_duration_us",
                             "Cumulative inference request duration in microseconds", names,
                             [(vals, round(st.duration_us)) for st, vals in rows])
    elif d.kind == "dynamo":
        fam = CounterMetricFamily("dynamo_frontend_requests", "Total number of LLM requests processed",
                                  labels=[*names, "endpoint", "request_type", "status", "error_type"])
        for st, vals in rows:
            fam.add_metric([*vals, "completions", "unary", "success", "none"], st.ok)
            fam.add_metric([*vals, "completions", "unary", "error", "internal"], st.failed)
        yield fam
