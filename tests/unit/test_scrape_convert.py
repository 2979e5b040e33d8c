"""The exposition → histogram-event converter (app/scrape/convert.py) for each server profile.

Each exposition below is written to match the server's real names, labels and default buckets
(docs/scrape.md names the sources). Cumulative values are written by a tiny histogram model
(``_Hist``) so the expected deltas are exact.
"""

from __future__ import annotations

import bisect
from typing import Any

import pytest

from tailguard.core.contract.events import parse_event
from tailguard.scrape.convert import ScrapeError, Target, TargetConverter, events_from_capture
from tailguard.scrape.profiles import PROFILES, detect, profile_from_mapping

VLLM_E2E = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0]
TGI_BUCKETS = [0.0001 * 1.5 ** k for k in range(1, 36)]


def _fmt(v: float) -> str:
    return repr(float(v))


def hist_text(name: str, bounds: list[float], values: list[float], labels: str = "",
              *, scale: float = 1.0, type_line: bool = True) -> str:
    """A Prometheus histogram with ``values`` observed (cumulative buckets, _sum, _count)."""
    lab = labels + ("," if labels else "")
    out = [f"# HELP {name} test\n", f"# TYPE {name} histogram\n"] if type_line else []
    ordered = sorted(values)
    for b in bounds:
        n = bisect.bisect_right(ordered, b * scale + 1e-12)
        out.append(f'{name}_bucket{{{lab}le="{_fmt(b)}"}} {_fmt(n)}\n')
    out.append(f'{name}_bucket{{{lab}le="+Inf"}} {_fmt(len(values))}\n')
    tail = "{" + labels + "}" if labels else ""
    out.append(f"{name}_sum{tail} {_fmt(sum(values))}\n")
    out.append(f"{name}_count{tail} {_fmt(len(values))}\n")
    return "".join(out)


def counter_text(name: str, value: float, labels: str = "", *, total: bool = True) -> str:
    tail = "{" + labels + "}" if labels else ""
    sample = name + ("_total" if total else "")
    return f"# TYPE {name} counter\n{sample}{tail} {_fmt(value)}\n"


def vllm_text(e2e: list[float], ttft: list[float], itl: list[float], ok: int, err: int = 0, *,
              model: str = "meta-llama/Llama-3.1-8B-Instruct", itl_name: str = "vllm:inter_token_latency_seconds",
              start: float | None = 1764679000.0) -> str:
    lab = f'engine="0",model_name="{model}"'
    text = (hist_text("vllm:e2e_request_latency_seconds", VLLM_E2E, e2e, lab)
            + hist_text("vllm:time_to_first_token_seconds", VLLM_TTFT, ttft, lab)
            + hist_text(itl_name, VLLM_ITL, itl, lab)
            + "# TYPE vllm:request_success counter\n"
            + f'vllm:request_success_total{{{lab},finished_reason="stop"}} {_fmt(ok)}\n'
            + f'vllm:request_success_total{{{lab},finished_reason="length"}} 0.0\n'
            + f'vllm:request_success_total{{{lab},finished_reason="error"}} {_fmt(err)}\n'
            + "# TYPE vllm:num_requests_running gauge\n"
            + f"vllm:num_requests_running{{{lab}}} 3.0\n")
    if start is not None:
        text += f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {start}\n"
    return text


def test_vllm_first_scrape_is_baseline_then_deltas_per_bucket() -> None:
    conv = TargetConverter(Target("vllm-3", hardware="H100"))
    assert conv.observe(vllm_text([0.2, 0.4], [0.03], [0.02, 0.02], ok=2), 1000.0) == []
    assert conv.profile is not None and conv.profile.name == "vllm"   # detected
    evs = conv.observe(vllm_text([0.2, 0.4, 0.45, 0.9, 3.0, 9000.0], [0.03, 0.05, 0.3],
                                 [0.02, 0.02, 0.06, 0.06, 0.06], ok=5, err=1), 1010.0)
    by = {e["metric"]: e for e in evs}
    assert set(by) == {"e2e", "ttft", "itl"}
    e2e = by["e2e"]
    assert e2e["node_id"] == "vllm-3" and e2e["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert e2e["bounds_s"] == VLLM_E2E and len(e2e["counts"]) == len(VLLM_E2E) + 1
    # new: 0.45 (<=0.5), 0.9 (<=1.0), 3.0 (<=5.0), 9000 (+Inf)
    expect = [0] * (len(VLLM_E2E) + 1)
    expect[1] += 1
    expect[3] += 1
    expect[7] += 1
    expect[-1] += 1
    assert e2e["counts"] == expect
    assert e2e["sum_s"] == pytest.approx(0.45 + 0.9 + 3.0 + 9000.0)
    assert e2e["requests"] == 4 and e2e["failed"] == 1      # 3 stop + 1 error since the last scrape
    assert e2e["ts"] == 1010.0 and e2e["interval_s"] == 10.0
    assert e2e["hardware"] == "H100" and e2e["instance"] == "vllm-3@1764679000"
    assert sum(by["itl"]["counts"]) == 3 and by["itl"]["counts"][3] == 3    # 0.06 in (0.05, 0.075]
    assert sum(by["ttft"]["counts"]) == 2
    for e in evs:   # every event the converter makes passes the contract
        parse_event(e)


def test_vllm_older_time_per_output_token_is_itl() -> None:
    conv = TargetConverter(Target("v", profile="vllm"))
    name = "vllm:time_per_output_token_seconds"
    conv.observe(vllm_text([], [], [], ok=0, itl_name=name), 0.0)
    evs = conv.observe(vllm_text([0.4], [0.02], [0.03, 0.03], ok=1, itl_name=name), 10.0)
    assert {e["metric"]: sum(e["counts"]) for e in evs} == {"e2e": 1, "ttft": 1, "itl": 2}


def test_counter_down_is_a_restart_with_a_new_instance() -> None:
    conv = TargetConverter(Target("vllm-1"))
    conv.observe(vllm_text([0.2] * 50, [0.01] * 50, [0.02] * 50, ok=50, start=None), 0.0)
    evs = conv.observe(vllm_text([0.2] * 60, [0.01] * 60, [0.02] * 60, ok=60, start=None), 10.0)
    assert sum(evs[0]["counts"]) == 10 and evs[0]["instance"] == "vllm-1"   # no start time, no restart yet
    # The server restarted: its counters start over. The interval's counts are the new totals.
    evs = conv.observe(vllm_text([0.2] * 4, [0.01] * 4, [0.02] * 4, ok=4, start=None), 20.0)
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert sum(e2e["counts"]) == 4 and e2e["requests"] == 4
    assert e2e["instance"] == "vllm-1#20"
    evs = conv.observe(vllm_text([0.2] * 7, [0.01] * 7, [0.02] * 7, ok=7, start=None), 30.0)
    assert evs[0]["instance"] == "vllm-1#20" and sum(evs[0]["counts"]) == 3


def test_a_restart_scraped_before_its_first_request_is_still_a_restart() -> None:
    """A new process exports no series until a request finishes: the scrape in between must
    not hide the counters starting over (they come back lower than the last ones seen)."""
    conv = TargetConverter(Target("vllm-1", profile="vllm", model="m"))
    conv.observe(vllm_text([0.2] * 50, [0.01] * 50, [0.02] * 50, ok=50, start=None), 0.0)
    conv.observe(vllm_text([0.2] * 60, [0.01] * 60, [0.02] * 60, ok=60, start=None), 10.0)
    assert not [e for e in conv.observe("", 20.0) if e.get("counts")]     # restarted, nothing yet
    evs = conv.observe(vllm_text([0.2] * 4, [0.01] * 4, [0.02] * 4, ok=4, start=None), 30.0)
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert e2e["instance"] == "vllm-1#30" and sum(e2e["counts"]) == 4
    evs = conv.observe(vllm_text([0.2] * 7, [0.01] * 7, [0.02] * 7, ok=7, start=None), 40.0)
    assert next(e for e in evs if e["metric"] == "e2e")["instance"] == "vllm-1#30"


def test_a_series_missing_from_one_scrape_is_no_restart_and_loses_nothing() -> None:
    conv = TargetConverter(Target("vllm-1", profile="vllm", model="m"))
    conv.observe(vllm_text([0.2] * 50, [], [], ok=50, start=None), 0.0)
    conv.observe("", 10.0)
    evs = conv.observe(vllm_text([0.2] * 55, [], [], ok=55, start=None), 20.0)
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert e2e["instance"] == "vllm-1" and sum(e2e["counts"]) == 5


def test_new_process_start_time_is_a_restart_even_if_counts_grew() -> None:
    conv = TargetConverter(Target("v"))
    conv.observe(vllm_text([0.2] * 2, [], [], ok=2, start=100.0), 0.0)
    evs = conv.observe(vllm_text([0.2] * 5, [], [], ok=5, start=105.0), 10.0)
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert e2e["instance"] == "v@105" and sum(e2e["counts"]) == 5


def test_idle_model_sends_a_heartbeat() -> None:
    conv = TargetConverter(Target("v", hardware="A10"))
    text = vllm_text([0.2], [0.01], [0.02], ok=1)
    conv.observe(text, 0.0)
    evs = conv.observe(text, 10.0)
    assert evs == [{"type": "heartbeat", "node_id": "v", "model": "meta-llama/Llama-3.1-8B-Instruct",
                    "ts": 10.0, "hardware": "A10", "instance": "v@1764679000"}]
    parse_event(evs[0])


def test_engines_of_one_model_are_summed() -> None:
    lab0, lab1 = 'engine="0",model_name="m"', 'engine="1",model_name="m"'
    name = "vllm:e2e_request_latency_seconds"

    def text(a: list[float], b: list[float]) -> str:
        return hist_text(name, VLLM_E2E, a, lab0) + hist_text(name, VLLM_E2E, b, lab1, type_line=False)

    conv = TargetConverter(Target("v"))
    conv.observe(text([0.2], [0.2]), 0.0)
    (ev,) = conv.observe(text([0.2, 0.6], [0.2, 0.4, 0.4]), 10.0)
    assert ev["counts"][:3] == [0, 2, 1] and ev["requests"] == 3


def test_sglang_profile() -> None:
    lab = 'model_name="qwen"'
    buckets = [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0]

    def text(e2e: list[float]) -> str:
        return (hist_text("sglang:e2e_request_latency_seconds", buckets, e2e, lab)
                + hist_text("sglang:time_to_first_token_seconds", buckets, [v / 10 for v in e2e], lab)
                + counter_text("sglang:prompt_tokens", 10 * len(e2e), lab))

    conv = TargetConverter(Target("sg-0"))
    conv.observe(text([0.3]), 0.0)
    evs = conv.observe(text([0.3, 0.5, 0.5]), 10.0)
    assert conv.profile is not None and conv.profile.name == "sglang"
    by = {e["metric"]: e for e in evs}
    assert by["e2e"]["model"] == "qwen" and by["e2e"]["counts"][3] == 2 and by["e2e"]["requests"] == 2
    assert "failed" not in by["e2e"]     # SGLang exports no failure counter


def test_tgi_profile_takes_the_targets_model_and_counts_failures() -> None:
    def text(durs: list[float], ok: int, total: int) -> str:
        return (hist_text("tgi_request_duration", TGI_BUCKETS, durs)
                + hist_text("tgi_request_mean_time_per_token_duration", TGI_BUCKETS, [d / 100 for d in durs])
                + counter_text("tgi_request_count", total, total=False)
                + counter_text("tgi_request_success", ok, total=False))

    conv = TargetConverter(Target("tgi-0", model="bigcode/starcoder"))
    conv.observe(text([0.5], 1, 1), 0.0)
    evs = conv.observe(text([0.5, 0.7, 1.2], 2, 4), 10.0)
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert e2e["model"] == "bigcode/starcoder" and sum(e2e["counts"]) == 2
    assert e2e["requests"] == 3 and e2e["failed"] == 2       # 3 more requests, 1 more success
    assert e2e["bounds_s"] == pytest.approx(TGI_BUCKETS)
    with pytest.raises(ScrapeError, match="give the target a model"):
        TargetConverter(Target("tgi-1")).observe(text([0.5], 1, 1), 0.0)


def test_triton_counters_give_a_mean_per_interval() -> None:
    def text(dur_us: float, ok: int, fail: int) -> str:
        lab = 'model="resnet",version="1"'
        return (f"# TYPE nv_inference_request_success counter\nnv_inference_request_success{{{lab}}} {ok}\n"
                f"# TYPE nv_inference_request_failure counter\nnv_inference_request_failure{{{lab}}} {fail}\n"
                f"# TYPE nv_inference_count counter\nnv_inference_count{{{lab}}} {ok}\n"
                f"# TYPE nv_inference_request_duration_us counter\n"
                f"nv_inference_request_duration_us{{{lab}}} {dur_us}\n")

    conv = TargetConverter(Target("triton-0"))
    conv.observe(text(1_000_000, 10, 0), 0.0)
    (ev,) = conv.observe(text(1_000_000 + 30 * 50_000, 38, 2), 10.0)
    assert conv.profile is not None and conv.profile.name == "triton"
    assert ev["model"] == "resnet" and ev["metric"] == "e2e"
    assert ev["bounds_s"] == [] and ev["counts"] == [30]
    assert ev["sum_s"] == pytest.approx(1.5) and ev["requests"] == 30 and ev["failed"] == 2
    parse_event(ev)


def test_triton_first_response_histogram_in_ms() -> None:
    lab = 'model="llm",version="1"'
    ms = [100.0, 500.0, 2000.0, 5000.0]

    def text(v: list[float]) -> str:
        return (hist_text("nv_inference_first_response_histogram_ms", ms, v, lab)
                + f"# TYPE nv_inference_request_success counter\nnv_inference_request_success{{{lab}}} {len(v)}\n")

    conv = TargetConverter(Target("t", profile="triton"))
    conv.observe(text([50.0]), 0.0)
    (ev,) = conv.observe(text([50.0, 700.0]), 10.0)
    assert ev["metric"] == "ttft" and ev["bounds_s"] == [0.1, 0.5, 2.0, 5.0]
    assert ev["counts"] == [0, 0, 1, 0, 0]


def test_dynamo_profile_openmetrics() -> None:
    lab = 'model="llama"'
    dur = [1.0, 1.9, 3.7, 7.0, 14.0, 27.0, 52.0, 100.0, 190.0, 256.0]

    def text(v: list[float], ok: int, err: int) -> str:
        return (hist_text("dynamo_frontend_request_duration_seconds", dur, v, lab)
                + "# TYPE dynamo_frontend_requests counter\n"
                + f'dynamo_frontend_requests_total{{{lab},endpoint="chat_completions",request_type="stream",'
                  f'status="success"}} {ok}\n'
                + f'dynamo_frontend_requests_total{{{lab},endpoint="chat_completions",request_type="stream",'
                  f'status="error"}} {err}\n'
                + "# EOF\n")

    conv = TargetConverter(Target("dyn-0"))
    conv.observe(text([2.0], 1, 0), 0.0, openmetrics=True)
    (ev,) = conv.observe(text([2.0, 3.0, 300.0], 3, 1), 10.0, openmetrics=True)
    assert ev["counts"][2] == 1 and ev["counts"][-1] == 1
    assert ev["requests"] == 3 and ev["failed"] == 1


def test_bad_text_and_unknown_servers_are_clear_errors() -> None:
    with pytest.raises(ScrapeError, match="not valid"):
        TargetConverter(Target("x")).observe('broken{le="1" 3\n', 0.0)
    with pytest.raises(ScrapeError, match="no known latency histogram"):
        TargetConverter(Target("x")).observe("# TYPE up gauge\nup 1\n", 0.0)
    with pytest.raises(ValueError, match="unknown profile 'vlm'"):
        TargetConverter(Target("x", profile="vlm"))


def test_detect_prefers_the_profile_with_most_names() -> None:
    names = {"vllm:e2e_request_latency_seconds_bucket", "vllm:time_to_first_token_seconds_count",
             "tgi_request_duration_bucket"}
    p = detect(names)
    assert p is not None and p.name == "vllm"
    assert detect({"up"}) is None


def test_mapping_profile_for_another_server() -> None:
    prof = profile_from_mapping({
        "name": "myserver", "model_label": "deployment",
        "histograms": {"e2e": {"name": "my_latency_ms", "scale_s": 0.001}},
        "counters": [{"role": "outcome", "name": "my_requests", "label": "code",
                      "failed_values": ["500"]}]})
    profiles = {**PROFILES, "myserver": prof}
    lab = 'deployment="d1"'

    def text(v: list[float], ok: int, bad: int) -> str:
        return (hist_text("my_latency_ms", [100.0, 250.0, 1000.0], v, lab)
                + f'# TYPE my_requests counter\nmy_requests_total{{{lab},code="200"}} {ok}\n'
                  f'my_requests_total{{{lab},code="500"}} {bad}\n')

    conv = TargetConverter(Target("n", profile="myserver"), profiles)
    conv.observe(text([90.0], 1, 0), 0.0)
    (ev,) = conv.observe(text([90.0, 200.0, 2000.0], 2, 1), 10.0)
    assert ev["bounds_s"] == [0.1, 0.25, 1.0] and ev["counts"] == [0, 1, 0, 1]
    assert ev["model"] == "d1" and ev["requests"] == 2 and ev["failed"] == 1
    for bad, msg in (({"name": "x", "histograms": {"p99": {"name": "a"}}}, "not one of"),
                     ({"name": "x", "histograms": {"e2e": {"name": "a", "scale_s": 0}}}, "scale_s"),
                     ({"name": "x", "histograms": {}}, "at least one"),
                     ({"histograms": {"e2e": {"name": "a"}}}, "'name'")):
        with pytest.raises(ValueError, match=msg):
            profile_from_mapping(bad)


def _federate(ts_ms: int, nodes: dict[str, list[float]], hardware: str = "A100") -> str:
    """One /federate answer: every target's series with instance/job labels and a ms timestamp."""
    out = ["# TYPE vllm:e2e_request_latency_seconds histogram\n"]
    for node, values in nodes.items():
        lab = f'engine="0",hardware="{hardware}",instance="{node}",job="vllm",model_name="m"'
        body = hist_text("vllm:e2e_request_latency_seconds", VLLM_E2E, values, lab, type_line=False)
        out += [line.rstrip("\n") + f" {ts_ms}\n" for line in body.splitlines(keepends=True)]
    return "".join(out)


def test_events_from_capture_many_targets_and_scrapes() -> None:
    capture = (_federate(1_000_000, {"a:8000": [0.2], "b:8000": [0.2]})
               + _federate(1_010_000, {"a:8000": [0.2, 0.4], "b:8000": [0.2, 0.2, 0.9]})
               + _federate(1_020_000, {"a:8000": [0.2, 0.4, 0.6], "b:8000": [0.2]}))
    evs = list(events_from_capture(capture.splitlines(keepends=True)))
    hists = [e for e in evs if e["type"] == "histogram"]
    assert [(e["ts"], e["node_id"], sum(e["counts"])) for e in hists] == [
        (1010.0, "a:8000", 1), (1010.0, "b:8000", 2), (1020.0, "a:8000", 1), (1020.0, "b:8000", 1)]
    assert all(e["hardware"] == "A100" for e in hists)
    assert hists[-1]["instance"] == "b:8000#1020"        # b's counters went down: a restart
    assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)


def test_capture_without_timestamps_is_refused() -> None:
    text = hist_text("vllm:e2e_request_latency_seconds", VLLM_E2E, [0.2], 'instance="a",model_name="m"')
    with pytest.raises(ScrapeError, match="no timestamp"):
        list(events_from_capture(text.splitlines()))


@pytest.mark.parametrize("server", ["vllm", "sglang", "tgi", "triton", "dynamo"])
@pytest.mark.parametrize("openmetrics", [False, True])
def test_the_simulators_expositions_convert(server: str, openmetrics: bool) -> None:
    """scrape-edge's simulated servers (their exact names, labels and buckets) through the converter:
    exact counts per interval, failures, and a restart."""
    import numpy as np

    from tailguard.sim.exposition import NodeExposition

    node = NodeExposition(server)
    accept = "application/openmetrics-text; version=1.0.0" if openmetrics else None

    def scrape(n: NodeExposition, ts: float) -> list[dict[str, Any]]:
        body, ctype = n.render(accept)
        return conv.observe(body.decode(), ts, openmetrics=ctype.startswith("application/openmetrics-text"))

    def serve(n: NodeExposition, k: int, fail: int = 0) -> None:
        lat = np.full(k, 0.7)
        ok = np.arange(k) >= fail
        n.observe("llama", lat, ok, np.full(k, 0.05), np.full(k, 33, dtype=np.int64))

    conv = TargetConverter(Target(f"{server}-0", model="llama"))
    serve(node, 5)
    assert scrape(node, 0.0) == []
    serve(node, 12, fail=2)
    evs = scrape(node, 10.0)
    assert conv.profile is not None and conv.profile.name == server
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert e2e["model"] == "llama" and sum(e2e["counts"]) == 12 and e2e["requests"] == 12
    if e2e["bounds_s"]:
        assert e2e["counts"][bisect.bisect_left(e2e["bounds_s"], 0.7)] == 12
    else:      # Triton's counters: a mean
        assert e2e["sum_s"] / 12 == pytest.approx(0.7)
    if server != "sglang":     # SGLang counts aborts, not errors
        assert e2e["failed"] == 2
    for e in evs:
        parse_event(e)
    restarted = NodeExposition(server)
    serve(restarted, 3)
    evs = scrape(restarted, 20.0)
    e2e = next(e for e in evs if e["metric"] == "e2e")
    assert sum(e2e["counts"]) == 3 and e2e["instance"] == f"{server}-0#20"


def test_a_mapping_file_in_yaml_or_json() -> None:
    from tailguard.scrape.profiles import profiles_from_text

    yaml_text = """
profiles:
  - name: myserver
    model_label: deployment
    histograms:
      e2e: {name: my_latency_ms, scale_s: 0.001}
    counters:
      - {role: outcome, name: my_requests, label: code, failed_values: ["500"]}
"""
    got = profiles_from_text(yaml_text)
    assert set(got) == {"myserver"} and got["myserver"].histograms[0].scale_s == 0.001
    json_text = '{"name": "other", "histograms": {"itl": {"name": ["a_seconds", "b_seconds"]}}}'
    assert profiles_from_text(json_text)["other"].histograms[0].names == ("a_seconds", "b_seconds")
    with pytest.raises(ValueError, match=r"my\.yaml: profile mapping 'x': histograms key 'p99'"):
        profiles_from_text("name: x\nhistograms: {p99: {name: a}}\n", "my.yaml")
    with pytest.raises(ValueError, match="defined twice"):
        profiles_from_text(f"[{json_text}, {json_text}]")
