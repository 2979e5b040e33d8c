"""Kafka and Redis security: the one place that turns settings into client options.

Every Kafka and Redis client of the package gets its security options here,
from the ``TAILGUARD_KAFKA_*`` / ``TAILGUARD_REDIS_*`` settings
(:class:`tailguard.settings.Settings`):

* :func:`kafka_client_options` — keyword arguments for aiokafka's producer,
  consumer and admin client (and ``aiokafka.conn.create_conn``):
  ``security_protocol``, ``sasl_*``, ``ssl_context``;
* :func:`faust_broker_credentials` — the same for faust's ``broker_credentials``
  (``faust.SASLCredentials`` / ``faust.SSLCredentials``);
* :func:`redis_client_options` — ``username``, ``password`` and the ``ssl_*``
  arguments of ``redis.asyncio.Redis.from_url`` (TLS with ``rediss://``).

Guarantees: a TLS file that is missing or not PEM raises
:class:`~tailguard.core.contract.config.SettingError` naming the setting, before any
connection. :func:`check_kafka` (and, for Redis,
:func:`tailguard.routing.client.check_redis`, which builds on this module) connect once, within a
timeout, and turn a refused login or an untrusted certificate into
:class:`AccessRefused` — a ``SettingError`` whose one-line message names the
setting to fix (the ``tailguard`` command prints it, exit 2), and so does any other
refusal of the connection (``DB index is out of range``: TAILGUARD_REDIS_URL). An unreachable
server is not their business: they return, and the caller's own retry or
error applies. No function here logs, prints or puts a secret into a message.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any
from urllib.parse import urlparse

from tailguard.core.contract.config import SettingError
from tailguard.settings import Settings

TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class AccessRefused(SettingError):
    """A server refused tailguard's credentials or certificate; ``name`` is the setting to fix."""

    def __init__(self, name: str, problem: str) -> None:
        ValueError.__init__(self, f"{name}: {problem}")
        self.name, self.value, self.allowed = name, "***", problem


def _readable(var: str, path: str, what: str) -> str:
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise SettingError(var, path, f"a readable {what}")
    return path


def tls_context(var_prefix: str, *, cafile: str, certfile: str, keyfile: str,
                key_password: str, check_hostname: bool) -> ssl.SSLContext:
    """A client TLS context; ``var_prefix`` (``TAILGUARD_KAFKA_SSL``) names the settings in errors."""
    ca = _readable(f"{var_prefix}_CAFILE", cafile, "PEM file of CA certificates") if cafile else None
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except ssl.SSLError as e:
        raise SettingError(f"{var_prefix}_CAFILE", cafile,
                           f"a PEM file of CA certificates ({e.reason or e})") from None
    if certfile:
        cert = _readable(f"{var_prefix}_CERTFILE", certfile, "PEM client certificate")
        key = _readable(f"{var_prefix}_KEYFILE", keyfile, "PEM private key") if keyfile else None
        try:
            ctx.load_cert_chain(cert, key, password=key_password or None)
        except ssl.SSLError as e:
            raise SettingError(f"{var_prefix}_CERTFILE", certfile,
                               f"a PEM client certificate whose key matches {var_prefix}_KEYFILE "
                               f"(and {var_prefix.removesuffix('_SSL')}_SSL_KEY_PASSWORD if the key "
                               f"is encrypted): {e.reason or e}") from None
    ctx.check_hostname = check_hostname
    return ctx


def kafka_ssl_context(s: Settings) -> ssl.SSLContext | None:
    """The TLS context for Kafka, or None when the protocol uses no TLS."""
    if s.kafka_security_protocol not in TLS_PROTOCOLS:
        return None
    return tls_context("TAILGUARD_KAFKA_SSL", cafile=s.kafka_ssl_cafile,
                       certfile=s.kafka_ssl_certfile, keyfile=s.kafka_ssl_keyfile,
                       key_password=s.kafka_ssl_key_password.reveal(),
                       check_hostname=s.kafka_ssl_check_hostname)


def kafka_client_options(s: Settings) -> dict[str, Any]:
    """Security keyword arguments for any aiokafka client (no ``bootstrap_servers``)."""
    opts: dict[str, Any] = {"security_protocol": s.kafka_security_protocol}
    ctx = kafka_ssl_context(s)
    if ctx is not None:
        opts["ssl_context"] = ctx
    if s.kafka_security_protocol.startswith("SASL_"):
        opts.update(sasl_mechanism=s.kafka_sasl_mechanism,
                    sasl_plain_username=s.kafka_sasl_username,
                    sasl_plain_password=s.kafka_sasl_password.reveal())
    return opts


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
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            reason = seen.verify_message or str(seen)
            if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
                return AccessRefused(f"{var_prefix}_CHECK_HOSTNAME", (
                    f"the certificate of {where} does not name that host ({reason}): connect by a "
                    f"name the certificate holds, or set {var_prefix}_CHECK_HOSTNAME=false"))
            trusted = f"the CA file {cafile}" if cafile else "the system's CAs"
            return AccessRefused(f"{var_prefix}_CAFILE", (
                f"the certificate of {where} is not trusted by {trusted} ({reason}): point "
                f"{var_prefix}_CAFILE at the CA that signed it"))
        if isinstance(seen, ssl.SSLError):
            return AccessRefused(f"{var_prefix}_CAFILE", (
                f"the TLS handshake with {where} failed ({seen.reason or seen}): check that it "
                "speaks TLS there and that the CA and client certificate files are right"))
        seen = seen.__cause__ or seen.__context__
    return None


def _kafka_problem(s: Settings, e: BaseException, where: str) -> AccessRefused | None:
    name = type(e).__name__
    if name in ("SaslAuthenticationFailed", "SaslAuthenticationFailedError"):
        return AccessRefused("TAILGUARD_KAFKA_SASL_PASSWORD", (
            f"Kafka at {where} refused the {s.kafka_sasl_mechanism} login of user "
            f"{s.kafka_sasl_username!r}: check TAILGUARD_KAFKA_SASL_USERNAME and "
            "TAILGUARD_KAFKA_SASL_PASSWORD (or its _FILE)"))
    if name in ("UnsupportedSaslMechanismError", "UnsupportedSaslMechanism", "IllegalSaslStateError"):
        return AccessRefused("TAILGUARD_KAFKA_SASL_MECHANISM", (
            f"Kafka at {where} does not accept SASL mechanism {s.kafka_sasl_mechanism} ({e})"))
    problem = _cert_problem(e, "TAILGUARD_KAFKA_SSL", s.kafka_ssl_cafile, f"Kafka at {where}")
    if problem is not None:
        return problem
    if isinstance(e, ConnectionResetError) or (name == "KafkaConnectionError" and "closed" in str(e)):
        return AccessRefused("TAILGUARD_KAFKA_SECURITY_PROTOCOL", (
            f"Kafka at {where} closed the connection during the handshake: does that listener "
            f"speak {s.kafka_security_protocol}? (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"))
    return None


async def check_kafka(s: Settings, *, timeout_s: float = 10.0) -> None:
    """Connect once to a bootstrap server with the security settings (see module docstring)."""
    from aiokafka.conn import create_conn

    opts = kafka_client_options(s)
    for hostport in s.kafka_bootstrap.split(","):
        host, _, port = hostport.strip().rpartition(":")
        where = f"{host}:{port}"
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), client_id="tailguard-check",
                            request_timeout_ms=int(timeout_s * 1000), **opts), timeout_s)
        except Exception as e:  # classified below; anything else counts as "unreachable"
            problem = _kafka_problem(s, e, where)
            if problem is not None:
                raise problem from None
            continue
        conn.close()
        return
