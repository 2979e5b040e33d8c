"""The documented minimal ACL: built from the key layout, and the one scripts/redis creates."""

from __future__ import annotations

import re
from pathlib import Path

from tailguard.routing.acl import CLUSTER_COMMANDS, READER_COMMANDS, WORKER_COMMANDS, acl_rules

ROOT = Path(__file__).resolve().parents[2]


def test_rules_confine_keys_and_channel_to_the_prefix() -> None:
    rules = acl_rules("tg-prod").split()
    assert rules[:4] == ["~tg-prod:*", "resetchannels", "&tg-prod:routing:changes", "-@all"]
    assert {r[1:] for r in rules[4:]} == set(WORKER_COMMANDS)
    assert not any(r in ("~*", "&*", "+@all", "allkeys", "allchannels") for r in rules)


def test_reader_rules_cannot_write() -> None:
    reader = acl_rules("tg", role="reader").split()
    assert {r[1:] for r in reader[4:]} == set(READER_COMMANDS)
    assert not {"sadd", "set", "del", "evalsha", "publish", "hset"} & set(READER_COMMANDS)


def test_scripts_redis_creates_the_worker_acl_for_the_default_prefix() -> None:
    text = (ROOT / "scripts" / "redis").read_text(encoding="utf-8")
    m = re.search(r"^ACL_RULES='([^']*)'$", text, re.M)
    assert m, "scripts/redis defines no ACL_RULES"
    assert m.group(1) == acl_rules("tailguard")
    assert 'user $SECURE_USER on >$(head -n 1 "$sec/redis.password") $ACL_RULES' in text


def test_production_docs_show_the_same_rules() -> None:
    docs = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    assert acl_rules("tailguard") in docs and acl_rules("tailguard", role="reader") in docs


def test_cluster_rules_add_only_the_cluster_clients_read_only_commands() -> None:
    for role in ("worker", "reader"):
        plain = acl_rules("tg", role=role).split()          # type: ignore[arg-type]
        cluster = acl_rules("tg", role=role, cluster=True).split()   # type: ignore[arg-type]
        assert cluster[:len(plain)] == plain
        assert cluster[len(plain):] == [f"+{c}" for c in CLUSTER_COMMANDS] == ["+cluster|slots", "+command"]
