"""The simulated servers' /metrics: exact names, labels, buckets, cumulative counts, restarts.

Each server's exposition is parsed back with prometheus_client's own parsers
(text format and OpenMetrics) and compared with the servers' published
definitions and with counts computed directly with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from tailguard.sim.exposition import SERVERS, NodeExposition, dynamo_buckets, tgi_buckets

OM_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _observe(server: str, rng: np.random.Generator, n: int = 500) -> tuple[NodeExposition, dict[str, np.ndarray]]:
    e = NodeExposition(server)
    lat = rng.lognormal(np.log(1.2), 0.6, n)
    ttft = lat * 0.1
    tokens = rng.integers(1, 300, n)
    ok = rng.random(n) > 0.1
    e.observe("llama", lat, ok, ttft, tokens)
    return e, {"lat": lat, "ttft": ttft, "tokens": tokens, "ok": ok}


def test_published_default_buckets() -> None:
    assert len(SERVERS["vllm"].e2e.bounds_s) == 21 and SERVERS["vllm"].e2e.bounds_s[:4] == (0.3, 0.5, 0.8, 1.0)
    assert len(SERVERS["vllm"].ttft.bounds_s) == 22 and SERVERS["vllm"].ttft.bounds_s[-1] == 2560.0
    assert len(SERVERS["vllm"].itl.bounds_s) == 19 and SERVERS["vllm"].itl.bounds_s[0] == 0.01
    tgi = tgi_buckets()
    assert len(tgi) == 35 and tgi[0] == pytest.approx(0.00015) and tgi[1] / tgi[0] == pytest.approx(1.5)
    assert dynamo_buckets(1.0, 512.0, 10) == (0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 130.0, 260.0, 510.0)
    # 0.001 × 2000^(i/12) at 2 significant figures: 0.00188…, 0.00355…
    assert dynamo_buckets(0.001, 2.0, 13)[:3] == (0.0, 0.0019, 0.0035)


@pytest.mark.parametrize("server, families", [
    ("vllm", {"vllm:e2e_request_latency_seconds": "histogram", "vllm:time_to_first_token_seconds": "histogram",
              "vllm:inter_token_latency_seconds": "histogram", "vllm:request_success": "counter"}),
    ("sglang", {"sglang:e2e_request_latency_seconds": "histogram", "sglang:time_to_first_token_seconds": "histogram",
                "sglang:inter_token_latency_seconds": "histogram", "sglang:num_requests": "counter",
                "sglang:num_aborted_requests": "counter"}),
    ("tgi", {"tgi_request_duration": "histogram", "tgi_request_mean_time_per_token_duration": "histogram",
             "tgi_request_count": "counter", "tgi_request_success": "counter", "tgi_request_failure": "counter"}),
    ("triton", {"nv_inference_request_success": "counter", "nv_inference_request_failure": "counter",
                "nv_inference_count": "counter", "nv_inference_request_duration_us": "counter"}),
    ("dynamo", {"dynamo_frontend_request_duration_seconds": "histogram",
                "dynamo_frontend_time_to_first_token_seconds": "histogram",
                "dynamo_frontend_inter_token_latency_seconds": "histogram", "dynamo_frontend_requests": "counter"}),
])
def test_each_server_exports_its_own_families(server: str, families: dict[str, str]) -> None:
    e, _ = _observe(server, np.random.default_rng(1))
    body, _ = e.render()
    assert _families(body.decode()) == families


def test_vllm_buckets_labels_and_counts_match_numpy() -> None:
    e, d = _observe("vllm", np.random.default_rng(2))
    s = _samples(e.render()[0].decode())
    lbl = (("engine", "0"), ("model_name", "llama"))
    for b in SERVERS["vllm"].e2e.bounds_s:
        le = str(b)
        got = s[("vllm:e2e_request_latency_seconds_bucket", tuple(sorted((*lbl, ("le", le)))))]
        assert got == np.count_nonzero(d["lat"] <= b), b
    assert s[("vllm:e2e_request_latency_seconds_count", lbl)] == len(d["lat"])
    assert s[("vllm:e2e_request_latency_seconds_sum", lbl)] == pytest.approx(d["lat"].sum())
    # One inter-token observation per generated token after the first.
    assert s[("vllm:inter_token_latency_seconds_count", lbl)] == np.maximum(d["tokens"] - 1, 0).sum()
    ok = s[("vllm:request_success_total", tuple(sorted((*lbl, ("finished_reason", "length")))))]
    assert ok == np.count_nonzero(d["ok"])


def test_counts_are_cumulative_across_observations() -> None:
    e = NodeExposition("sglang")
    e.observe("m", np.array([0.15, 0.5]), np.array([True, True]))
    e.observe("m", np.array([0.15]), np.array([False]))
    s = _samples(e.render()[0].decode())
    assert s[("sglang:e2e_request_latency_seconds_bucket", (("le", "0.2"), ("model_name", "m")))] == 2
    assert s[("sglang:num_requests_total", (("model_name", "m"),))] == 3
    assert s[("sglang:num_aborted_requests_total", (("model_name", "m"),))] == 1


def test_tgi_has_no_model_label_and_counters_without_total() -> None:
    e, d = _observe("tgi", np.random.default_rng(3))
    text = e.render(OM_ACCEPT)[0].decode()     # TGI answers the text format whatever is asked
    assert "# EOF" not in text
    assert "model" not in text
    # As TGI's Rust exporter writes it: no _total (prometheus_client's parser adds one when reading).
    assert f"\ntgi_request_count {float(len(d['lat']))}\n" in text
    assert "tgi_request_count_total" not in text
    s = _samples(text)
    # TGI observes the mean time per token once per request.
    assert s[("tgi_request_mean_time_per_token_duration_count", ())] == np.count_nonzero(d["tokens"] > 1)


def test_triton_counts_requests_and_cumulative_microseconds() -> None:
    e, d = _observe("triton", np.random.default_rng(4))
    text = e.render()[0].decode()
    ok = np.count_nonzero(d["ok"])
    assert f'\nnv_inference_request_success{{model="llama",version="1"}} {float(ok)}\n' in text
    s = _samples(text)
    lbl = (("model", "llama"), ("version", "1"))
    assert s[("nv_inference_request_success_total", lbl)] == ok
    assert s[("nv_inference_request_duration_us_total", lbl)] == pytest.approx(d["lat"].sum() * 1e6, abs=1)


def test_vllm_answers_openmetrics_when_asked() -> None:
    e, _ = _observe("vllm", np.random.default_rng(5))
    body, ctype = e.render(OM_ACCEPT)
    assert ctype.startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    # prometheus_client >= 0.22 escapes the colon in OpenMetrics sample names unless asked not to.
    assert "\nvllm_e2e_request_latency_seconds_count{" in text
    assert {f.name for f in om_families(text)} >= {"vllm:e2e_request_latency_seconds"}


def test_unknown_server_is_refused() -> None:
    with pytest.raises(ValueError, match="server must be one of"):
        NodeExposition("llamacpp")
