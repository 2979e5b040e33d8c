"""The one place that reads the environment.

:func:`load` reads every ``TAILGUARD_*`` variable once and returns a frozen,
validated :class:`Settings`. A bad value raises
:class:`~tailguard.core.contract.config.SettingError` naming the variable, the value and what
is allowed; ``tailguard`` turns that into a one-line message and exit code 2.
Unknown ``TAILGUARD_*`` variables are errors too (a typo must not silently
fall back to a default).

Secrets (:data:`SECRETS`: the Kafka SASL password, the Kafka TLS key password,
the Redis password, the replace webhook URL) are held as :class:`Secret`, whose ``str`` and ``repr``
are ``***``: printing or logging a :class:`Settings` never shows them. Each
also comes from a file, ``TAILGUARD_<NAME>_FILE`` (a mounted secret; one
trailing newline is dropped). A password inside ``TAILGUARD_REDIS_URL`` is
shown as ``***`` by :func:`redact_url`. Turning these settings into client
options is :mod:`tailguard.security`'s job.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

from tailguard.core.contract.config import DetectorSettings, SettingError, field_names, parse_overrides
from tailguard.k8s.config import check_k8s
from tailguard.kafka_security import KafkaSecurity, parse_bool, read_secret
from tailguard.scrape.config import check_scrape
from tailguard.settings_checks import check_allowlist, check_security

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
    replacements: str = "node-replacements"




@dataclass(frozen=True, slots=True)
class Secret:
    """A secret setting: ``str()`` and ``repr()`` show ``***`` (empty when unset)."""

    value: str = field(default="", repr=False)

    def reveal(self) -> str:
        """The secret itself: only for handing it to a client library."""
        return self.value

    def __bool__(self) -> bool:
        return bool(self.value)

    def __str__(self) -> str:
        return "***" if self.value else ""

    def __repr__(self) -> str:
        return "Secret('***')" if self.value else "Secret('')"


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    u = urlparse(url)
    if u.password is None:
        return url
    user = f"{u.username}:" if u.username else ":"
    return u._replace(netloc=u.netloc.replace(f"{user}{u.password}@", f"{user}***@", 1)).geturl()


def as_text(value: object) -> str:
    """A setting's value as ``tailguard settings`` and the README show it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class Settings:
    """Service settings: connections, topics, and the detector's settings."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)  # may hold a password
    key_prefix: str = "tailguard"
    app_id: str = "tailguard"
    topic_partitions: int = 8
    replication_factor: int = 0       # of the topics tailguard creates; 0 = min(3, brokers)
    metrics_port: int = 9464          # 0 disables the Prometheus endpoint
    web_port: int = 6066              # faust's own web server
    data_dir: str = ""                # faust table data; "" = a per-user temp dir
    log_level: str = "info"
    # auto | jemalloc | pymalloc: the worker's allocator (tailguard.streaming.allocator)
    allocator: str = "auto"
    # Listen addresses: loopback unless told otherwise (0.0.0.0 = every interface).
    metrics_host: str = "127.0.0.1"   # the Prometheus endpoint
    web_host: str = "127.0.0.1"       # faust's web server
    proxy_listen: str = "127.0.0.1:8080"  # `tailguard proxy` without --listen
    # Kafka security (every Kafka client of the package; see app/security.py).
    kafka_security_protocol: str = "PLAINTEXT"   # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    kafka_sasl_mechanism: str = "PLAIN"          # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    kafka_sasl_username: str = ""
    kafka_sasl_password: Secret = field(default_factory=Secret)
    kafka_ssl_cafile: str = ""                   # "" = the system's trusted CAs
    kafka_ssl_certfile: str = ""                 # client certificate (mTLS), PEM
    kafka_ssl_keyfile: str = ""                  # its private key, PEM
    kafka_ssl_key_password: Secret = field(default_factory=Secret)
    kafka_ssl_check_hostname: bool = True
    # Redis security: user/password (or in the URL), TLS with rediss://.
    redis_username: str = ""
    redis_password: Secret = field(default_factory=Secret)
    redis_ssl_cafile: str = ""                   # "" = the system's trusted CAs
    redis_ssl_certfile: str = ""                 # client certificate, PEM
    redis_ssl_keyfile: str = ""
    redis_ssl_check_hostname: bool = True
    # Redis Sentinel: with sentinels set, clients ask them for the current primary of
    # redis_sentinel_master (TAILGUARD_REDIS_URL then gives only the db and credentials).
    redis_sentinels: str = ""                    # host:port[,host:port…] of the sentinels
    redis_sentinel_master: str = "tailguard"     # the primary's name in the sentinels' config
    # Redis Cluster: TAILGUARD_REDIS_URL names one node; keys in the hash-tagged layout.
    redis_cluster: bool = False
    key_layout: str = "auto"     # plain | tagged (P:{<model>}:routing …) | auto: tagged on a cluster
    # The replace hook (tailguard.streaming.replace): one action per retired (node, model).
    replace_command: str = ""         # run with /bin/sh -c; node, model, reason in its environment
    # or: POST the retirement as JSON here (a secret: webhook URLs carry tokens)
    replace_webhook_url: Secret = field(default_factory=Secret)
    # names of variables of the worker's environment the command also gets (comma-separated);
    # otherwise only PATH, the TAILGUARD_REPLACE_* settings and the retirement's fields
    replace_env: str = ""
    replace_timeout_s: float = 60.0   # per attempt
    replace_attempts: int = 3         # tries before the outcome is "failed"
    replace_max_age_s: float = 3600.0  # older retirements, first seen (hook newly on), are not acted on
    topics: Topics = field(default_factory=Topics)
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    # observe: the rules run and publish, the routing set keeps every node (P:mode overrides it)
    mode: str = "enforce"
    # observe mode asks nodes' agents for diagnostics only when true (the checks load the GPUs
    # of nodes that observe keeps serving traffic)
    diagnose_in_observe: bool = False
    # ticks of per-node rule statistics kept in Redis for `tailguard explain` (0: none)
    history_ticks: int = 10
    # Allowlist of node ids (docs/operating.md#allowlist): off while the three sources are
    # empty; on, events of other node ids are dead-lettered (reason not_allowlisted).
    allowlist_redis_key: str = ""     # a Redis SET of node ids (on TAILGUARD_REDIS_URL)
    allowlist_file: str = ""          # a file of node ids, one a line, # comments
    allowlist_pattern: str = ""       # node ids matching this regular expression (whole)
    allowlist_refresh_s: float = 30.0  # how often the set and the file are read again
    # Stage 2's messages that Kafka did not take yet (a topic refusing writes, or a tick of more
    # than a budget's worth), kept for retry at most this many bytes; the oldest are dropped
    # (counted) beyond. The default holds a first tick of 100,000 new nodes (two health
    # changes each, ~1.3 KB; docs/performance.md).
    publish_backlog_bytes: int = 256 * 1024 * 1024
    # Allowlist of model names: off while both are empty; on, events of other models are
    # dead-lettered (not_allowlisted) — a flood of model names never reaches a window.
    allowlist_models: str = ""         # model names, comma-separated
    allowlist_model_pattern: str = ""  # model names matching this regular expression (whole)
    # Kubernetes: `tailguard k8s-sync` (docs/kubernetes.md). An empty API URL means in the cluster
    # (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT); an empty namespace, the service
    # account's own (else "default").
    k8s_api_url: str = ""
    k8s_token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    k8s_ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    k8s_namespace: str = ""
    k8s_condition: str = "tailguard.io/routable"   # the readiness gate's condition type
    k8s_node_id: str = "name"         # name | label:<key> | ip:<port>: how a pod maps to a node id
    k8s_model_label: str = "tailguard.io/model"    # the pod label holding the model name
    k8s_lease_name: str = "tailguard-k8s-sync"
    k8s_lease_duration_s: float = 15.0
    k8s_resync_s: float = 30.0        # a full pass over the pods at least this often
    k8s_webhook_listen: str = "127.0.0.1:8443"     # `k8s-sync --webhook` (HTTPS)
    k8s_webhook_certfile: str = ""
    k8s_webhook_keyfile: str = ""
    # `tailguard scrape` (docs/scrape.md): targets, their labels, polling.
    scrape_file_sd: str = ""          # a Prometheus file_sd file (JSON or YAML), watched for changes
    scrape_http_sd: str = ""          # or: a Prometheus http_sd URL
    scrape_sd_refresh_s: float = 30.0  # how often the http_sd URL is read again (the file: on change)
    scrape_interval_s: float = 10.0   # one scrape of every target per interval
    scrape_timeout_s: float = 0.0     # per target and scrape, <= the interval; 0: min(5 s, the interval)
    scrape_concurrency: int = 256     # scrapes in flight at once
    scrape_node_label: str = "instance"   # the target label that is the node id
    scrape_model_label: str = "model"     # the target label naming the model (servers without a model label)
    scrape_hardware_label: str = "hardware"
    scrape_profile_label: str = "tailguard_profile"  # vllm, sglang, tgi, triton, dynamo, auto, a mapping
    scrape_shard: str = ""            # I/N: this process scrapes the targets whose hash mod N is I
    scrape_metrics_port: int = 9465   # the bridge's own Prometheus endpoint (0: none)
    scrape_profiles_file: str = ""    # mappings of other servers' metrics (JSON or YAML), beside the built-in five

    def __post_init__(self) -> None:
        if not self.kafka_bootstrap or not all(_is_host_port(h) for h in self.kafka_bootstrap.split(",")):
            raise SettingError("TAILGUARD_KAFKA_BOOTSTRAP", self.kafka_bootstrap, "host:port[,host:port…]")
        u = urlparse(self.redis_url)
        if u.scheme not in ("redis", "rediss", "unix") or not (u.hostname or u.path):
            raise SettingError("TAILGUARD_REDIS_URL", redact_url(self.redis_url), "a redis://host:port/db URL")
        dbs = parse_qs(u.query).get("db", []) + ([u.path.removeprefix("/")] if u.scheme != "unix" else [])
        if not all(db.isascii() and db.isdigit() for db in dbs if db):
            raise SettingError("TAILGUARD_REDIS_URL", redact_url(self.redis_url),
                               "a redis://host:port/db URL whose db is a number 0, 1, … (below the "
                               "server's `databases`, 16 by default)")
        # faust names topics after the app id: <app id>-judge_since-changelog is the longest.
        _check_topic_name("TAILGUARD_APP_ID", self.app_id, 249 - len("-judge_since-changelog"),
                          " (faust's topics are named <app id>-…)")
        if not self.key_prefix or any(c.isspace() for c in self.key_prefix):
            raise SettingError("TAILGUARD_KEY_PREFIX", self.key_prefix, "a non-empty prefix without spaces")
        if not 1 <= self.topic_partitions <= 1024:
            raise SettingError("TAILGUARD_TOPIC_PARTITIONS", self.topic_partitions, "1..1024")
        if not 0 <= self.replication_factor <= 16:
            raise SettingError("TAILGUARD_REPLICATION_FACTOR", self.replication_factor,
                               "0 (= min(3, brokers)) or a replication factor 1..16")
        for name in ("metrics_port", "web_port", "scrape_metrics_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise SettingError(PREFIX + name.upper(), port, "a TCP port 0..65535")
        for name in ("metrics_host", "web_host"):
            host = getattr(self, name)
            if not host or any(c.isspace() or c == "/" for c in host):
                raise SettingError(PREFIX + name.upper(), host,
                                   "a listen address: an IP or host name, e.g. 127.0.0.1 or 0.0.0.0")
        host, sep, port = self.proxy_listen.rpartition(":")
        if not (sep and host.strip("[]") and port.isdigit() and int(port) <= 65535):
            raise SettingError("TAILGUARD_PROXY_LISTEN", self.proxy_listen,
                               "HOST:PORT, e.g. 127.0.0.1:8080 (0.0.0.0:8080 = every interface)")
        check_security(self)
        if self.redis_sentinels and not all(_is_host_port(h) for h in self.redis_sentinels.split(",")):
            raise SettingError("TAILGUARD_REDIS_SENTINELS", self.redis_sentinels,
                               "host:port[,host:port…] of the Redis sentinels (empty: no Sentinel)")
        if self.redis_sentinels and not self.redis_sentinel_master.strip():
            raise SettingError("TAILGUARD_REDIS_SENTINEL_MASTER", self.redis_sentinel_master,
                               "the name the sentinels monitor the primary under (SENTINEL MONITOR <name> …)")
        _check_cluster(self)
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise SettingError("TAILGUARD_LOG_LEVEL", self.log_level, "debug, info, warning or error")
        _check_replace(self)
        if self.allocator not in ("auto", "jemalloc", "pymalloc"):
            raise SettingError("TAILGUARD_ALLOCATOR", self.allocator, "auto, jemalloc or pymalloc")
        for name in ("replace_timeout_s", "replace_max_age_s"):
            v = getattr(self, name)
            if not (v > 0 and v < float("inf")):
                raise SettingError(PREFIX + name.upper(), v, "a number of seconds > 0")
        if not 1024 <= self.publish_backlog_bytes <= 1 << 40:
            raise SettingError("TAILGUARD_PUBLISH_BACKLOG_BYTES", self.publish_backlog_bytes,
                               "a number of bytes in [1024, 2^40] (default 256 MiB)")
        if not 1 <= self.replace_attempts <= 100:
            raise SettingError("TAILGUARD_REPLACE_ATTEMPTS", self.replace_attempts, "1..100")
        for f in dataclasses.fields(Topics):
            _check_topic_name(f"TAILGUARD_TOPIC_{f.name.upper()}", getattr(self.topics, f.name))
        if not 0 <= self.history_ticks <= 100:
            raise SettingError("TAILGUARD_HISTORY_TICKS", self.history_ticks, "0..100 (0 keeps none)")
        if self.mode not in ("observe", "enforce"):
            raise SettingError("TAILGUARD_MODE", self.mode,
                               "observe (publish verdicts, route every node) or enforce")
        check_allowlist(self)
        check_k8s(self)
        check_scrape(self)

    @property
    def scrape_timeout(self) -> float:
        """The per-target scrape timeout in seconds (``scrape_timeout_s``, 0 resolved)."""
        return self.scrape_timeout_s or min(5.0, self.scrape_interval_s)

    def kafka_security(self) -> KafkaSecurity:
        """The Kafka security values, as :mod:`tailguard.kafka_security` (and the agent) take them."""
        return KafkaSecurity(
            self.kafka_security_protocol, self.kafka_sasl_mechanism, self.kafka_sasl_username,
            self.kafka_sasl_password.reveal(), self.kafka_ssl_cafile, self.kafka_ssl_certfile,
            self.kafka_ssl_keyfile, self.kafka_ssl_key_password.reveal(), self.kafka_ssl_check_hostname)

    @property
    def tagged_keys(self) -> bool:
        """The hash-tagged key layout (TAILGUARD_KEY_LAYOUT; ``auto``: on a Redis Cluster)."""
        return self.key_layout == "tagged" or (self.key_layout == "auto" and self.redis_cluster)

    @property
    def allowlist_on(self) -> bool:
        return self.allowlist_nodes_on or bool(self.allowlist_models or self.allowlist_model_pattern)

    @property
    def allowlist_nodes_on(self) -> bool:
        return bool(self.allowlist_redis_key or self.allowlist_file or self.allowlist_pattern)


# Variables tailguard sets for the commands it runs (replace hook, agent user checks).
HOOK_ENV = ("NODE_ID", "MODEL", "REASON", "RETIRED_TS", "RETIREMENT_ID", "ATTEMPT", "GPUS")

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _check_topic_name(var: str, name: str, max_len: int = 249, why: str = "") -> None:
    """Kafka's rule for topic names; ``why`` says where a shorter ``max_len`` comes from."""
    if not _TOPIC_NAME.fullmatch(name) or len(name) > max_len or name in (".", ".."):
        raise SettingError(var, name, f"a Kafka topic name: 1-{max_len} of letters, digits, "
                                      f"'.', '_', '-'{why}")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_replace(s: Settings) -> None:
    url = s.replace_webhook_url.reveal()
    # The URL is a secret: an error shows its scheme only (a token may be anywhere in it).
    shown = f"{urlparse(url).scheme}://***" if "://" in url else "***"
    if s.replace_command and url:
        raise SettingError("TAILGUARD_REPLACE_WEBHOOK_URL", shown,
                           "empty when TAILGUARD_REPLACE_COMMAND is set (one action per retirement)")
    if url and (urlparse(url).scheme not in ("http", "https") or not urlparse(url).hostname):
        raise SettingError("TAILGUARD_REPLACE_WEBHOOK_URL", shown, "an http(s):// URL")
    names = [n.strip() for n in s.replace_env.split(",") if n.strip()]
    if not all(_ENV_NAME.fullmatch(n) for n in names):
        raise SettingError("TAILGUARD_REPLACE_ENV", s.replace_env,
                           "comma-separated variable names, e.g. KUBECONFIG,HOME")
    secret = {PREFIX + n.upper() for n in SECRETS} | set(secret_file_names())
    for n in names:
        if n in secret:
            raise SettingError("TAILGUARD_REPLACE_ENV", s.replace_env,
                               f"names of variables that hold no tailguard secret (not {n})")


def _check_cluster(s: Settings) -> None:
    if s.key_layout not in ("auto", "plain", "tagged"):
        raise SettingError("TAILGUARD_KEY_LAYOUT", s.key_layout,
                           "auto (tagged on a Redis Cluster, plain otherwise), plain or tagged")
    if s.redis_cluster and s.key_layout == "plain":
        raise SettingError("TAILGUARD_KEY_LAYOUT", s.key_layout, "tagged or auto with "
                           "TAILGUARD_REDIS_CLUSTER=true: a model's keys must share a hash slot")
    u = urlparse(s.redis_url)
    if s.redis_cluster and (u.scheme == "unix" or u.path.strip("/") not in ("", "0")
                            or parse_qs(u.query).get("db", ["0"]) != ["0"]):
        raise SettingError("TAILGUARD_REDIS_URL", redact_url(s.redis_url), "redis://host:port/0 of "
                           "one cluster node with TAILGUARD_REDIS_CLUSTER=true (a cluster has db 0 only)")
    if s.redis_cluster and s.redis_sentinels:
        raise SettingError("TAILGUARD_REDIS_CLUSTER", "true", "false while TAILGUARD_REDIS_SENTINELS "
                           "is set (a Redis Cluster fails over by itself, without sentinels)")


def secret_values(s: Settings) -> list[str]:
    """Every secret's value (and the password in ``TAILGUARD_REDIS_URL``): what must never
    appear in a log or a message (``tailguard.redact.Redactor`` masks them). For the webhook URL,
    also its password, query and long path segments (tokens are often there)."""
    out = [getattr(s, n).reveal() for n in SECRETS if getattr(s, n)]
    for url in (s.redis_url, s.replace_webhook_url.reveal()):
        u = urlparse(url)
        out += [p for p in (u.password, u.query) if p]
    out += [seg for seg in urlparse(s.replace_webhook_url.reveal()).path.split("/") if len(seg) >= 16]
    return out


def allocator_environ(library: str, malloc_conf: str,
                      environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment to re-execute the worker in so that ``library`` (jemalloc) serves
    Python's objects: ``PYTHONMALLOC=malloc``, the library first in ``LD_PRELOAD``,
    ``MALLOC_CONF`` unless set; None when the environment asks for that already."""
    env = dict(os.environ if environ is None else environ)
    preload = env.get("LD_PRELOAD", "").replace(":", " ").split()
    if env.get("PYTHONMALLOC") == "malloc" and library in {os.path.basename(p) for p in preload}:
        return None
    return {"MALLOC_CONF": malloc_conf} | env | {"PYTHONMALLOC": "malloc", "LD_PRELOAD": " ".join([library, *preload])}


def replace_command_env(s: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the replace command starts from (the retirement's fields are added).

    ``PATH``, the ``TAILGUARD_REPLACE_*`` variables that hold no secret, and the variables
    ``TAILGUARD_REPLACE_ENV`` names — nothing else of the worker's environment (its
    passwords stay in the worker).
    """
    env = os.environ if environ is None else environ
    secret = {PREFIX + n.upper() for n in SECRETS} | set(secret_file_names())
    out = {"PATH": env.get("PATH", os.defpath)}
    out |= {k: v for k, v in env.items() if k.startswith(PREFIX + "REPLACE_") and k not in secret}
    for name in (n.strip() for n in s.replace_env.split(",")):
        if name and name in env:
            out[name] = env[name]
    return out


def _is_host_port(text: str) -> bool:
    host, sep, port = text.strip().rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) <= 65535)


_SERVICE = {f.name: f for f in dataclasses.fields(Settings) if f.name not in ("topics", "detector")}
SECRETS = tuple(n for n, f in _SERVICE.items() if f.type in ("Secret", Secret))
# Variables used only by the shell scripts (scripts/lib/common.sh), not by the program.
SCRIPT_ONLY = tuple(PREFIX + n for n in (
    "CACHE", "RUN", "VENV", "PYTHON", "SKIP_STACK", "KAFKA_PORT", "KAFKA_CONTROLLER_PORT",
    "KAFKA_SASL_SSL_PORT", "KAFKA_BROKERS", "REDIS_PORT", "REDIS_TLS_PORT", "REDIS_HA_PORT",
    "REDIS_CLUSTER_PORT", "REDIS_CLUSTER_REPLICAS", "TEST_WORKERS",
    # scripts/k8s (the test control plane)
    "K8S_API_PORT", "K8S_ETCD_PORT", "K8S_KCM_PORT", "K8S_KWOK_PORT"))


def secret_file_names() -> dict[str, str]:
    """``TAILGUARD_<SECRET>_FILE`` → the secret's own variable."""
    return {f"{PREFIX}{n.upper()}_FILE": PREFIX + n.upper() for n in SECRETS}
_TOPICS = tuple(f.name for f in dataclasses.fields(Topics))  # ordered: stable docs and output


def env_names() -> dict[str, str]:
    """Every ``TAILGUARD_*`` variable the code knows, with its default as text."""
    out: dict[str, str] = {}
    s = Settings()
    for name in _SERVICE:
        out[PREFIX + name.upper()] = as_text(getattr(s, name))
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
    known = set(env_names()) | set(SCRIPT_ONLY) | set(secret_file_names())
    # What the replace hook and the agent's user checks put in their commands' environment.
    known |= {PREFIX + n for n in HOOK_ENV}
    unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise SettingError(unknown[0], env[unknown[0]], "a known TAILGUARD_* variable (see docs/configuration.md)")

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
            elif f.type in ("bool", bool):
                service[name] = _parse_bool(var, text)
            elif name in SECRETS:
                service[name] = Secret(text)
            elif f.type in ("float", float):
                try:
                    service[name] = float(text)
                except ValueError:
                    raise SettingError(var, text, "a number") from None
            else:
                service[name] = text
    for file_var, var in secret_file_names().items():
        if file_var in env:
            if var in env:
                raise SettingError(file_var, env[file_var], f"unset while {var} is set (give the secret once)")
            service[var.removeprefix(PREFIX).lower()] = Secret(_read_secret(file_var, env[file_var]))
    topics = Topics(**{n: env[f"{PREFIX}TOPIC_{n.upper()}"] for n in _TOPICS
                       if f"{PREFIX}TOPIC_{n.upper()}" in env})
    det_pairs = {n: env[PREFIX + n.upper()] for n in field_names() if PREFIX + n.upper() in env}
    # Label every field, so that a cross-field error names the variable too.
    detector = parse_overrides(det_pairs, labels={n: PREFIX + n.upper() for n in field_names()})
    if "TAILGUARD_K8S_API_URL" not in env and env.get("KUBERNETES_SERVICE_HOST"):
        host = env["KUBERNETES_SERVICE_HOST"]   # in a pod: the apiserver's Service
        host = f"[{host}]" if ":" in host else host
        service["k8s_api_url"] = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
    service.update(overrides)
    service.setdefault("topics", topics)
    service.setdefault("detector", detector)
    return Settings(**service)


def parse_set(items: list[str], base: DetectorSettings | None = None) -> DetectorSettings:
    """``--set KEY=VALUE`` arguments (``tailguard worker``, ``replay``) over ``base``.

    An argument without ``=`` or without a key is refused as not ``KEY=VALUE``; a bad
    value's error names ``--set KEY``.
    """
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingError("--set", item, "KEY=VALUE with KEY one of: " + ", ".join(field_names()))
        pairs[key.strip()] = value.strip()
    return parse_overrides(pairs, base, labels={k: f"--set {k}" for k in pairs})


def _parse_bool(var: str, text: str) -> bool:
    return parse_bool(var, text, SettingError)


def _read_secret(var: str, path: str) -> str:
    return read_secret(var, path, SettingError)
