"""Both images: hadolint clean, multi-stage, digest-pinned base, non-root, /readyz healthcheck,
configured by POLYHEAD_* variables only."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, venv_tool

DOCKERFILES = [DEPLOY / "docker" / "Dockerfile.cpu", DEPLOY / "docker" / "Dockerfile.cuda"]
# ENV names an image may set besides POLYHEAD_*: runtime plumbing, not gateway settings.
ENV_ALLOWED = {"PATH", "HOME", "HF_HOME", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
               "PIP_DISABLE_PIP_VERSION_CHECK", "NVIDIA_VISIBLE_DEVICES",
               "NVIDIA_DRIVER_CAPABILITIES"}


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([venv_tool("hadolint"), "--failure-threshold", "info", str(path)],
                          capture_output=True, text=True, timeout=30)


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    res = hadolint(path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_catches_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN cd /tmp\n")
    res = hadolint(bad)
    assert res.returncode != 0
    assert "DL3007" in res.stdout and "DL3008" in res.stdout


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_image_contract(path: Path) -> None:
    ins = instructions(path)
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2, "multi-stage"
    external = [f for f in froms if not re.match(r"^(base|build)\b", f)]
    assert external and all(re.search(r"@sha256:[0-9a-f]{64}\b", f) for f in external), external
    users = [rest for word, rest in ins if word == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    health = [rest for word, rest in ins if word == "HEALTHCHECK"]
    assert len(health) == 1 and "/readyz" in health[0]
    env_names = set()
    for word, rest in ins:
        if word == "ENV":
            env_names |= set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", rest))
    assert {"POLYHEAD_HOST", "POLYHEAD_PORT", "POLYHEAD_CACHE_DIR"} <= env_names
    assert {n for n in env_names if not n.startswith("POLYHEAD_")} <= ENV_ALLOWED
    assert any(word == "VOLUME" and "/var/lib/polyhead" in rest for word, rest in ins)
    entry = [rest for word, rest in ins if word in {"ENTRYPOINT", "CMD"}]
    assert entry[-1] == '["polyhead", "serve"]'


def test_env_settings_exist() -> None:
    """Every POLYHEAD_* variable the images set is a real setting."""
    from server.settings import Settings

    known = {f"POLYHEAD_{name.upper()}" for name in Settings.model_fields}
    for path in DOCKERFILES:
        used = set(re.findall(r"\b(POLYHEAD_[A-Z0-9_]+)=", path.read_text()))
        assert used <= known, used - known
