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
    # Each engine's dtype is reported; the B=1 steps are set against the memory roofline.
    assert re.search(r"local +1k +\d+ +1 +\d+ +(bfloat16|float32) ", out)
    assert re.search(r"local 8k B=1: \d+ MB of weights per step \(\w+ engine\), bound [\d.]+ ms at "
                     r"[\d.]+ GB/s, step [\d.]+ ms: \d+% of the memory roofline", out)
    assert re.search(r"target local B=1 step >= 80% of the memory roofline: (MET|MISSED) "
                     r"\(lowest \d+%\)", out)
    rows = json.loads((tmp_path / "bench_engine.json").read_text())
    assert {r["dtype"] for r in rows} <= {"bfloat16", "float32"}
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


def test_bench_engine_times_a_two_level_reading_beside_the_native_head(
        tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--batches", "1,2",
                 "--tokens", "3", "--backends", "local", "--heads", "8k", "--grouped", "1k",
                 "--scenarios", "decode", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "bench_engine.json").read_text())
    reading = {(r["head"], r["batch"]): r for r in rows if r["engine"] == "local-reading"}
    # Alone at both B; the half-and-half batch only where there are two requests to split.
    assert set(reading) == {("8k", 1), ("8k", 2), ("1k+groups", 1), ("1k+groups", 2),
                            ("1k+groups|8k", 2)}
    assert all(r["decode_tok_s"] > 0 and r["mixed_vs_largest_alone"] > 0
               for r in reading.values())
    assert re.search(r"1k\+groups B=2: [\d.]+ ms/step = [\d.]+x the native head alone", out)
    assert "1k+groups|8k B=2" in out


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_bench_engine_against_stock_vllm_and_the_plugin(tiny_model_dir: Path, tmp_path: Path,
                                                        capsys) -> None:
    """Stock vLLM on each head's own export is the baseline; the plugin (one engine, every
    head) and the local engine are timed alike, and a batch mixing two heads through the
    plugin is compared with its largest head alone."""
    assert main(["bench", "engine", "--model", str(tiny_model_dir), "--batches", "1,4",
                 "--tokens", "4", "--backend", "local,vllm,vllm-stock",
                 "--scenarios", "decode", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "vs stock" in out and "vs vllm" in out
    # The verdict lines name the target and the worst cell; speed itself is not asserted.
    assert re.search(r"target vllm >= 0\.95x vllm-stock .*: (MET|MISSED) \(lowest \d+\.\d+x "
                     r"at \S+ B=\d+, 6 cells\)", out), out
    assert re.search(r"target local >= 1\.00x vllm-stock .*: (MET|MISSED) \(lowest \d+\.\d+x "
                     r"at \S+ B=\d+, 6 cells\)", out), out
    assert re.search(r"target vllm-mixed ms/step <= 1\.05x vllm .*: (MET|MISSED) \(highest "
                     r"\d+\.\d+x at 1k\+8k B=4, 1 cells\)", out), out
    rows = json.loads((tmp_path / "bench_engine.json").read_text())
    for engine in ("vllm", "vllm-stock", "local"):
        got = [r for r in rows if r["engine"] == engine]
        assert len(got) == 2 * 3 and all(r["decode_tok_s"] > 0 for r in got), engine
        assert all(r["ratio_vs_vllm_stock"] > 0 for r in got)
    (mixed,) = [r for r in rows if r["engine"] == "vllm-mixed"]
    assert mixed["head"] == "1k+8k" and mixed["batch"] == 4 and mixed["mixed_vs_largest_alone"] > 0


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
    # The dtype the local engine ran at the default --dtype auto, as serve runs it.
    from heads.engine.cpu_linear import auto_compute_dtype

    assert data.meta["dtype"] == auto_compute_dtype() and data.meta["threads"] == 1
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
