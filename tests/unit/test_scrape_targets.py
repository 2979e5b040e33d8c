"""`tailguard scrape`'s target list: an http_sd endpoint on loopback, refreshes, failures, shards."""

from __future__ import annotations

import json
import logging

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
