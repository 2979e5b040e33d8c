"""The alert rules (deploy/prometheus/alerts.yml) and the Grafana dashboard
(deploy/grafana/tailguard.json) name only metrics the worker exports.

promtool itself (check rules, test rules) runs in scripts/test; this test needs no
Prometheus: it catches a renamed metric the day it is renamed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from tailguard.streaming.metrics import WorkerMetrics

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


def test_every_dashboard_query_names_exported_metrics_only() -> None:
    dash = json.loads((ALERTS.parents[1] / "grafana" / "tailguard.json").read_text())
    exported = exported_names()
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        used = set(re.findall(r"\btailguard_[a-z0-9_]+", expr))
        assert used and used <= exported, (expr, sorted(used - exported))
