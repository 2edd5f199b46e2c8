"""Every PromQL expression in the Grafana dashboard names metrics the gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration
DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "polyhead-dashboard.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "info": ("_info",), "gauge": ("",)}


def exported_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_dashboard_metrics_exist(gateway):
    exported = exported_names(httpx.get(f"{gateway.url}/metrics", timeout=10).text)
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    used = {m for e in exprs for m in re.findall(r"\bpolyhead_[a-z_]+\b", e)}
    assert used, "no polyhead metrics in the dashboard"
    missing = sorted(used - exported)
    assert not missing, f"dashboard names metrics that /metrics does not export: {missing}"


def test_every_exported_metric_is_documented(gateway):
    doc = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    missing = []
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus_client's creation timestamps
            continue
        names = {family.name} | {family.name + s for s in _SUFFIXES.get(family.type, ())}
        if not any(f"`{n}`" in doc for n in names):
            missing.append(family.name)
    assert not missing, f"metrics missing from docs/metrics.md: {missing}"
