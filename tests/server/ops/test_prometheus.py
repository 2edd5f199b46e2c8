"""The shipped Prometheus config and alert rules: promtool validates them, and a real
Prometheus (Debian's) scrapes a running gateway; its HTTP API must show the traffic."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "prometheus"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/install-system-deps.sh)")
    return path


def test_promtool_accepts_config_and_rules():
    promtool = _tool("promtool")
    for args in (["check", "config", str(DEPLOY / "prometheus.yml")],
                 ["check", "rules", str(DEPLOY / "rules.yml")]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    alerts = {rule["alert"] for g in yaml.safe_load((DEPLOY / "rules.yml").read_text())["groups"]
              for rule in g["rules"]}
    assert {"PolyheadHigh429Rate", "PolyheadHeadDown", "PolyheadLambdaCrossedThreshold",
            "PolyheadGatewayOverheadHigh"} <= alerts


def _query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def test_real_prometheus_scrapes_the_gateway(tiny_model_dir, tmp_path, record_property):
    prometheus = _tool("prometheus")
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_BACKEND="echo")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(DEPLOY / "rules.yml")]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [gw.url.removeprefix("http://")]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    prom = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=(tmp_path / "prom.log").open("w"), stderr=subprocess.STDOUT)
    try:
        for i in range(12):
            r = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                           json={"model": "tiny:4k", "prompt": f"p {i}", "max_tokens": 3})
            assert r.status_code == 200
        deadline = time.monotonic() + 60
        series: list[dict] = []
        while time.monotonic() < deadline:
            try:
                series = _query(prom, 'polyhead_requests_total{head="4k",status="200"}')
            except httpx.HTTPError:
                series = []
            if series and float(series[0]["value"][1]) == 12:
                break
            time.sleep(0.5)
        assert series and float(series[0]["value"][1]) == 12, series
        record_property("polyhead_requests_total", series)
        assert series[0]["metric"]["route"] == "/v1/completions"
        assert _query(prom, 'up{job="polyhead"}')[0]["value"][1] == "1"
        tokens = _query(prom, 'polyhead_tokens_total{head="4k",direction="generated"}')
        assert float(tokens[0]["value"][1]) == 36
        overhead = _query(prom, "polyhead_gateway_overhead_seconds_count")
        assert sum(float(s["value"][1]) for s in overhead) == 12
        itl = _query(prom, 'polyhead_inter_token_latency_seconds_count{head="4k"}')
        assert float(itl[0]["value"][1]) == 24  # 2 gaps between 3 tokens, 12 requests
        record_property("queries", {"tokens": tokens, "overhead_count": overhead, "itl": itl})
        heads_up = _query(prom, "polyhead_head_up")
        assert {s["metric"]["head"] for s in heads_up} == {"1k", "4k", "8k"}
        rules = httpx.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert sum(len(g["rules"]) for g in rules) == 6
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert stop_gateway(gw) == 0
