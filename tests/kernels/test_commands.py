"""Smoke runs of `polyhead bench kernels` and `polyhead kernels calibrate` in quick modes, and
the engine's per-(head, kernel) counts. Benchmarks never assert speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, env_cache: Path) -> str:
    env = {"POLYHEAD_CACHE_DIR": str(env_cache), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_bench_kernels_quick(tmp_path: Path) -> None:
    out = _cli("bench", "kernels", "--quick", "--threads", "1", "--out", str(tmp_path / "b"),
               env_cache=tmp_path)
    assert "plan:" in out and "x ref" in out
    rows = json.loads((tmp_path / "b" / "bench_kernels.json").read_text())["rows"]
    assert {r["path"] for r in rows} >= {"reference", "split", "chunked"}
    assert (tmp_path / "b" / "bench_kernels.png").stat().st_size > 0
    assert (tmp_path / "b" / "bench_kernels.csv").exists()


@pytest.mark.slow
def test_bench_kernels_mixed_quick(tmp_path: Path) -> None:
    out = _cli("bench", "kernels", "--scenario", "mixed", "--quick", "--threads", "1",
               "--out", str(tmp_path / "m"), env_cache=tmp_path)
    assert "mixed step <= 1.10x largest head alone" in out
    doc = json.loads((tmp_path / "m" / "bench_mixed.json").read_text())
    assert [r["mix"] for r in doc["rows"]] == ["8192x1+4096x1", "8192x2+2048x3"]
    assert all(r["after_ms"] > 0 and r["alone_ms"] > 0 for r in doc["rows"])
    assert (tmp_path / "m" / "bench_mixed.png").stat().st_size > 0


@pytest.mark.slow
def test_kernels_calibrate_quick(tmp_path: Path) -> None:
    out = _cli("kernels", "calibrate", "--heads", "a=4096", "--d", "64", "--modes", "greedy",
               "--b-max", "4", "--repeats", "1", "--threads", "1", env_cache=tmp_path)
    assert "b*" in out
    files = list((tmp_path / "calibration").glob("*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert "V=4096,d=64,dtype=bfloat16,mode=greedy" in doc["entries"]
    roof = doc["meta"]["roofline"]  # measured on this machine, one thread
    assert roof["threads"] == 1 and roof["dtype"] == "bfloat16"
    assert 1e9 < roof["mem_bw"] < 1e12 and 1e9 < roof["peak_flops"] < 1e14
    assert "roofline: " in out and "measured here" in out
    assert "GB/s" in out and "TFLOP/s" in out and "of roof" in out


def test_engine_counts_kernels_per_head() -> None:
    import torch

    from heads.engine.config import EngineConfig
    from heads.engine.model_runner import ModelRunner
    from heads.engine.sequence import Sequence
    from kernels.row_params import RowParams
    from tests.heads.tiny import tiny_model

    model = tiny_model()
    runner = ModelRunner(model, EngineConfig(), num_blocks=8)
    heads = list(model.heads)
    seqs = [Sequence(request_id=str(i), head=heads[i % 2], prompt_ids=[1, 2, 3],
                     params=RowParams(temperature=0.7, seed=i), max_tokens=2,
                     stop_token_ids=frozenset())
            for i in range(3)]
    for i, s in enumerate(seqs):
        s.block_tables = [[i]]
    with torch.inference_mode():
        runner.run(seqs, is_prefill=True)
    counts = runner.kernel_counts()
    assert sum(counts.values()) == 2  # one group per head
    assert {h for h, _ in counts} == set(heads[:2])
    # Both heads are prefixes of one matrix: per group or one nested pass, as the plan picks.
    assert {k for _, k in counts} <= {"chunked", "split", "nested-chunked", "nested-split"}
