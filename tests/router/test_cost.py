from __future__ import annotations

import math

import pytest

from kernels.devices import DEVICES, DeviceSpec, detect_cpu
from router.cost import (
    context_tokens,
    infer_cost_per_byte,
    lifecycle_cost,
    step_cost,
    train_cost_per_byte,
)
from router.profiles import HeadProfile, RequestFeatures, estimate_bytes_per_token
from tests.router.helpers import N, heads

H100 = DEVICES["h100-sxm"]


def _best(costs: dict[str, float]) -> str:
    return min(costs, key=costs.__getitem__)


def test_ridge_points_match_the_design_brief() -> None:
    want = {"a10g": 117, "a100-80": 153, "h100-sxm": 295, "h200": 206}
    for name, rho in want.items():
        assert DEVICES[name].ridge_point == pytest.approx(rho, rel=0.01)
    assert 16 <= DEVICES["cpu"].ridge_point <= 32


def test_detect_cpu_reads_flags_and_clock(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Test CPU\ncpu MHz\t\t: 2000.0\nflags\t\t: fpu avx2 fma\n")
    spec = detect_cpu(info, cores=8)
    assert spec.name == "cpu:Test CPU"
    assert spec.peak_flops == pytest.approx(8 * 2e9 * 32)
    assert spec.mem_bw >= 20e9 and spec.ridge_point > 0
    assert detect_cpu(tmp_path / "missing", cores=1).peak_flops == pytest.approx(2.5e9 * 16)


def test_step_cost_bounds_and_resources() -> None:
    head = heads()[0]
    step = step_cost(head, H100, batch=4, ctx_tokens=1000)
    assert step.weights_s == pytest.approx(2 * N / H100.mem_bw)
    assert step.kv_s == pytest.approx(4 * 1000 * 65536 / H100.mem_bw)
    attention = 2 * 4 * 1000 * 65536 / 2  # QKᵀ and AV over the KV elements (bf16: 2 B each)
    flops = 2 * 4 * (N + 32768 * 2048) + attention
    assert step.compute_s == pytest.approx(flops / H100.peak_flops)
    assert step.sampler_s == 0.0  # fused kernel below the ridge point
    big = step_cost(head, H100, batch=512, ctx_tokens=1000)
    assert big.sampler_s == pytest.approx(8 * 512 * 32768 / H100.mem_bw)
    assert big.pessimistic_s == pytest.approx(sum(big.resources().values()) + 20e-6)
    assert step.optimistic_s <= step.estimate_s <= step.pessimistic_s
    assert step.optimistic_s == pytest.approx(max(step.memory_s, step.compute_s) + 20e-6)


def test_infer_cost_falls_with_batch_and_rises_with_vocab_at_fixed_bpt() -> None:
    same_bpt = heads(bpt=(4.0, 4.0, 4.0))
    for head in same_bpt:
        costs = [infer_cost_per_byte(head, H100, b, 500) for b in (1, 4, 16, 64)]
        assert costs == sorted(costs, reverse=True)
    at_b1 = [infer_cost_per_byte(h, H100, 1, 500) for h in same_bpt]
    assert at_b1 == sorted(at_b1)


def test_batch_one_prefers_small_vocab_on_memory_bound_device() -> None:
    feats = RequestFeatures(prompt_bytes=2000, max_tokens=256)
    for lam in (0.0, 1.0, 100.0):
        costs = {
            h.name: lifecycle_cost(h, H100, 1, lam, context_tokens(h, feats)).total for h in heads()
        }
        assert _best(costs) == "32k"


def test_big_batch_and_high_lambda_flip_to_large_vocab_when_compression_pays() -> None:
    feats = RequestFeatures(prompt_bytes=8000, max_tokens=256)

    def best(lam: float, batch: int, profiles: list[HeadProfile]) -> str:
        return _best(
            {
                h.name: lifecycle_cost(h, H100, batch, lam, context_tokens(h, feats)).total
                for h in profiles
            }
        )

    assert best(0.0, 256, heads()) == "32k"  # training alone favours the small head
    assert best(10.0, 256, heads()) == "262k"  # KV and step savings now dominate
    # Without the compression gain a big vocabulary never pays.
    assert best(10.0, 256, heads(bpt=(4.0, 4.0, 4.0))) == "32k"


def test_train_cost_units() -> None:
    head = heads()[2]
    flops_per_byte = 6 * (N + 262144 * 2048) / 4.6
    assert train_cost_per_byte(head, H100) == pytest.approx(flops_per_byte / H100.peak_flops)


def test_bytes_per_token_estimate_is_monotone_and_documented_anchors() -> None:
    assert estimate_bytes_per_token(32768) == pytest.approx(3.9)
    assert estimate_bytes_per_token(262144) == pytest.approx(4.6)
    values = [estimate_bytes_per_token(2**k) for k in range(1, 21)]
    assert values == sorted(values) and min(values) >= 1.0
    head = HeadProfile("x", 131072, 64, 0, 0.0)
    assert head.bpt == pytest.approx(3.9 + 0.7 * math.log(4) / math.log(8))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"vocab_size": 0},
        {"hidden_size": -1},
        {"bytes_per_token": 0.0},
        {"weight_bytes_per_param": 0},
        {"training_bytes": -1.0},
    ],
)
def test_profile_validation(kwargs: dict) -> None:
    base = dict(name="h", vocab_size=10, hidden_size=4, backbone_params=1, kv_bytes_per_token=1.0)
    with pytest.raises(ValueError):
        HeadProfile(**{**base, **kwargs})


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        DeviceSpec("bad", 0, 1)
    with pytest.raises(ValueError):
        step_cost(heads()[0], H100, 0, 10)
    with pytest.raises(ValueError):
        lifecycle_cost(heads()[0], H100, 1, -1.0, 10)
