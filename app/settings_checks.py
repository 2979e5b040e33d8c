"""Checks of two groups of settings, kept apart from :mod:`tailguard.settings` for its size.

Owns the consistency rules of the security settings (:func:`check_security`: the Kafka ones
through :func:`tailguard.kafka_security.validate`; for Redis, TLS files only with
``rediss://``, a password or user name in one place) and of the allowlist settings
(:func:`check_allowlist`). ``Settings.__post_init__`` calls both; nothing here reads the
environment.

Guarantees: a bad combination raises :class:`~tailguard.core.contract.config.SettingError`
naming the setting to fix and what it should be; a password is never shown.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import urlparse

from tailguard.core.contract.config import SettingError, check_regex
from tailguard.kafka_security import KafkaSecurity
from tailguard.kafka_security import validate as validate_kafka_security


class SecuritySettings(Protocol):
    """The settings :func:`check_security` reads (:class:`tailguard.settings.Settings` has them;
    typed here so that this module does not import the settings module that calls it)."""

    def kafka_security(self) -> KafkaSecurity: ...

    @property
    def redis_url(self) -> str: ...
    @property
    def redis_ssl_cafile(self) -> str: ...
    @property
    def redis_ssl_certfile(self) -> str: ...
    @property
    def redis_ssl_keyfile(self) -> str: ...
    @property
    def redis_username(self) -> str: ...
    @property
    def redis_password(self) -> object: ...


class AllowlistSettings(Protocol):
    """The settings :func:`check_allowlist` reads (:class:`tailguard.settings.Settings` has them)."""

    @property
    def allowlist_pattern(self) -> str: ...
    @property
    def allowlist_model_pattern(self) -> str: ...
    @property
    def allowlist_redis_key(self) -> str: ...
    @property
    def allowlist_refresh_s(self) -> float: ...


def check_security(s: SecuritySettings) -> None:
    validate_kafka_security(s.kafka_security(), SettingError)
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


def check_allowlist(s: AllowlistSettings) -> None:
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
