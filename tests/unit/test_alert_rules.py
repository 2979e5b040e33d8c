"""The alert rules name only metrics the worker exports (deploy/prometheus/alerts.yml).

promtool itself (check rules, test rules) runs in scripts/test; this test needs no
Prometheus: it catches a renamed metric the day it is renamed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from app.streaming.metrics import WorkerMetrics

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_count", "_sum", "_bucket")}


def exported_names() -> set[str]:
    names: set[str] = set()
    for family in WorkerMetrics(CollectorRegistry()).registry.collect():
        names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
    return names


def test_every_alert_names_exported_metrics_only() -> None:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert len(rules) >= 7
    exported = exported_names()
    for rule in rules:
        used = set(re.findall(r"\btailguard_[a-z0-9_]+", rule["expr"]))
        assert used, f"alert {rule['alert']} names no tailguard metric"
        assert used <= exported, (rule["alert"], sorted(used - exported))


def test_the_check_catches_a_wrong_name() -> None:
    assert "tailguard_redis_write_failures_total" in exported_names()
    assert "tailguard_redis_write_failures" not in exported_names()   # a counter has _total
