"""oneDNN-packed vocabulary rows: the same logits as h @ W.T (to fp32 rounding), shared blocks
for nested heads, and any column range read back across block boundaries."""

from __future__ import annotations

import pytest
import torch

from kernels import reference, split
from kernels.errors import ShapeMismatch
from kernels.packed_rows import BlockReader, RowPacker, packing_supported
from kernels.row_params import RowParams
from kernels.sampling_params import SamplingBatch

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.zeros(1, 1)), reason="no oneDNN in this torch")


def _rows(vocab: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, d, generator=g) / d**0.5


@pytest.mark.parametrize("b", [1, 3, 17, 64])
def test_logits_match_the_reference_on_odd_shapes(b: int) -> None:
    w = _rows(5003, 72)  # V not a multiple of the block, d off every tile
    h = torch.randn(b, 72, generator=torch.Generator().manual_seed(b))
    packed = RowPacker(block_rows=1024).pack(w)
    assert packed.sizes == [1024] * 4 + [907] and packed.vocab == 5003
    torch.testing.assert_close(packed.logits(h), reference.compute_logits(h, w),
                               atol=1e-5, rtol=1e-5)


def test_nested_heads_share_their_blocks() -> None:
    shared = _rows(4096, 32)
    packer = RowPacker(block_rows=1024)
    small, big = packer.pack(shared[:2048]), packer.pack(shared)
    assert packer.nbytes == shared.nbytes  # the 2048-row head added nothing
    assert small.blocks[1] is big.blocks[1]
    # A head whose prefix ends inside a block packs that partial block on its own.
    packer.pack(shared[:1500])
    assert packer.nbytes == shared.nbytes + 476 * 32 * 4


def test_block_reader_returns_any_range_including_across_blocks() -> None:
    w = _rows(3000, 40, seed=1)
    h = torch.randn(5, 40)
    full = reference.compute_logits(h, w)
    read = BlockReader(RowPacker(block_rows=700).pack(w), h)
    for lo, hi in [(0, 700), (700, 1000), (650, 2200), (2990, 3000)]:
        torch.testing.assert_close(read(lo, hi), full[:, lo:hi], atol=1e-5, rtol=1e-5)


def test_split_path_reads_packed_rows() -> None:
    w = _rows(2500, 48, seed=2)
    h = torch.randn(6, 48) * 3
    rows = [RowParams(temperature=0.0)] * 3 + [RowParams(temperature=0.8, seed=s) for s in range(3)]
    batch = SamplingBatch.from_rows(rows, [4] * 6, want_logprobs=True)
    want = split.unembed_and_sample(h, w, batch)
    got = split.unembed_and_sample(h, w, batch, packed=RowPacker(block_rows=1000).pack(w))
    assert torch.equal(got.token_ids, want.token_ids)
    assert got.logprobs is not None and want.logprobs is not None
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)


BF16 = packing_supported(torch.zeros(1, 1, dtype=torch.bfloat16))
# A bf16 product: inputs are bf16 values (exact in fp32), oneDNN accumulates in fp32 and
# rounds each output to bf16 once (8 significant bits), so a logit is off by at most 2^-8 of
# itself. The reference multiplies the same bf16 values in fp32.
BF16_RTOL = 2.0**-8


@pytest.mark.skipif(not BF16, reason="no oneDNN bf16 GEMM on this CPU")
@pytest.mark.parametrize("b", [1, 3, 17, 64])
def test_bf16_logits_match_the_fp32_product_of_the_same_values(b: int) -> None:
    w = _rows(5003, 72).to(torch.bfloat16)
    h = torch.randn(b, 72, generator=torch.Generator().manual_seed(b))
    packed = RowPacker(block_rows=1024).pack(w)
    assert packed.dtype == torch.bfloat16 and packer_bytes(w) == w.nbytes
    got = packed.logits(h)  # h is cast to bf16 inside
    assert got.dtype == torch.float32
    want = reference.compute_logits(h.to(torch.bfloat16), w)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=BF16_RTOL)


def packer_bytes(w: torch.Tensor) -> int:
    packer = RowPacker(block_rows=1024)
    packer.pack(w)
    return packer.nbytes


@pytest.mark.skipif(not BF16, reason="no oneDNN bf16 GEMM on this CPU")
def test_bf16_greedy_equals_fp32_where_the_margin_exceeds_bf16_rounding() -> None:
    w = _rows(4000, 64, seed=3).to(torch.bfloat16)
    h = (torch.randn(64, 64, generator=torch.Generator().manual_seed(4)) * 4).to(torch.bfloat16)
    batch = SamplingBatch.from_rows([RowParams(temperature=0.0)] * 64, [1] * 64)
    got = split.unembed_and_sample(h, w, batch, packed=RowPacker(block_rows=1000).pack(w))
    exact = reference.compute_logits(h, w)  # [64, V] fp32 from the same bf16 values
    top2 = exact.topk(2, dim=1).values
    # Two logits closer than 2 x 2^-8 of the larger may swap order once rounded.
    clear = (top2[:, 0] - top2[:, 1]) > top2[:, 0].abs() * 2.0**-7
    assert int(clear.sum()) > 48  # the check below must cover most rows
    assert torch.equal(got.token_ids[clear], exact.argmax(dim=1)[clear])


def test_rejects_rows_it_cannot_pack_and_mismatched_hidden() -> None:
    with pytest.raises(ShapeMismatch):
        RowPacker().pack(_rows(100, 8).to(torch.float16))
    with pytest.raises(ShapeMismatch):
        RowPacker().pack(_rows(100, 8).T)  # columns not contiguous
    packed = RowPacker().pack(_rows(100, 8))
    with pytest.raises(ShapeMismatch):
        packed.logits(torch.randn(2, 9))
