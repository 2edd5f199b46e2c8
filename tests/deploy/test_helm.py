"""deploy/helm/polyhead: `helm lint` and `helm template` through Helm's own Go SDK (the
helm-python-sdk wheel bundles libhelm_c, Helm v4), then every rendered manifest validated
against the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

# From the test extra; a missing one fails the run instead of skipping it.
import helm_python as helm  # noqa: E402
import kubernetes_validate as kv  # noqa: E402
import pytest
import yaml

from tests.deploy.conftest import DEPLOY

CHART = DEPLOY / "helm" / "polyhead"
K8S_VERSION = "1.33.0"
# Prometheus-operator kinds have no schema in kubernetes-validate: checked by hand below.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything-on": {
        "gateway": {"autoscaling": {"enabled": True}, "env": {"POLYHEAD_ADMISSION_QUEUE": 32}},
        "adminToken": {"value": "s3cret"},
        "monitoring": {"serviceMonitor": {"enabled": True},
                       "prometheusRule": {"enabled": True}},
        "engine": {"pools": [
            {"name": "small", "replicas": 2, "heads": ["h32k"], "model": "/m", "gpus": 1,
             "tensorParallelSize": 1, "extraArgs": ["--max-model-len=4096"],
             "resources": {}, "nodeSelector": {"gpu": "l4"}, "tolerations": []},
            {"name": "big", "replicas": 1, "heads": ["h131k", "h262k"], "model": "/m",
             "gpus": 4, "tensorParallelSize": 4, "extraArgs": [],
             "resources": {"requests": {"memory": "64Gi"}},
             "nodeSelector": {"gpu": "h100"}, "tolerations": []},
        ]},
    },
    "static-discovery": {"engine": {"discovery": "static", "discoveryPool": "main"}},
    "external-redis": {
        "redis": {"bundled": False, "externalUrlSecret": {"name": "redis-url", "key": "url"}},
        "adminToken": {"existingSecret": "polyhead-admin"},
        "gateway": {"podDisruptionBudget": {"enabled": False},
                    "cache": {"existingClaim": "models"}},
        "engine": {"enabled": False},
    },
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name="ph", namespace="polyhead")
    docs = []
    for name, text in sorted(files.items()):
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def schema_errors(doc: dict[str, Any]) -> list[str]:
    try:
        kv.validate(doc, K8S_VERSION, strict=True)
    except kv.ValidationError as e:
        return [f"{doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}"]
    return []


def test_helm_lint() -> None:
    report = helm.lint(str(CHART))
    assert report["errors"] == [] and report["messages"] == [], report


def test_helm_lint_catches_a_broken_chart(tmp_path: Path) -> None:
    bad = tmp_path / "polyhead"
    bad.mkdir()
    (bad / "Chart.yaml").write_text("apiVersion: v2\nname: polyhead\n")  # no version
    (bad / "values.yaml").write_text("a: 1\n")
    report = helm.lint(str(bad))
    assert report["errors"] or any(m.get("severity", "").lower() == "error"
                                   for m in report["messages"]), report


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_manifests_are_valid(scenario: str) -> None:
    docs = render(SCENARIOS[scenario])
    assert docs
    errs = [e for d in docs if d["kind"] not in CRD_KINDS for e in schema_errors(d)]
    assert errs == []


def test_schema_validation_catches_a_broken_manifest() -> None:
    dep = next(d for d in render({}) if d["kind"] == "Deployment")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = []
    bad["spec"]["replicas"] = "two"
    bad["spec"]["templateX"] = {}
    assert schema_errors(dep) == [] and schema_errors(bad) != []


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_gateway_contract() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["gateway"]
    docs = render({"adminToken": {"existingSecret": "polyhead-admin"}})
    deployments = by_kind(docs, "Deployment")
    gw = next(d for d in deployments if d["metadata"]["name"] == "ph-polyhead-gateway")
    pod = gw["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in c["env"]}
    assert env["POLYHEAD_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "polyhead-admin"
    assert env["POLYHEAD_REDIS_URL"]["value"] == "redis://ph-polyhead-redis:6379/0"
    drain = int(env["POLYHEAD_SHUTDOWN_GRACE_S"]["value"]) + float(
        env["POLYHEAD_SHUTDOWN_DELAY_S"]["value"])
    assert pod["terminationGracePeriodSeconds"] > drain
    assert drain == values["shutdownGraceSeconds"] + values["shutdownDelaySeconds"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert gw["spec"]["replicas"] == values["replicas"]
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]
    assert not by_kind(docs, "Secret")  # an existing Secret is referenced, not created


def test_env_names_are_settings() -> None:
    from server.settings import Settings

    known = {f"POLYHEAD_{n.upper()}" for n in Settings.model_fields}
    docs = render(SCENARIOS["everything-on"])
    gw = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway"))
    names = {e["name"] for e in gw["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert names <= known, names - known


def test_hpa_and_engine_pools() -> None:
    docs = render(SCENARIOS["everything-on"])
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    kinds = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert kinds["Resource"]["resource"]["name"] == "cpu"
    assert kinds["Pods"]["pods"]["metric"]["name"] == "polyhead_admission_queue"
    metrics_doc = (DEPLOY.parent / "docs" / "metrics.md").read_text()
    assert "`polyhead_admission_queue`" in metrics_doc
    gw = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway"))
    assert "replicas" not in gw["spec"]  # the HPA owns it
    engines = [d for d in by_kind(docs, "Deployment") if "-engine-" in d["metadata"]["name"]]
    assert {d["metadata"]["labels"]["polyhead.io/pool"] for d in engines} == {"small", "big"}
    big = next(d for d in engines if d["metadata"]["labels"]["polyhead.io/pool"] == "big")
    pod = big["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "--tensor-parallel-size=4" in pod["containers"][0]["args"]
    assert big["metadata"]["annotations"]["polyhead.io/heads"] == "h131k,h262k"
    assert len([d for d in by_kind(docs, "Service") if "-engine-" in d["metadata"]["name"]]) == 2


def test_monitoring_resources_match_shipped_rules() -> None:
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    assert yaml.safe_load((CHART / "files" / "rules.yml").read_text()) == shipped
    docs = render(SCENARIOS["everything-on"])
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["spec"] == shipped
    (sm,) = by_kind(docs, "ServiceMonitor")
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("gateway"))
    # jobLabel makes job="polyhead", which the shipped rules select on.
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "polyhead"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert not by_kind(render({}), "ServiceMonitor")


def test_engine_discovery_rbac_and_env() -> None:
    docs = render({})
    gw = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway"))
    pod = gw["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    (svc,) = [d for d in by_kind(docs, "Service") if "-engine-" in d["metadata"]["name"]]
    assert env["POLYHEAD_VLLM_DISCOVERY"] == "kubernetes"
    assert env["POLYHEAD_VLLM_K8S_SERVICE"] == svc["metadata"]["name"]
    assert env["POLYHEAD_VLLM_K8S_NAMESPACE"] == "polyhead"
    assert env["POLYHEAD_VLLM_K8S_PORT"] in {p["name"] for p in svc["spec"]["ports"]}
    (sa,) = by_kind(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    (role,) = by_kind(docs, "Role")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["list", "watch"]}]
    (binding,) = by_kind(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "polyhead"}]


def test_static_discovery_and_no_engines_need_no_rbac() -> None:
    static = render({"engine": {"discovery": "static"}})
    gw = next(d for d in by_kind(static, "Deployment") if d["metadata"]["name"].endswith("gateway"))
    pod = gw["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["POLYHEAD_VLLM_URLS"] == '["http://ph-polyhead-engine-main:8001"]'
    assert "serviceAccountName" not in pod
    for docs in (static, render(SCENARIOS["external-redis"])):
        assert not by_kind(docs, "Role") and not by_kind(docs, "ServiceAccount")
