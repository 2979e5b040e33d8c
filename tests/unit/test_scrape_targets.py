"""`tailguard scrape`'s target list: an http_sd endpoint on loopback, refreshes, failures, shards."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tailguard.scrape.run import Targets
from tailguard.scrape.sd import SdError, shard_of
from tailguard.settings import Settings

GROUPS = [{"targets": [f"10.0.0.{i}:8000" for i in range(1, 31)], "labels": {"tailguard_profile": "vllm"}}]


async def serve(answers: list[tuple[int, str]]) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.Response:
        status, body = answers[0] if len(answers) == 1 else answers.pop(0)
        return web.Response(status=status, text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/targets", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/targets"


async def test_http_sd_is_read_every_refresh_and_a_failure_keeps_the_last_list(
        caplog: pytest.LogCaptureFixture) -> None:
    answers = [(200, json.dumps(GROUPS)), (500, "oops"), (500, "oops"), (200, json.dumps(GROUPS[:0]))]
    runner, url = await serve(answers)
    try:
        async with aiohttp.ClientSession() as http:
            t = Targets(Settings(scrape_http_sd=url, scrape_sd_refresh_s=0.05), http)
            first = await t.poll(first=True)
            assert first is not None and len(first) == 30 and first[0].profile == "vllm"
            assert await t.poll() is None                 # within the refresh: not read again
            with caplog.at_level(logging.ERROR, logger="tailguard.scrape"):
                for _ in range(2):
                    t._next_http = 0.0                    # the refresh is due
                    assert await t.poll() is None         # HTTP 500: the last good list stays
            assert sum("HTTP 500" in r.getMessage() for r in caplog.records) == 1   # logged once
            t._next_http = 0.0
            assert await t.poll() == []
    finally:
        await runner.cleanup()


async def test_a_bad_http_sd_at_start_raises_naming_the_url() -> None:
    runner, url = await serve([(200, '{"targets": []}')])
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(SdError, match=f"^{url}: a list of target groups"):
                await Targets(Settings(scrape_http_sd=url), http).poll(first=True)
    finally:
        await runner.cleanup()


async def test_a_shard_gets_its_part_of_the_list() -> None:
    runner, url = await serve([(200, json.dumps(GROUPS))])
    try:
        async with aiohttp.ClientSession() as http:
            got = await Targets(Settings(scrape_http_sd=url, scrape_shard="1/3"), http).poll(first=True)
    finally:
        await runner.cleanup()
    assert got and len(got) < 30 and all(shard_of(t, 3) == 1 for t in got)


MAPPING = """
profiles:
  - name: myserver
    model_label: deployment
    histograms:
      e2e: {name: my_request_latency_ms, scale_s: 0.001}
"""


def exposition(count_le_500: int, count_all: int) -> str:
    return ("# TYPE my_request_latency_ms histogram\n"
            f'my_request_latency_ms_bucket{{deployment="d1",le="500"}} {count_le_500}\n'
            f'my_request_latency_ms_bucket{{deployment="d1",le="+Inf"}} {count_all}\n'
            f'my_request_latency_ms_count{{deployment="d1"}} {count_all}\n'
            f'my_request_latency_ms_sum{{deployment="d1"}} {count_all * 300.0}\n')


def test_a_mapping_file_adds_profiles_the_targets_can_name(tmp_path: Path) -> None:
    from tailguard.scrape.run import converter_factory
    from tailguard.scrape.sd import ScrapeTarget

    path = tmp_path / "servers.yml"
    path.write_text(MAPPING)
    make = converter_factory(Settings(scrape_profiles_file=str(path)))
    conv = make(ScrapeTarget(url="http://h:1/metrics", node_id="n1", model=None, hardware=None, profile="myserver"))
    assert conv.observe(exposition(1, 2), 100.0) == []
    (ev,) = conv.observe(exposition(4, 6), 110.0)
    assert (ev["model"], ev["metric"], ev["bounds_s"], ev["counts"]) == ("d1", "e2e", [0.5], [3, 1])


def test_a_bad_mapping_file_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tailguard import cli

    path = tmp_path / "servers.yml"
    path.write_text("profiles:\n  - name: x\n    histograms: {}\n")
    targets = tmp_path / "t.json"
    targets.write_text("[]")
    assert cli.main(["scrape", "--file-sd", str(targets), "--profiles", str(path), "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"tailguard scrape: TAILGUARD_SCRAPE_PROFILES_FILE='{path}'"), err
    assert "'histograms' must map at least one of e2e" in err
    assert cli.main(["scrape", "--file-sd", str(targets), "--profiles", str(tmp_path / "nope.yml"),
                     "--metrics-port", "0"]) == 2
    assert "a readable mapping file" in capsys.readouterr().err
