"""The router's cost model and the engine's selector pick the same kernel for every group."""

from __future__ import annotations

import math

import pytest

from kernels.crossover import DEFAULT_MODE, crossover_batch, dtype_for_bytes
from kernels.crossover_calibration import CrossoverCalibration, entry_key
from kernels.devices import DEVICES
from kernels.selector import choose
from router.cost import LOGIT_BYTES, AnalyticTimer, Group, mixed_step_cost, split_kernel
from router.profiles import HeadProfile


def _head(vocab: int, d: int = 640, s: float = 2.0) -> HeadProfile:
    return HeadProfile(f"v{vocab}", vocab, d, backbone_params=200_000_000,
                       kv_bytes_per_token=20_000.0, weight_bytes_per_param=s)


@pytest.mark.parametrize("device", ["cpu", "a10g", "h200", "b200"])
@pytest.mark.parametrize("vocab", [32_768, 131_072, 262_144])
@pytest.mark.parametrize("s", [2.0, 4.0])
def test_router_and_selector_agree(device: str, vocab: int, s: float) -> None:
    spec, head = DEVICES[device], _head(vocab, s=s)
    for b in (1, 2, 7, 16, 33, 64, 100, 129, 256, 511, 1024, 3000):
        engine = choose(b, vocab, head.hidden_size, dtype_for_bytes(s), DEFAULT_MODE, spec)
        assert split_kernel(Group(head, b, 100.0), spec) == (engine.kernel == "split"), b


def test_sampler_traffic_is_charged_exactly_when_the_engine_runs_split() -> None:
    spec, head = DEVICES["h200"], _head(262_144)
    b_star, _ = crossover_batch(262_144, 640, "bfloat16", DEFAULT_MODE, spec)
    assert 1 < b_star < math.inf
    below = mixed_step_cost([Group(head, int(b_star) - 1, 0.0)], spec)
    at = mixed_step_cost([Group(head, int(b_star), 0.0)], spec)
    assert below.sampler_s == 0
    assert at.sampler_s == pytest.approx(LOGIT_BYTES * b_star * 262_144 / spec.mem_bw)


def test_a_calibrated_crossover_moves_both_sides() -> None:
    spec, head = DEVICES["h200"], _head(131_072)
    key = entry_key(131_072, 640, "bfloat16", DEFAULT_MODE)
    cal = CrossoverCalibration("h200", {key: {"b_star": 3}})
    assert choose(3, 131_072, 640, "bfloat16", DEFAULT_MODE, spec, cal).kernel == "split"
    assert split_kernel(Group(head, 3, 0.0), spec, cal)
    assert not split_kernel(Group(head, 3, 0.0), spec)
    timer = AnalyticTimer(spec, cal)
    assert timer.step_time([Group(head, 3, 0.0)]) > AnalyticTimer(spec).step_time(
        [Group(head, 3, 0.0)])


def test_weight_dtype_must_be_one_the_kernels_know() -> None:
    with pytest.raises(ValueError, match="no weight dtype"):
        _head(32_768, s=3.0)
