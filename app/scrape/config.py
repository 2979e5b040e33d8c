"""The ``TAILGUARD_SCRAPE_*`` settings' rules (pure): what :class:`tailguard.settings.Settings` checks for
``tailguard scrape``, kept beside the code that uses them. Reads no environment."""

from __future__ import annotations

import re
from typing import Protocol
from urllib.parse import urlparse

from tailguard.core.contract.config import SettingError

PREFIX = "TAILGUARD_"
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_shard(var: str, text: str) -> tuple[int, int]:
    """``"I/N"`` → ``(I, N)`` with ``0 <= I < N``; ``""`` → ``(0, 1)`` (every target)."""
    if not text:
        return 0, 1
    i, sep, n = text.partition("/")
    if sep and i.isdigit() and n.isdigit() and 0 <= int(i) < int(n) <= 10_000:
        return int(i), int(n)
    raise SettingError(var, text, "I/N with 0 <= I < N, e.g. 0/3 (this process scrapes one third)")


class ScrapeSettings(Protocol):
    """The settings :func:`check_scrape` reads (:class:`tailguard.settings.Settings` has them; typed
    here so that this module does not import the settings module that calls it)."""

    @property
    def scrape_file_sd(self) -> str: ...
    @property
    def scrape_http_sd(self) -> str: ...
    @property
    def scrape_interval_s(self) -> float: ...
    @property
    def scrape_sd_refresh_s(self) -> float: ...
    @property
    def scrape_timeout_s(self) -> float: ...
    @property
    def scrape_concurrency(self) -> int: ...
    @property
    def scrape_node_label(self) -> str: ...
    @property
    def scrape_model_label(self) -> str: ...
    @property
    def scrape_hardware_label(self) -> str: ...
    @property
    def scrape_profile_label(self) -> str: ...
    @property
    def scrape_shard(self) -> str: ...


def check_scrape(s: ScrapeSettings) -> None:
    """Validate the ``TAILGUARD_SCRAPE_*`` settings (called by :class:`tailguard.settings.Settings`)."""
    if s.scrape_file_sd and s.scrape_http_sd:
        raise SettingError("TAILGUARD_SCRAPE_HTTP_SD", s.scrape_http_sd,
                           "empty when TAILGUARD_SCRAPE_FILE_SD is set (one source of targets)")
    if s.scrape_http_sd and urlparse(s.scrape_http_sd).scheme not in ("http", "https"):
        raise SettingError("TAILGUARD_SCRAPE_HTTP_SD", s.scrape_http_sd, "an http(s):// URL")
    for name, lo, hi in (("scrape_interval_s", 0.05, 3600.0), ("scrape_sd_refresh_s", 0.05, 86_400.0)):
        v = getattr(s, name)
        if not lo <= v <= hi:
            raise SettingError(PREFIX + name.upper(), v, f"a number of seconds in [{lo:g}, {hi:g}]")
    if not 0 <= s.scrape_timeout_s <= s.scrape_interval_s:
        raise SettingError("TAILGUARD_SCRAPE_TIMEOUT_S", s.scrape_timeout_s,
                           f"a number of seconds <= TAILGUARD_SCRAPE_INTERVAL_S ({s.scrape_interval_s:g}); "
                           "0: 5 s or the interval, whichever is shorter")
    if not 1 <= s.scrape_concurrency <= 10_000:
        raise SettingError("TAILGUARD_SCRAPE_CONCURRENCY", s.scrape_concurrency, "1..10000")
    for name in ("scrape_node_label", "scrape_model_label", "scrape_hardware_label", "scrape_profile_label"):
        if not _LABEL_NAME.fullmatch(getattr(s, name)):
            raise SettingError(PREFIX + name.upper(), getattr(s, name),
                               "a Prometheus label name: letters, digits, '_', not starting with a digit")
    parse_shard("TAILGUARD_SCRAPE_SHARD", s.scrape_shard)
