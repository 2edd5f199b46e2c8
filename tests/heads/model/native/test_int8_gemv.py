"""The int8-group GEMV (heads/model/native/int8_gemv.cpp) against the dequantised fp32
product, on odd shapes, every row count up to two passes of four, both scale dtypes, with and
without offsets, bf16 and fp32 activations.

Tolerance: each group of x is quantised to int16 with its own scale (a relative error of at
most 2^-16 of the group's largest |x|), the sums are fp32, and a bf16 result is rounded once.
So a result is within one output rounding of the exact product plus 2^-15 of the sum of
|w|·max|x_group| terms.
"""

from __future__ import annotations

import pytest
import torch

from heads.model.native import build
from kernels.int8_groups import GROUP, Int8Groups

BF16_ULP = 2.0**-7


@pytest.fixture(scope="module")
def ops() -> object:
    assert build.load(), "fused CPU ops did not build"
    if not hasattr(torch.ops.polyhead, "gemv_int8"):
        pytest.skip("this CPU has no AVX512-BW: the int8 GEMV is not built")
    return torch.ops.polyhead


def _groups(n: int, k: int, scale_dtype: torch.dtype, offsets: bool, seed: int) -> Int8Groups:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 0.02).to(scale_dtype)
    off = torch.randn(n, k // GROUP, generator=gen) * 0.05 if offsets else None
    return Int8Groups(values, scales, off)


@pytest.mark.parametrize("n,k", [(1, 32), (37, 96), (1027, 640), (300, 2048)])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_gemv_int8_matches_the_dequantised_product(ops, n, k, scale_dtype, offsets,
                                                    x_dtype) -> None:
    g = _groups(n, k, scale_dtype, offsets, seed=n + k)
    w = g.dequantize()  # exact in fp32
    empty = torch.empty(0)
    for b in (1, 2, 3, 4, 5, 8, 9):
        x = (torch.randn(b, k, generator=torch.Generator().manual_seed(b)) * 3).to(x_dtype)
        got = ops.gemv_int8(x, g.values, g.scales, empty if g.offsets is None else g.offsets)
        assert got.dtype == x_dtype and got.shape == (b, n)
        want = x.float() @ w.T
        xmax = x.float().abs().view(b, k // GROUP, GROUP).amax(-1, keepdim=True)
        bound = (xmax.expand(b, k // GROUP, GROUP).reshape(b, k) @ w.abs().T) * 2.0**-15
        rtol = BF16_ULP if x_dtype == torch.bfloat16 else 1e-6
        err = (got.float() - want).abs()
        assert bool((err <= want.abs() * rtol + bound + 1e-5).all()), float(err.max())


def test_gemv_int8_refuses_bad_shapes(ops) -> None:
    g = _groups(8, 64, torch.float16, False, seed=0)
    with pytest.raises(RuntimeError, match="gemv_int8"):
        ops.gemv_int8(torch.randn(1, 48), g.values[:, :48].contiguous(), g.scales, torch.empty(0))
    with pytest.raises(RuntimeError, match="gemv_int8"):
        ops.gemv_int8(torch.randn(1, 64), g.values, g.scales[:, :1].contiguous(), torch.empty(0))
    with pytest.raises(RuntimeError, match="gemv_int8"):
        ops.gemv_int8(torch.randn(1, 64), g.values.float(), g.scales, torch.empty(0))


def test_groups_product_takes_the_gemv(ops) -> None:
    g = _groups(100, 64, torch.float16, True, seed=3)
    x = torch.randn(2, 64).to(torch.bfloat16)
    torch.testing.assert_close(g.product()(x), ops.gemv_int8(x, g.values, g.scales, g.offsets))
