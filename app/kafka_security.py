"""Kafka client security from plain values: one builder for the worker and the agent.

Owns the rules of the ``TAILGUARD_KAFKA_*`` security variables and their translation into
aiokafka client options, for two callers that must agree: :mod:`tailguard.security` (the
worker and the CLI tools, values from :class:`tailguard.settings.Settings`) and the
diagnostics agent (:mod:`tailguard.agent.config`, installed without the worker's
dependencies, values from the same variables). Imports only the standard library (aiokafka
lazily, in :func:`check`), nothing of the package.

* :class:`KafkaSecurity` — the values; :meth:`KafkaSecurity.from_env` reads the variables
  from a mapping it is given (``…_PASSWORD_FILE`` included); :func:`validate` checks them;
* :func:`client_options` — ``security_protocol``, ``sasl_*``, ``ssl_context`` for any
  aiokafka client; :func:`tls_context` — a client TLS context, its files checked first;
* :func:`refusal` / :func:`check` — a refused login, an unknown mechanism, an untrusted
  certificate or a listener of another protocol as :class:`KafkaRefused`, a one-line
  message naming the variable to fix. An unreachable broker is not their business.

Bad values raise ``error(name, value, allowed)`` — the caller's exception type
(``SettingError``, ``AgentConfigError``). No message holds a secret.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "TAILGUARD_KAFKA_"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: The secrets among the variables (each also as ``<name>_FILE``).
SECRET_VARS = (PREFIX + "SASL_PASSWORD", PREFIX + "SSL_KEY_PASSWORD")

ErrorFactory = Callable[[str, object, str], Exception]


class KafkaRefused(ValueError):
    """Kafka refused the credentials or the certificate; ``name`` is the variable to fix."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name, self.problem = name, problem


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """The ``TAILGUARD_KAFKA_*`` security values (passwords never in ``repr``)."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_key_password: str = field(default="", repr=False)
    ssl_check_hostname: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str], error: ErrorFactory) -> KafkaSecurity:
        """The values of ``environ``'s variables (defaults for those unset), validated."""
        def text(name: str, default: str = "") -> str:
            return environ.get(PREFIX + name, default)

        def secret(name: str) -> str:
            var = PREFIX + name
            if var + "_FILE" in environ:
                if var in environ:
                    raise error(var + "_FILE", environ[var + "_FILE"],
                                f"unset while {var} is set (give the secret once)")
                return read_secret(var + "_FILE", environ[var + "_FILE"], error)
            return environ.get(var, "")

        hostname = PREFIX + "SSL_CHECK_HOSTNAME"
        sec = cls(text("SECURITY_PROTOCOL", "PLAINTEXT"), text("SASL_MECHANISM", "PLAIN"),
                  text("SASL_USERNAME"), secret("SASL_PASSWORD"), text("SSL_CAFILE"),
                  text("SSL_CERTFILE"), text("SSL_KEYFILE"), secret("SSL_KEY_PASSWORD"),
                  parse_bool(hostname, environ[hostname], error) if hostname in environ else True)
        validate(sec, error)
        return sec


def validate(s: KafkaSecurity, error: ErrorFactory) -> None:
    """Refuse values that cannot work together (before any connection)."""
    proto = s.protocol
    if proto not in PROTOCOLS:
        raise error(PREFIX + "SECURITY_PROTOCOL", proto, ", ".join(PROTOCOLS))
    if s.sasl_mechanism not in SASL_MECHANISMS:
        raise error(PREFIX + "SASL_MECHANISM", s.sasl_mechanism, ", ".join(SASL_MECHANISMS))
    if proto.startswith("SASL_"):
        if not s.sasl_username:
            raise error(PREFIX + "SASL_USERNAME", "", f"a user name (required with {proto})")
        if not s.sasl_password:
            raise error(PREFIX + "SASL_PASSWORD", "",
                        f"a password, or {PREFIX}SASL_PASSWORD_FILE (required with {proto})")
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if getattr(s, name) and proto not in TLS_PROTOCOLS:
            raise error(PREFIX + name.upper(), getattr(s, name),
                        f"empty: {PREFIX}SECURITY_PROTOCOL={proto} uses no TLS (set it to SSL or SASL_SSL)")
    if s.ssl_keyfile and not s.ssl_certfile:
        raise error(PREFIX + "SSL_CERTFILE", "", f"the client certificate that {PREFIX}SSL_KEYFILE belongs to")


def parse_bool(var: str, text: str, error: ErrorFactory) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise error(var, text, "true or false")


def read_secret(var: str, path: str, error: ErrorFactory) -> str:
    """The secret in the file ``path`` (``var``: the ``…_FILE`` variable); one trailing newline dropped."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise error(var, path, f"a readable file holding the secret ({type(e).__name__})") from None
    text = text[:-1] if text.endswith("\n") else text
    return text[:-1] if text.endswith("\r") else text


def _readable(var: str, path: str, what: str, error: ErrorFactory) -> str:
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise error(var, path, f"a readable {what}")
    return path


def tls_context(var_prefix: str, *, cafile: str, certfile: str, keyfile: str, key_password: str,
                check_hostname: bool, error: ErrorFactory) -> ssl.SSLContext:
    """A client TLS context; ``var_prefix`` (``TAILGUARD_KAFKA_SSL``) names the settings in errors."""
    ca = _readable(f"{var_prefix}_CAFILE", cafile, "PEM file of CA certificates", error) if cafile else None
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except ssl.SSLError as e:
        raise error(f"{var_prefix}_CAFILE", cafile, f"a PEM file of CA certificates ({e.reason or e})") from None
    if certfile:
        cert = _readable(f"{var_prefix}_CERTFILE", certfile, "PEM client certificate", error)
        key = _readable(f"{var_prefix}_KEYFILE", keyfile, "PEM private key", error) if keyfile else None
        try:
            ctx.load_cert_chain(cert, key, password=key_password or None)
        except ssl.SSLError as e:
            raise error(f"{var_prefix}_CERTFILE", certfile,
                        f"a PEM client certificate whose key matches {var_prefix}_KEYFILE "
                        f"(and {var_prefix.removesuffix('_SSL')}_SSL_KEY_PASSWORD if the key "
                        f"is encrypted): {e.reason or e}") from None
    ctx.check_hostname = check_hostname
    return ctx


def ssl_context(s: KafkaSecurity, error: ErrorFactory) -> ssl.SSLContext | None:
    """The TLS context for Kafka, or None when the protocol uses no TLS."""
    if s.protocol not in TLS_PROTOCOLS:
        return None
    return tls_context(PREFIX + "SSL", cafile=s.ssl_cafile, certfile=s.ssl_certfile,
                       keyfile=s.ssl_keyfile, key_password=s.ssl_key_password,
                       check_hostname=s.ssl_check_hostname, error=error)


def client_options(s: KafkaSecurity, error: ErrorFactory) -> dict[str, Any]:
    """Security keyword arguments for any aiokafka client (no ``bootstrap_servers``)."""
    opts: dict[str, Any] = {"security_protocol": s.protocol}
    ctx = ssl_context(s, error)
    if ctx is not None:
        opts["ssl_context"] = ctx
    if s.protocol.startswith("SASL_"):
        opts.update(sasl_mechanism=s.sasl_mechanism, sasl_plain_username=s.sasl_username,
                    sasl_plain_password=s.sasl_password)
    return opts


def cert_refusal(e: BaseException, var_prefix: str, cafile: str, where: str) -> KafkaRefused | None:
    """A :class:`KafkaRefused` for a TLS failure anywhere in ``e``'s chain, else None."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            reason = seen.verify_message or str(seen)
            if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
                return KafkaRefused(f"{var_prefix}_CHECK_HOSTNAME", (
                    f"the certificate of {where} does not name that host ({reason}): connect by a "
                    f"name the certificate holds, or set {var_prefix}_CHECK_HOSTNAME=false"))
            trusted = f"the CA file {cafile}" if cafile else "the system's CAs"
            return KafkaRefused(f"{var_prefix}_CAFILE", (
                f"the certificate of {where} is not trusted by {trusted} ({reason}): point "
                f"{var_prefix}_CAFILE at the CA that signed it"))
        if isinstance(seen, ssl.SSLError):
            return KafkaRefused(f"{var_prefix}_CAFILE", (
                f"the TLS handshake with {where} failed ({seen.reason or seen}): check that it "
                "speaks TLS there and that the CA and client certificate files are right"))
        seen = seen.__cause__ or seen.__context__
    return None


def refusal(s: KafkaSecurity, e: BaseException, where: str) -> KafkaRefused | None:
    """What Kafka at ``where`` refused, from a client's exception ``e`` (None: not a refusal)."""
    name = type(e).__name__
    if name in ("SaslAuthenticationFailed", "SaslAuthenticationFailedError"):
        return KafkaRefused(PREFIX + "SASL_PASSWORD", (
            f"Kafka at {where} refused the {s.sasl_mechanism} login of user {s.sasl_username!r}: "
            f"check {PREFIX}SASL_USERNAME and {PREFIX}SASL_PASSWORD (or its _FILE)"))
    if name in ("UnsupportedSaslMechanismError", "UnsupportedSaslMechanism", "IllegalSaslStateError"):
        return KafkaRefused(PREFIX + "SASL_MECHANISM", (
            f"Kafka at {where} does not accept SASL mechanism {s.sasl_mechanism} ({e})"))
    problem = cert_refusal(e, PREFIX + "SSL", s.ssl_cafile, f"Kafka at {where}")
    if problem is not None:
        return problem
    if isinstance(e, ConnectionResetError) or (name == "KafkaConnectionError" and "closed" in str(e)):
        return KafkaRefused(PREFIX + "SECURITY_PROTOCOL", (
            f"Kafka at {where} closed the connection during the handshake: does that listener "
            f"speak {s.protocol}? (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"))
    return None


async def check(s: KafkaSecurity, bootstrap: str, error: ErrorFactory, *, timeout_s: float = 10.0) -> None:
    """Connect once to a bootstrap server of ``bootstrap`` with ``s``; raise :class:`KafkaRefused`
    for a refusal (see the module docstring), return otherwise."""
    from aiokafka.conn import create_conn

    opts = client_options(s, error)
    for hostport in bootstrap.split(","):
        host, _, port = hostport.strip().rpartition(":")
        where = f"{host}:{port}"
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), client_id="tailguard-check",
                            request_timeout_ms=int(timeout_s * 1000), **opts), timeout_s)
        except Exception as e:  # classified below; anything else counts as "unreachable"
            problem = refusal(s, e, where)
            if problem is not None:
                raise problem from None
            continue
        conn.close()
        return
