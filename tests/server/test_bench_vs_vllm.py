"""`polyhead bench vs-vllm` in a quick mode on the tiny model, so the benchmark does not rot:
both servers run, every request completes, and the verdict lines are printed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.timeout(900)]


def test_bench_vs_vllm_quick(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    env = {"POLYHEAD_CACHE_DIR": str(tmp_path / "cache"), "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    import os

    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "bench", "vs-vllm", "--model", str(tiny_model_dir),
         "--concurrency", "1,2", "--num-prompts", "3", "--output-len", "4",
         "--prompts", "english", "--out", str(out)],
        capture_output=True, text=True, timeout=800, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "vs_vllm.json").read_text())
    assert {(c["server"], c["concurrency"]) for c in result["cells"]} == {
        ("polyhead", 1), ("polyhead", 2), ("stock", 1), ("stock", 2)}
    assert all(c["completed"] == 3 and c["failed"] == 0 for c in result["cells"])
    assert len(result["verdicts"]) == 2 and all(
        v.endswith(("MET", "MISSED")) for v in result["verdicts"])
    assert (out / "vs_vllm.png").is_file()
