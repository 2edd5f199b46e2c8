from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from server.cli import main


@pytest.mark.slow
def test_bench_engine_quick_mode(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--batches", "1,2",
                 "--tokens", "3", "--backends", "local,transformers",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs transformers" in out
    rows = json.loads((tmp_path / "bench_engine.json").read_text())
    measured = [r for r in rows if r["engine"] in ("local", "transformers")]
    assert len(measured) == 2 * 2 * 3  # engines x batches x heads
    assert all(r["decode_tok_s"] > 0 for r in measured)
    assert (tmp_path / "bench_engine.png").stat().st_size > 1000
    # The local engine's scenarios run by default: prefix-cache TTFT and KV per request.
    assert "prefix cache" in out and "KV per request" in out
    local = json.loads((tmp_path / "bench_engine_local.json").read_text())
    assert [r["head"] for r in local["prefix_cache"]] == ["1k", "4k", "8k"]
    assert all(r["cached_tokens"] > 0 and r["warm_ttft_ms"] > 0 for r in local["prefix_cache"])
    assert [r["context"] for r in local["kv_per_request"]] == [1024, 4096]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_engine_against_vllm(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    """`--backend vllm`: one vLLM engine on the exported multi-head model, same workload."""
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--batches", "1,4",
                 "--tokens", "4", "--backend", "local,vllm", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs vllm" in out
    # The verdict line names the target and the worst cell; speed itself is not asserted.
    assert re.search(r"target local >= 1\.0x vllm .*: (MET|MISSED) \(lowest \d+\.\d+x at "
                     r"\S+ B=\d+, 6 cells\)", out), out
    rows = json.loads((tmp_path / "bench_engine.json").read_text())
    vllm = [r for r in rows if r["engine"] == "vllm"]
    assert len(vllm) == 2 * 3 and all(r["decode_tok_s"] > 0 for r in vllm)
    local = [r for r in rows if r["engine"] == "local"]
    assert all(r["ratio_vs_vllm"] > 0 for r in local)


@pytest.mark.slow
def test_bench_engine_writes_calibration_that_simulate_loads(tiny_model_dir: Path, tmp_path: Path,
                                                             capsys) -> None:
    steps = tmp_path / "steps.json"
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--batches", "1,2,4",
                 "--tokens", "4", "--backends", "local", "--out", str(tmp_path),
                 "--calibration-out", str(steps)]) == 0
    from router.step_time_file import read_step_samples

    data = read_step_samples(steps)
    assert {h.name for h in data.heads} == {"1k", "4k", "8k"}
    assert data.meta["dtype"] == "float32" and data.meta["threads"] == 1
    # Decode steps only, every one of a single head at the benchmarked batches.
    assert data.samples and all(len(s.groups) == 1 and s.seconds > 0 for s in data.samples)
    assert {s.groups[0][1] for s in data.samples} == {1, 2, 4}
    assert "decode-step samples" in capsys.readouterr().out
    assert main(["simulate", "--calibration", str(steps), "--trace", "edge", "--duration", "60",
                 "--no-plot", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert data.device.name in out and "static:8k" in out


def test_calibration_out_needs_the_local_engine(tmp_path: Path) -> None:
    assert main(["bench", "engine", "--backends", "transformers",
                 "--calibration-out", str(tmp_path / "x.json")]) != 0
