"""``tailguard settings``: print the effective value of every setting.

Secrets print as ``***`` and a password inside ``TAILGUARD_REDIS_URL`` too
(:class:`tailguard.settings.Secret`, :func:`tailguard.settings.redact_url`).
"""

from __future__ import annotations

import dataclasses

from tailguard import settings as settings_mod


def main(argv: list[str]) -> int:
    s = settings_mod.load()
    values: dict[str, str] = {}
    for name, default in settings_mod.env_names().items():
        key = name.removeprefix(settings_mod.PREFIX).lower()
        if key.startswith("topic_") and key != "topic_partitions":
            values[name] = getattr(s.topics, key.removeprefix("topic_"))
        elif key in {f.name for f in dataclasses.fields(s.detector)}:
            values[name] = str(getattr(s.detector, key))
        elif key == "redis_url":
            values[name] = settings_mod.redact_url(s.redis_url)
        else:
            values[name] = settings_mod.as_text(getattr(s, key))
        marker = "" if values[name] == default else f"   (default {default})"
        print(f"{name}={values[name]}{marker}")
    return 0
