"""The integer-group GEMV (heads/model/native/int_groups_gemv.cpp) against the dequantised
fp32 product, on odd shapes, every row count up to two passes of four, 8-, 5- and 4-bit
values, both scale dtypes, with and without offsets, bf16 and fp32 activations.

Tolerance: each group of x is quantised with its own scale, to int8 on the VNNI path (an error
of at most 1/254 of the group's largest |x|) and to int16 otherwise (2^-16), the sums are fp32,
and a bf16 result is rounded once. So a result is within one output rounding of the exact
product plus twice that error times the sum of |w|·max|x_group| terms.
"""

from __future__ import annotations

import pytest
import torch

from kernels.int_groups import GROUP, IntGroups

BF16_ULP = 2.0**-7


_RANGE = {8: (-128, 128), 5: (-16, 16), 4: (0, 16)}


def _groups(n: int, k: int, scale_dtype: torch.dtype, offsets: bool, seed: int,
            bits: int = 8) -> IntGroups:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(*_RANGE[bits], (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 0.02).to(scale_dtype)
    off = torch.randn(n, k // GROUP, generator=gen) * 0.05 if offsets else None
    return IntGroups.pack(values, scales, off, bits)


def _gemv(ops, x: torch.Tensor, g: IntGroups) -> torch.Tensor:
    high = torch.empty(0, dtype=torch.uint8) if g.high is None else g.high
    off = torch.empty(0) if g.offsets is None else g.offsets
    return ops.gemv_groups(x, g.values, high, g.scales, off, g.bits)


@pytest.mark.parametrize("n,k", [(1, 32), (37, 96), (1027, 640), (300, 2048)])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [8, 5, 4])
def test_gemv_matches_the_dequantised_product(ops, n, k, scale_dtype, offsets, x_dtype,
                                              bits) -> None:
    g = _groups(n, k, scale_dtype, offsets, seed=n + k, bits=bits)
    w = g.dequantize()  # exact in fp32
    for b in (1, 2, 3, 4, 5, 8, 9):
        x = (torch.randn(b, k, generator=torch.Generator().manual_seed(b)) * 3).to(x_dtype)
        got = _gemv(ops, x, g)
        assert got.dtype == x_dtype and got.shape == (b, n)
        want = x.float() @ w.T
        xmax = x.float().abs().view(b, k // GROUP, GROUP).amax(-1, keepdim=True)
        step = 2.0**-7 if ops.gemv_groups_activation_bits() == 8 else 2.0**-15
        bound = (xmax.expand(b, k // GROUP, GROUP).reshape(b, k) @ w.abs().T) * step
        rtol = BF16_ULP if x_dtype == torch.bfloat16 else 1e-6
        err = (got.float() - want).abs()
        assert bool((err <= want.abs() * rtol + bound + 1e-5).all()), float(err.max())


def test_gemv_refuses_bad_shapes(ops) -> None:
    g = _groups(8, 64, torch.float16, False, seed=0)
    none, u8 = torch.empty(0), torch.empty(0, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="gemv_groups"):
        ops.gemv_groups(torch.randn(1, 48), g.values[:, :48].contiguous(), u8, g.scales, none, 8)
    with pytest.raises(RuntimeError, match="gemv_groups"):
        ops.gemv_groups(torch.randn(1, 64), g.values, u8, g.scales[:, :1].contiguous(), none, 8)
    with pytest.raises(RuntimeError, match="gemv_groups"):
        ops.gemv_groups(torch.randn(1, 64), g.values.float(), u8, g.scales, none, 8)
    with pytest.raises(RuntimeError, match="bits"):
        ops.gemv_groups(torch.randn(1, 64), g.values, u8, g.scales, none, 6)
    five = _groups(8, 64, torch.float16, False, seed=0, bits=5)
    with pytest.raises(RuntimeError, match="high"):  # 5 bits without their fifth-bit masks
        ops.gemv_groups(torch.randn(1, 64), five.values, u8, five.scales, none, 5)
    with pytest.raises(RuntimeError, match="gemv_groups"):  # nibbles read as int8 rows
        ops.gemv_groups(torch.randn(1, 64), five.values, u8, five.scales, none, 8)


@pytest.mark.parametrize("bits", [8, 5, 4])
def test_groups_product_takes_the_gemv(ops, bits) -> None:
    g = _groups(100, 64, torch.float16, True, seed=3, bits=bits)
    x = torch.randn(2, 64).to(torch.bfloat16)
    torch.testing.assert_close(g.product()(x), _gemv(ops, x, g))
