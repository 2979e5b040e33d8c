"""The one place that reads the environment.

:func:`load` reads every ``TAILGUARD_*`` variable once and returns a frozen,
validated :class:`Settings`. A bad value raises
:class:`~app.core.config.SettingError` naming the variable, the value and what
is allowed; ``tailguard`` turns that into a one-line message and exit code 2.
Unknown ``TAILGUARD_*`` variables are errors too (a typo must not silently
fall back to a default).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from app.core.config import DetectorSettings, SettingError, field_names, parse_overrides

PREFIX = "TAILGUARD_"


@dataclass(frozen=True, slots=True)
class Topics:
    """Kafka topic names (each configurable as ``TAILGUARD_TOPIC_<NAME>``)."""

    latency_events: str = "latency-events"
    window_stats: str = "node-window-stats"
    health_changes: str = "node-health-changes"
    fleet_events: str = "fleet-health-events"
    diagnostics_requests: str = "node-diagnostics-requests"
    diagnostics_results: str = "node-diagnostics-results"
    dead_letter: str = "latency-events-dlq"


@dataclass(frozen=True, slots=True)
class Settings:
    """Service settings: connections, topics, and the detector's settings."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "tailguard"
    app_id: str = "tailguard"
    topic_partitions: int = 8
    metrics_port: int = 9464          # 0 disables the Prometheus endpoint
    web_port: int = 6066              # faust's own web server
    data_dir: str = ""                # faust table data; "" = a per-user temp dir
    log_level: str = "info"
    topics: Topics = field(default_factory=Topics)
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    # observe: the rules run and publish, the routing set keeps every node (P:mode overrides it)
    mode: str = "enforce"
    # ticks of per-node rule statistics kept in Redis for `tailguard explain` (0: none)
    history_ticks: int = 10

    def __post_init__(self) -> None:
        if not self.kafka_bootstrap or not all(_is_host_port(h) for h in self.kafka_bootstrap.split(",")):
            raise SettingError("TAILGUARD_KAFKA_BOOTSTRAP", self.kafka_bootstrap, "host:port[,host:port…]")
        u = urlparse(self.redis_url)
        if u.scheme not in ("redis", "rediss", "unix") or not (u.hostname or u.path):
            raise SettingError("TAILGUARD_REDIS_URL", self.redis_url, "a redis://host:port/db URL")
        if not self.key_prefix or any(c.isspace() for c in self.key_prefix):
            raise SettingError("TAILGUARD_KEY_PREFIX", self.key_prefix, "a non-empty prefix without spaces")
        if not 1 <= self.topic_partitions <= 1024:
            raise SettingError("TAILGUARD_TOPIC_PARTITIONS", self.topic_partitions, "1..1024")
        for name in ("metrics_port", "web_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise SettingError(PREFIX + name.upper(), port, "a TCP port 0..65535")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise SettingError("TAILGUARD_LOG_LEVEL", self.log_level, "debug, info, warning or error")
        for f in dataclasses.fields(Topics):
            name = getattr(self.topics, f.name)
            if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
                raise SettingError(f"TAILGUARD_TOPIC_{f.name.upper()}", name,
                                   "a Kafka topic name: 1-249 of letters, digits, '.', '_', '-'")
        if not 0 <= self.history_ticks <= 100:
            raise SettingError("TAILGUARD_HISTORY_TICKS", self.history_ticks, "0..100 (0 keeps none)")
        if self.mode not in ("observe", "enforce"):
            raise SettingError("TAILGUARD_MODE", self.mode,
                               "observe (publish verdicts, route every node) or enforce")


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _is_host_port(text: str) -> bool:
    host, sep, port = text.strip().rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) <= 65535)


_SERVICE = {f.name: f for f in dataclasses.fields(Settings) if f.name not in ("topics", "detector")}
_TOPICS = tuple(f.name for f in dataclasses.fields(Topics))  # ordered: stable docs and output


def env_names() -> dict[str, str]:
    """Every ``TAILGUARD_*`` variable the code knows, with its default as text."""
    out: dict[str, str] = {}
    s = Settings()
    for name in _SERVICE:
        out[PREFIX + name.upper()] = str(getattr(s, name))
    for name in _TOPICS:
        out[f"{PREFIX}TOPIC_{name.upper()}"] = getattr(s.topics, name)
    for name in field_names():
        out[PREFIX + name.upper()] = str(getattr(s.detector, name))
    return out


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read ``TAILGUARD_*`` from ``environ`` (default ``os.environ``) once.

    ``overrides`` (field names of :class:`Settings`) win over the environment;
    tests and the CLI use them.
    """
    env = dict(os.environ if environ is None else environ)
    known = set(env_names())
    # Variables used only by the shell scripts, not by the program.
    known |= {PREFIX + n for n in ("CACHE", "RUN", "VENV", "PYTHON", "SKIP_STACK")}
    unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise SettingError(unknown[0], env[unknown[0]], "a known TAILGUARD_* variable (see README Configuration)")

    service: dict[str, Any] = {}
    for name, f in _SERVICE.items():
        var = PREFIX + name.upper()
        if var in env:
            text = env[var]
            if f.type in ("int", int):
                try:
                    service[name] = int(text)
                except ValueError:
                    raise SettingError(var, text, "a whole number") from None
            else:
                service[name] = text
    topics = Topics(**{n: env[f"{PREFIX}TOPIC_{n.upper()}"] for n in _TOPICS
                       if f"{PREFIX}TOPIC_{n.upper()}" in env})
    det_pairs = {n: env[PREFIX + n.upper()] for n in field_names() if PREFIX + n.upper() in env}
    # Label every field, so that a cross-field error names the variable too.
    detector = parse_overrides(det_pairs, labels={n: PREFIX + n.upper() for n in field_names()})
    service.update(overrides)
    service.setdefault("topics", topics)
    service.setdefault("detector", detector)
    return Settings(**service)
