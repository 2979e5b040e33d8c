"""Kafka and Redis security: the one place that turns settings into client options.

Every Kafka and Redis client of the package gets its security options here (the Kafka part
is :mod:`tailguard.kafka_security`'s, which the diagnostics agent uses too), from the
``TAILGUARD_KAFKA_*`` / ``TAILGUARD_REDIS_*`` settings:

* :func:`kafka_client_options` — keyword arguments for aiokafka's producer, consumer and
  admin client (and ``aiokafka.conn.create_conn``): ``security_protocol``, ``sasl_*``,
  ``ssl_context``;
* :func:`faust_broker_credentials` — the same as faust's ``broker_credentials``;
* :func:`redis_client_options` — ``username``, ``password`` and the ``ssl_*`` arguments of
  ``redis.asyncio.Redis.from_url`` (TLS with ``rediss://``).

Guarantees: a TLS file that is missing or not PEM raises
:class:`~tailguard.core.contract.config.SettingError` naming the setting, before any
connection. :func:`check_kafka` (and :func:`tailguard.routing.client.check_redis`) connect
once, within a timeout, and turn any refusal (a login, an untrusted certificate, ``DB index is
out of range``) into :class:`AccessRefused`, a ``SettingError`` naming the setting to fix; an
unreachable server is the caller's business. Nothing here logs, prints or shows a secret.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlparse

from tailguard import kafka_security
from tailguard.core.contract.config import SettingError
from tailguard.settings import Settings

TLS_PROTOCOLS = kafka_security.TLS_PROTOCOLS


class AccessRefused(SettingError):
    """A server refused tailguard's credentials or certificate; ``name`` is the setting to fix."""

    def __init__(self, name: str, problem: str) -> None:
        ValueError.__init__(self, f"{name}: {problem}")
        self.name, self.value, self.allowed = name, "***", problem


def tls_context(var_prefix: str, *, cafile: str, certfile: str, keyfile: str,
                key_password: str, check_hostname: bool) -> ssl.SSLContext:
    """A client TLS context; ``var_prefix`` (``TAILGUARD_KAFKA_SSL``) names the settings in errors."""
    return kafka_security.tls_context(var_prefix, cafile=cafile, certfile=certfile, keyfile=keyfile,
                                      key_password=key_password, check_hostname=check_hostname,
                                      error=SettingError)


def kafka_ssl_context(s: Settings) -> ssl.SSLContext | None:
    """The TLS context for Kafka, or None when the protocol uses no TLS."""
    return kafka_security.ssl_context(s.kafka_security(), SettingError)


def kafka_client_options(s: Settings) -> dict[str, Any]:
    """Security keyword arguments for any aiokafka client (no ``bootstrap_servers``)."""
    return kafka_security.client_options(s.kafka_security(), SettingError)


def faust_broker_credentials(s: Settings) -> Any:
    """faust's ``broker_credentials`` for the settings (None for PLAINTEXT)."""
    import faust

    ctx = kafka_ssl_context(s)
    if s.kafka_security_protocol.startswith("SASL_"):
        return faust.SASLCredentials(username=s.kafka_sasl_username,
                                     password=s.kafka_sasl_password.reveal(),
                                     ssl_context=ctx, mechanism=s.kafka_sasl_mechanism)
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None


def redis_client_options(s: Settings) -> dict[str, Any]:
    """Keyword arguments for ``Redis.from_url(s.redis_url, …)``: credentials and TLS files."""
    opts: dict[str, Any] = {}
    if s.redis_username:
        opts["username"] = s.redis_username
    if s.redis_password:
        opts["password"] = s.redis_password.reveal()
    if urlparse(s.redis_url).scheme == "rediss":
        # Built once to check the files (missing, not PEM, key mismatch) with a clear error.
        tls_context("TAILGUARD_REDIS_SSL", cafile=s.redis_ssl_cafile, certfile=s.redis_ssl_certfile,
                    keyfile=s.redis_ssl_keyfile, key_password="",
                    check_hostname=s.redis_ssl_check_hostname)
        opts.update(ssl_cert_reqs="required", ssl_check_hostname=s.redis_ssl_check_hostname,
                    ssl_ca_certs=s.redis_ssl_cafile or None,
                    ssl_certfile=s.redis_ssl_certfile or None,
                    ssl_keyfile=s.redis_ssl_keyfile or None)
    return opts


# -- start-up checks ------------------------------------------------------------------


def _cert_problem(e: BaseException, var_prefix: str, cafile: str, where: str) -> AccessRefused | None:
    """An :class:`AccessRefused` for a TLS failure anywhere in ``e``'s chain, else None."""
    problem = kafka_security.cert_refusal(e, var_prefix, cafile, where)
    return None if problem is None else AccessRefused(problem.name, problem.problem)


async def check_kafka(s: Settings, *, timeout_s: float = 10.0) -> None:
    """Connect once to a bootstrap server with the security settings (see module docstring)."""
    try:
        await kafka_security.check(s.kafka_security(), s.kafka_bootstrap, SettingError,
                                   timeout_s=timeout_s)
    except kafka_security.KafkaRefused as e:
        raise AccessRefused(e.name, e.problem) from None
