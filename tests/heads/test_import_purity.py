"""What the gateway and its bootstrap import from heads/ at request time loads no torch: a
gateway in front of a remote or vLLM engine tokenizes and plans without it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import heads, heads.errors, heads.manifest, heads.checkpoint
import heads.vocab.tokenizer, heads.vocab.split_table, heads.vocab.prompt_encoder
import heads.vocab.scripts, heads.vocab.specials, heads.vocab.trimming
import heads.engine.types, heads.engine.config, heads.engine.kv_layout
import heads.data.files
import heads.vllm_plugin, heads.vllm_plugin.layout
heavy = sorted(m for m in ("torch", "transformers", "vllm", "matplotlib", "fastapi")
               if m in sys.modules)
assert not heavy, heavy
"""


def test_gateway_heads_modules_import_no_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_room_init_files_hold_no_code() -> None:
    # An import in a room's __init__ would run for every module of the room. The vLLM
    # plugin package keeps its entry point, `register`, which imports vLLM only when called.
    for init in sorted((ROOT / "heads").rglob("__init__.py")):
        if init.parent.name == "vllm_plugin":
            continue
        body = ast.parse(init.read_text()).body
        code = [n for n in body if not (isinstance(n, ast.Expr)
                                        and isinstance(n.value, ast.Constant))]
        assert not code, f"{init.relative_to(ROOT)} holds code"
