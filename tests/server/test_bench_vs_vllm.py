"""`polyhead bench vs-vllm` in a quick mode on the tiny model, so the benchmark does not rot:
polyhead and stock vLLM on the native and the second largest head's exports run, every
request completes, and a verdict line per stock server and concurrency is printed."""

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
        (s, c) for s in ("polyhead", "stock", "stock-4k") for c in (1, 2)}
    assert all(c["completed"] == 3 and c["failed"] == 0 for c in result["cells"])
    verdicts = result["verdicts"]
    assert len(verdicts) == 4 and all(v.startswith(("MET ", "MISSED ")) for v in verdicts)
    assert sum("x stock-4k (target >= 1.0x)" in v for v in verdicts) == 2, verdicts
    assert (out / "vs_vllm.png").is_file()
    assert "llama.cpp: skipped (no --llama-cpp PATH" in done.stdout


def test_bench_vs_vllm_pinned(tiny_model_dir, tmp_path):
    """--pin: every polyhead request on one head (its per-head route), against stock on that
    head's export only, one verdict per concurrency."""
    out = tmp_path / "out"
    env = {"POLYHEAD_CACHE_DIR": str(tmp_path / "cache"), "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    import os

    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "bench", "vs-vllm", "--model", str(tiny_model_dir),
         "--pin", "4k", "--concurrency", "1,2", "--num-prompts", "3", "--output-len", "4",
         "--prompts", "english", "--out", str(out)],
        capture_output=True, text=True, timeout=800, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "vs_vllm.json").read_text())
    assert {(c["server"], c["concurrency"]) for c in result["cells"]} == {
        (s, c) for s in ("polyhead:4k", "stock-4k") for c in (1, 2)}
    assert all(c["completed"] == 3 and c["failed"] == 0 for c in result["cells"])
    pinned = [c for c in result["cells"] if c["server"] == "polyhead:4k"]
    assert all(c["shares"] == {"4k": 1.0} for c in pinned), pinned  # the router never ran
    verdicts = result["verdicts"]
    assert len(verdicts) == 2 and all(v.startswith(("MET polyhead:4k", "MISSED polyhead:4k"))
                                      for v in verdicts), verdicts
    assert all("x stock-4k (target >= 1.0x)" in v for v in verdicts), verdicts
