"""The project's import graph (scripts/import_graph.py): no circle of modules or of rooms, no
upward import inside server/, the package direction kept, and a small heads/ top level."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_graph.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look the module up
    spec.loader.exec_module(module)
    return module


def test_the_script_passes_on_the_tree() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("targets: MET")


def test_it_finds_a_circle_held_open_inside_a_function(tmp_path: Path) -> None:
    # The shape of the old corpus <-> corpus_l10n pair, and an upward server import.
    files = {
        "heads/__init__.py": "",
        "heads/a.py": "from heads.b import B\nA = 1\n",
        "heads/b.py": "B = 2\n\ndef f():\n    from heads.a import A\n    return A\n",
        "heads/room/__init__.py": "",
        "heads/room/c.py": "from heads.b import B\n",
        "server/__init__.py": "",
        "server/ops/__init__.py": "",
        "server/ops/m.py": "from server.gateway.g import G\n",
        "server/gateway/__init__.py": "",
        "server/gateway/g.py": "G = 1\n",
        "router/__init__.py": "",
        "kernels/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    lines, ok = _script().report(tmp_path)
    assert not ok
    text = "\n".join(lines)
    assert "module circles: 1\n  heads.a <-> heads.b" in text
    assert "server upward imports: 1\n  server.ops.m -> server.gateway.g" in text
    assert "room circles: 1" in text  # heads.a and heads.b are rooms of their own


def test_relative_imports_and_from_package_import_module_resolve(tmp_path: Path) -> None:
    files = {
        "heads/__init__.py": "",
        "heads/room/__init__.py": "",
        "heads/room/x.py": "from . import y\nfrom .y import Y\n",
        "heads/room/y.py": "Y = 1\n",
        "heads/top.py": "from heads.room import x\n",
        "server/__init__.py": "", "router/__init__.py": "", "kernels/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = _script().build_graph(tmp_path)
    assert graph["heads.room.x"] == {"heads.room.y"}
    assert graph["heads.top"] == {"heads.room.x"}
