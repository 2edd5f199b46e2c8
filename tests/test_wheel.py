"""The wheel carries every data file the code opens: the Docker images install with
`pip install /src`, so a file missing from the wheel is missing in production."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from heads.data import files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "router", "heads", "kernels")


def _build_wheel(tmp: Path) -> Path:
    """Build from a copy of the tree, so the build's own build/ and egg-info stay out of the
    worktree; setuptools' PEP 517 backend, as `pip wheel --no-build-isolation` runs it."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "_build")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    code = ("import sys; from setuptools import build_meta as b; "
            "print(b.build_wheel(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / proc.stdout.strip().splitlines()[-1]


def _opened_paths() -> set[str]:
    """Every path under heads/data the code reads: the named files, and the per-language
    samples that `heads.corpus.languages` globs from its folder."""
    named = [v for k, v in vars(files).items() if k.isupper() and isinstance(v, Path)]
    paths = {p for p in named if p.is_file()}
    paths |= set(files.SAMPLES_DIR.glob("*.txt"))
    return {p.relative_to(ROOT).as_posix() for p in paths}


def test_wheel_holds_every_data_file_the_code_opens(tmp_path: Path) -> None:
    with zipfile.ZipFile(_build_wheel(tmp_path)) as wheel:
        members = set(wheel.namelist())
    opened = _opened_paths()
    assert len([p for p in opened if "/multilingual/" in p]) >= 10
    assert sorted(opened - members) == []
    # And nothing under heads/data is left behind (the README is the samples' attribution).
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "heads" / "data").rglob("*")
               if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.parts}
    assert sorted(on_disk - members) == []
    # The fused CPU ops' source: an installed engine compiles it on its own machine.
    assert "heads/model/native/fused_ops.cpp" in members


def test_every_named_data_file_exists() -> None:
    # A name in heads/data/files.py that points nowhere would pass the wheel test vacuously.
    named = {k: v for k, v in vars(files).items() if k.isupper() and isinstance(v, Path)}
    missing = sorted(k for k, v in named.items() if not v.exists())
    assert missing == []
