"""Shared paths and tool lookup for the deploy/ checks (tools come from the `test` extra)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def venv_tool(name: str) -> str:
    """A console script of the test extra: beside this interpreter, else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[test]'")
    return found
