from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.cli import main


@pytest.mark.slow
def test_bench_engine_quick_mode(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--batches", "1,2",
                 "--tokens", "3", "--backends", "local,transformers,vllm",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs transformers" in out
    rows = json.loads((tmp_path / "bench_engine.json").read_text())
    measured = [r for r in rows if r["engine"] in ("local", "transformers")]
    assert len(measured) == 2 * 2 * 3  # engines x batches x heads
    assert all(r["decode_tok_s"] > 0 for r in measured)
    assert (tmp_path / "bench_engine.png").stat().st_size > 1000
