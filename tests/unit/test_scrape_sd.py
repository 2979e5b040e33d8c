"""Targets from Prometheus service discovery: file_sd (JSON, YAML), http_sd bodies, sharding."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tailguard.scrape.sd import (
    FileSource,
    HttpSource,
    LabelNames,
    ScrapeTarget,
    SdError,
    in_shard,
    parse_groups,
    shard_of,
)

GROUPS = [
    {"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"hardware": "H100", "tailguard_profile": "vllm"}},
    {"targets": ["10.0.0.3:9000"], "labels": {"instance": "tgi-0", "model": "mistral", "__scheme__": "https",
                                             "__metrics_path__": "/prom"}},
]


def test_groups_become_targets_with_prometheus_defaults() -> None:
    a, b, c = parse_groups(GROUPS, "t.json")
    assert a == ScrapeTarget(url="http://10.0.0.1:8000/metrics", node_id="10.0.0.1:8000", model=None,
                             hardware="H100", profile="vllm",
                             labels=(("hardware", "H100"), ("tailguard_profile", "vllm")))
    assert b.node_id == "10.0.0.2:8000"
    assert (c.url, c.node_id, c.model, c.hardware, c.profile) == \
        ("https://10.0.0.3:9000/prom", "tgi-0", "mistral", None, "auto")


def test_label_names_are_configurable() -> None:
    groups = [{"targets": ["h:1"], "labels": {"node": "n1", "served": "m", "gpu": "L4", "server": "tgi"}}]
    (t,) = parse_groups(groups, "t.json", LabelNames(node="node", model="served", hardware="gpu", profile="server"))
    assert (t.node_id, t.model, t.hardware, t.profile) == ("n1", "m", "L4", "tgi")


@pytest.mark.parametrize("data, problem", [
    ({"targets": []}, "a list of target groups"),
    (["x"], "group 0: an object"),
    ([{"targets": "h:1"}], "group 0: an object"),
    ([{"targets": ["h:1"], "labels": {"a": 1}}], "labels"),
    ([{"targets": ["http://h:1/metrics"]}], "is not host:port"),
    ([{"targets": ["h:1"], "labels": {"instance": "bad id"}}], "node id 'bad id'"),
    ([{"targets": ["h:1"], "labels": {"__scheme__": "ftp"}}], "__scheme__"),
])
def test_bad_lists_name_the_source_and_the_problem(data: object, problem: str) -> None:
    with pytest.raises(SdError, match=r"^t\.json: ") as e:
        parse_groups(data, "t.json")
    assert problem in str(e.value)


def test_file_source_reads_json_and_yaml_and_only_again_on_change(tmp_path: Path) -> None:
    p = tmp_path / "targets.yml"
    p.write_text("- targets: ['h:1']\n  labels: {instance: n1}\n")
    src = FileSource(str(p))
    assert [t.node_id for t in src.poll() or []] == ["n1"]
    assert src.poll() is None
    p.write_text(json.dumps([{"targets": ["h:1", "h:2"]}]))
    os.utime(p, ns=(1, 10**18))          # a new mtime even within the filesystem's resolution
    assert [t.node_id for t in src.poll() or []] == ["h:1", "h:2"]


def test_file_source_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SdError, match=r"missing\.json: cannot read"):
        FileSource(str(tmp_path / "missing.json")).poll()
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(SdError, match=r"bad\.json: not JSON"):
        FileSource(str(bad)).poll()


def test_http_sd_body() -> None:
    src = HttpSource("http://sd:1/targets")
    assert [t.node_id for t in src.parse(200, json.dumps(GROUPS).encode())][-1] == "tgi-0"
    with pytest.raises(SdError, match="http://sd:1/targets: HTTP 500"):
        src.parse(500, b"")


def test_shards_split_a_list_without_overlap_and_stably() -> None:
    targets = parse_groups([{"targets": [f"10.0.{i // 250}.{i % 250}:8000" for i in range(600)]}], "t")
    parts = [in_shard(targets, i, 3) for i in range(3)]
    assert sorted(t.url for p in parts for t in p) == sorted(t.url for t in targets)
    assert all(120 < len(p) < 280 for p in parts)
    # The same target lands in the same shard whatever else is in the list.
    assert shard_of(targets[7], 3) == shard_of(parse_groups([{"targets": ["10.0.0.7:8000"]}], "t")[0], 3)


def test_scrape_without_targets_names_the_setting(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tailguard import cli

    for var in ("TAILGUARD_SCRAPE_FILE_SD", "TAILGUARD_SCRAPE_HTTP_SD"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main(["scrape", "--interval-s", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tailguard scrape: TAILGUARD_SCRAPE_FILE_SD") and "--file-sd" in err


def test_scrape_timeout_above_the_interval_names_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from tailguard import cli

    assert cli.main(["scrape", "--file-sd", "t.json", "--interval-s", "2", "--timeout-s", "3"]) == 2
    assert "TAILGUARD_SCRAPE_TIMEOUT_S" in capsys.readouterr().err


def test_a_bad_target_file_at_start_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tailguard.scrape import run

    async def no_kafka_check(*_: object, **__: object) -> None:
        return None

    monkeypatch.setattr("tailguard.security.check_kafka", no_kafka_check)
    bad = tmp_path / "t.json"
    bad.write_text('[{"targets": ["h:1"], "labels": {"instance": "two words"}}]')
    assert run.main(["--file-sd", str(bad), "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"tailguard scrape: {bad}: group 0: node id 'two words'")


def test_the_default_timeout_is_five_seconds_or_the_interval() -> None:
    from tailguard.settings import Settings

    assert Settings().scrape_timeout == 5.0
    assert Settings(scrape_interval_s=2.0).scrape_timeout == 2.0
    assert Settings(scrape_interval_s=2.0, scrape_timeout_s=0.5).scrape_timeout == 0.5
