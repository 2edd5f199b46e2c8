"""Device table, roofline crossovers, calibration files and the selector (no kernels run)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import devices
from kernels.crossover_calibration import (
    CrossoverCalibration,
    crossover_from_sweep,
    entry_key,
    load_calibration,
    save_calibration,
)
from kernels.dispatch import batch_mode
from kernels.errors import UnknownDevice
from kernels.roofline import SPLIT_ONLY, path_times, roofline_crossover
from kernels.row_params import RowParams
from kernels.sampling_params import SamplingBatch
from kernels.selector import Selector, choose

ROOT = Path(__file__).resolve().parents[2]
H200 = devices.DEVICES["h200"]
CPU = devices.DEVICES["cpu"]


def test_device_table() -> None:
    want = {"a10g": 117, "l4": 403, "a100-40": 201, "a100-80": 153, "h100-sxm": 295,
            "h100-pcie": 378, "h200": 206, "b200": 281, "mi300x": 247}
    for name, rho in want.items():
        assert devices.DEVICES[name].ridge_point == pytest.approx(rho, rel=0.01)
    with pytest.raises(UnknownDevice):
        devices.lookup_device("tpu")
    assert devices.device_for_gpu_name("NVIDIA H200").name == "h200"
    assert devices.device_for_gpu_name("NVIDIA H100 PCIe").name == "h100-pcie"
    assert devices.device_for_gpu_name("NVIDIA A100-SXM4-40GB").name == "a100-40"


def test_device_table_is_pure_python() -> None:
    code = "import sys, kernels.devices; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_roofline_prefers_streaming_while_memory_bound() -> None:
    for mode in ("greedy", "sample"):
        assert roofline_crossover(262144, 640, "bfloat16", mode, H200) > 16
        # a wide model is compute-bound sooner: split wins at a finite b
        assert 16 < roofline_crossover(262144, 4096, "bfloat16", mode, H200) < 4096
        t = path_times(1, 262144, 640, "bfloat16", mode, H200)
        assert t.stream_s < t.split_s
    assert roofline_crossover(262144, 640, "bfloat16", SPLIT_ONLY, H200) == 1


def test_choose_uses_calibration_then_roofline() -> None:
    cal = CrossoverCalibration("h200",
                               {entry_key(32768, 640, "bfloat16", "sample"): {"b_star": 24.0}})
    assert choose(16, 32768, 640, "bfloat16", "sample", H200, cal).kernel == "fused"
    plan = choose(32, 32768, 640, "bfloat16", "sample", H200, cal)
    assert (plan.kernel, plan.b_star, plan.source) == ("split", 24.0, "calibration")
    assert choose(1, 131072, 640, "bfloat16", "sample", H200, cal).source == "roofline"
    assert choose(1, 32768, 640, "bfloat16", "sample", CPU).kernel == "chunked"
    assert choose(1, 32768, 640, "bfloat16", SPLIT_ONLY, H200).kernel == "split"
    never = CrossoverCalibration("h200", {entry_key(8, 8, "float32", "greedy"): {"b_star": None}})
    assert choose(10**6, 8, 8, "float32", "greedy", H200, never).kernel == "fused"


def test_selector_hysteresis_does_not_flap() -> None:
    cal = CrossoverCalibration("h200",
                               {entry_key(32768, 640, "bfloat16", "sample"): {"b_star": 40.0}})
    sel = Selector(cal, hysteresis=0.25)

    def pick(b: int) -> str:
        return sel.choose(b, 32768, 640, "bfloat16", "sample", H200).kernel

    assert pick(39) == "fused"
    assert pick(45) == "fused"  # inside the band: stays
    assert pick(50) == "split"  # >= 1.25 b*
    assert pick(39) == "split"  # inside the band: stays
    assert pick(30) == "fused"  # <= 0.75 b*
    assert [pick(b) for b in (38, 42, 38, 42)] == ["fused"] * 4


def test_crossover_from_sweep() -> None:
    bs = [1, 2, 4, 8, 16]
    assert crossover_from_sweep(bs, [1, 1, 1, 1, 1], [2, 2, 2, 2, 2]) == math.inf
    assert crossover_from_sweep(bs, [2] * 5, [1] * 5) == 1
    # a noisy early split win does not count: split must keep winning
    assert crossover_from_sweep(bs, [1, 3, 1, 3, 3], [2, 2, 2, 2, 2]) == pytest.approx(
        math.sqrt(4 * 8))


def test_calibration_round_trip(tmp_path: Path) -> None:
    cal = CrossoverCalibration("cpu:Test CPU",
                               {entry_key(1, 2, "float32", "greedy"): {"b_star": None}},
                               {"bw": 0.5})
    path = save_calibration(cal, tmp_path)
    assert path.name == "cpu-test-cpu.json"
    back = load_calibration("cpu:Test CPU", tmp_path)
    assert back is not None and back.b_star(1, 2, "float32", "greedy") == math.inf
    assert back.fitted() is not None and back.fitted().bw == 0.5
    assert load_calibration("other", tmp_path) is None


def test_batch_mode() -> None:
    def mode(*rows: RowParams) -> str:
        return batch_mode(SamplingBatch.from_rows(list(rows), [0] * len(rows)), 1000)

    assert mode(RowParams(0.0)) == "greedy"
    assert mode(RowParams(0.0), RowParams(1.0)) == "sample"
    assert mode(RowParams(1.0, top_k=1000)) == "sample"  # top_k >= V is off
    assert mode(RowParams(1.0, top_k=40)) == "top_k"
    assert mode(RowParams(1.0, top_k=40), RowParams(1.0, top_p=0.9)) == "top_p"
    assert mode(RowParams(1.0, top_k=65)) == SPLIT_ONLY
    assert torch.get_num_threads() >= 1


def test_a_measured_roofline_replaces_the_guessed_one() -> None:
    from kernels.crossover_calibration import CrossoverCalibration
    from kernels.devices import DeviceSpec

    guess = DeviceSpec("cpu:x", 2e12, 100e9, 5e-6)
    assert CrossoverCalibration("cpu:x").roofline(guess) == guess  # nothing measured
    cal = CrossoverCalibration("cpu:x", meta={"roofline": {"mem_bw": 16e9, "peak_flops": 1.5e12,
                                                           "dtype": "bfloat16", "threads": 1}})
    got = cal.roofline(guess)
    assert (got.name, got.mem_bw, got.peak_flops, got.launch_overhead_s) == (
        "cpu:x", 16e9, 1.5e12, 5e-6)
