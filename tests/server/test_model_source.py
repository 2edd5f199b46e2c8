"""Built-in models in the cache: a demo built by an older polyhead is rebuilt, not served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server import model_source
from server.model_source import DEMO, DEMO_BUILD, resolve_model_dir


def _fake_demo(cache: Path, build: int | None) -> Path:
    target = cache / "models" / f"{DEMO}-heads"
    target.mkdir(parents=True)
    extra = {} if build is None else {"demo_build": build}
    (target / "manifest.json").write_text(json.dumps({"extra": extra}))
    return target


@pytest.mark.parametrize("build", [None, DEMO_BUILD - 1])
def test_a_stale_demo_is_rebuilt(tmp_path: Path, monkeypatch, build: int | None) -> None:
    target = _fake_demo(tmp_path, build)
    built: list[Path] = []

    def fake_build(t: Path, cache_dir: Path) -> None:  # the real one downloads 238 MB
        assert not t.exists()  # the stale directory was removed first
        t.mkdir(parents=True)
        (t / "manifest.json").write_text(json.dumps({"extra": {"demo_build": DEMO_BUILD}}))
        built.append(t)

    monkeypatch.setattr(model_source, "_build_demo", fake_build)
    assert resolve_model_dir(DEMO, tmp_path) == target
    assert built == [target]
    assert resolve_model_dir(DEMO, tmp_path) == target and built == [target]  # now current


def test_a_current_demo_is_served_as_is(tmp_path: Path, monkeypatch) -> None:
    target = _fake_demo(tmp_path, DEMO_BUILD)
    monkeypatch.setattr(model_source, "_build_demo", lambda *a: pytest.fail("rebuilt"))
    assert resolve_model_dir(DEMO, tmp_path) == target
