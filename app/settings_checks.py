"""Checks of two groups of settings, kept apart from :mod:`tailguard.settings` for its size.

Owns the consistency rules of the Kafka and Redis security settings (:func:`check_security`:
a known protocol and SASL mechanism, credentials when SASL is on, TLS files only with TLS, a
password or user name in one place) and of the allowlist settings (:func:`check_allowlist`).
``Settings.__post_init__`` calls both; nothing here reads the environment.

Guarantees: a bad combination raises :class:`~tailguard.core.contract.config.SettingError`
naming the setting to fix and what it should be; a password is never shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlparse

from tailguard.core.contract.config import SettingError, check_regex

if TYPE_CHECKING:
    from tailguard.settings import Settings

KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def check_security(s: Settings) -> None:
    proto = s.kafka_security_protocol
    if proto not in KAFKA_PROTOCOLS:
        raise SettingError("TAILGUARD_KAFKA_SECURITY_PROTOCOL", proto, ", ".join(KAFKA_PROTOCOLS))
    if s.kafka_sasl_mechanism not in SASL_MECHANISMS:
        raise SettingError("TAILGUARD_KAFKA_SASL_MECHANISM", s.kafka_sasl_mechanism, ", ".join(SASL_MECHANISMS))
    if proto.startswith("SASL_"):
        if not s.kafka_sasl_username:
            raise SettingError("TAILGUARD_KAFKA_SASL_USERNAME", "", f"a user name (required with {proto})")
        if not s.kafka_sasl_password:
            raise SettingError("TAILGUARD_KAFKA_SASL_PASSWORD", "",
                               f"a password, or TAILGUARD_KAFKA_SASL_PASSWORD_FILE (required with {proto})")
    tls = proto in ("SSL", "SASL_SSL")
    for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile"):
        if getattr(s, name) and not tls:
            raise SettingError("TAILGUARD_" + name.upper(), getattr(s, name),
                               f"empty: TAILGUARD_KAFKA_SECURITY_PROTOCOL={proto} uses no TLS "
                               "(set it to SSL or SASL_SSL)")
    if s.kafka_ssl_keyfile and not s.kafka_ssl_certfile:
        raise SettingError("TAILGUARD_KAFKA_SSL_CERTFILE", "", "the client certificate that "
                           "TAILGUARD_KAFKA_SSL_KEYFILE belongs to")
    if s.redis_ssl_keyfile and not s.redis_ssl_certfile:
        raise SettingError("TAILGUARD_REDIS_SSL_CERTFILE", "", "the client certificate that "
                           "TAILGUARD_REDIS_SSL_KEYFILE belongs to")
    u = urlparse(s.redis_url)
    for name in ("redis_ssl_cafile", "redis_ssl_certfile", "redis_ssl_keyfile"):
        if getattr(s, name) and u.scheme != "rediss":
            raise SettingError("TAILGUARD_" + name.upper(), getattr(s, name),
                               "empty, or TAILGUARD_REDIS_URL with rediss:// (TLS)")
    if s.redis_password and u.password is not None:
        raise SettingError("TAILGUARD_REDIS_PASSWORD", "***", "empty when TAILGUARD_REDIS_URL "
                           "holds a password already (give it in one place)")
    if s.redis_username and u.username:
        raise SettingError("TAILGUARD_REDIS_USERNAME", s.redis_username, "empty when "
                           "TAILGUARD_REDIS_URL holds a user name already (give it in one place)")


def check_allowlist(s: Settings) -> None:
    if s.allowlist_pattern:
        check_regex("TAILGUARD_ALLOWLIST_PATTERN", s.allowlist_pattern, "node ids")
    if s.allowlist_model_pattern:
        check_regex("TAILGUARD_ALLOWLIST_MODEL_PATTERN", s.allowlist_model_pattern, "model names")
    if s.allowlist_redis_key and any(c.isspace() for c in s.allowlist_redis_key):
        raise SettingError("TAILGUARD_ALLOWLIST_REDIS_KEY", s.allowlist_redis_key,
                           "a Redis key without spaces, e.g. tailguard:allowlist")
    if not 1.0 <= s.allowlist_refresh_s <= 3600.0:
        raise SettingError("TAILGUARD_ALLOWLIST_REFRESH_S", s.allowlist_refresh_s,
                           "a number of seconds in [1, 3600]")
