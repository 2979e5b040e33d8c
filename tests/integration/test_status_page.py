"""The worker's status page in a real headless Chromium (Debian's chromium + chromedriver,
driven by Selenium): a worker with a simulated fleet on the real Kafka and Redis, a node
turns slow, and the page — refreshing itself — shows it leave routing. Node ids holding
markup and control characters show as text. A screenshot goes to out/status-page.png."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_harness import ROOT, Feeder, free_port, routing, running_worker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EVIL = '<img src=x onerror="window.pwned=1">\x07bell'
NODES = ["n0", "n1", "n2", "n3", "slow", EVIL]
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian's packages (scripts/test installs them)."""
    missing = [p for p in ("chromium", "chromedriver") if shutil.which(p) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: scripts/test installs them "
                    "(apt-get install chromium chromium-driver)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,1100"):
        opts.add_argument(arg)
    opts.binary_location = shutil.which("chromium") or "chromium"
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _row(driver: Any, node: str) -> dict[str, str] | None:
    got: dict[str, str] | None = driver.execute_script(
        """const want = arguments[0];
           for (const tr of document.querySelectorAll('tr.node')) {
             if (tr.getAttribute('data-node') === want) {
               return {routed: tr.getAttribute('data-routed'), state: tr.getAttribute('data-state'),
                       id: tr.querySelector('.node-id').textContent, text: tr.textContent,
                       spark: tr.querySelectorAll('svg.spark polyline').length};
             }
           }
           return null;""", node)
    return got


async def test_page_shows_a_slow_node_leave_routing(kafka_bootstrap: str, redis_url: str,
                                                    unique_name: Callable[[str], str],
                                                    tmp_path: Path, browser: Any) -> None:
    port = free_port()
    async with (running_worker(kafka_bootstrap, redis_url, unique_name("page"), tmp_path,
                               # a site whose id rule lets markup and control characters
                               # through (the default rule dead-letters EVIL): the page still
                               # shows it as text
                               extra={"TAILGUARD_WEB_PORT": str(port),
                                      "TAILGUARD_ID_PATTERN": "[^|]{1,128}"}) as (env, r, worker),
                Feeder(kafka_bootstrap, env.topic("latency_events"), {"llm": NODES}) as feeder):
        async def all_routed() -> bool:
            return await routing(r, env.name, "llm") == set(NODES)
        await wait_for(all_routed, 60, "every node in routing", worker.tail)
        url = f"http://127.0.0.1:{port}/tailguard/"
        await asyncio.to_thread(browser.get, url)

        async def row(node: str, routed: str) -> dict[str, str] | None:
            got = await asyncio.to_thread(_row, browser, node)
            return got if got is not None and got["routed"] == routed else None
        await wait_for(lambda: row("slow", "yes"), 30, "the page to show the slow node routed",
                       worker.tail)

        feeder.slow.add(("slow", "llm"))       # the node turns slow now
        gone = await wait_for(lambda: row("slow", "no"), 60,
                              "the page to show the slow node out of routing", worker.tail)
        assert gone["state"] in ("unhealthy", "quarantined"), gone
        assert await routing(r, env.name, "llm") == set(NODES) - {"slow"}
        # A refresh or two later the sparkline and the events show the exit: polled (the page
        # refreshes every 2 s), then checked on what the page shows then.
        async def exit_shown() -> tuple[dict[str, Any] | None, list[str]] | None:
            slow = await asyncio.to_thread(_row, browser, "slow")
            events = await asyncio.to_thread(browser.execute_script,
                                             "return [...document.querySelectorAll('ul.events li')]"
                                             ".map(li => li.textContent)")
            shown = (slow is not None and slow["spark"] >= 1
                     and any("slow:" in e and "out of routing" in e for e in events))
            return (slow, events) if shown else None
        slow, events = await wait_for(exit_shown, 30, "the sparkline and events to show the exit",
                                      worker.tail)
        assert slow is not None and slow["spark"] >= 1, slow
        assert any("slow:" in e and "out of routing" in e for e in events), events

        # Markup in a node id is text: no <img> was created, its handler never ran, and the
        # control character is shown escaped.
        evil = await asyncio.to_thread(_row, browser, EVIL)
        assert evil is not None and evil["id"] == EVIL.replace("\x07", "\\x07"), evil
        assert await asyncio.to_thread(browser.execute_script,
                                       "return document.querySelectorAll('img').length") == 0
        assert await asyncio.to_thread(browser.execute_script,
                                       "return window.pwned === undefined") is True

        out = ROOT / "out"
        out.mkdir(exist_ok=True)
        assert await asyncio.to_thread(browser.save_screenshot, str(out / "status-page.png"))

        # The JSON behind the page: every model of the Redis, the same routing.
        with urllib.request.urlopen(url + "status.json", timeout=10) as resp:
            data = json.loads(resp.read())
        (model,) = data["models"]
        assert model["model"] == "llm" and set(model["routing"]) == set(NODES) - {"slow"}
