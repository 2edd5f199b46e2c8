"""The plugin's nested-block logits against a per-head reference (plain torch, no vLLM)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from heads.vllm_plugin.layout import HeadRange, VocabLayout
from heads.vllm_plugin.nested_logits import (
    REUSED_ROWS,
    BlockRows,
    NestedLogits,
    block_cuts,
    head_groups,
)

D = 24
TOL = dict(rtol=1e-4, atol=1e-4)  # batched vs row-by-row matmuls round differently


def _layout() -> VocabLayout:
    # Three nested heads on matrix 0 (odd sizes), a low-rank-style head with its own matrix 1
    # and a bias, and a hidden-adapted head reading matrix 0's first 37 rows.
    heads = (HeadRange("a", 0, 37, 0, 0, (1,)), HeadRange("b", 37, 101, 0, 0, (1,)),
             HeadRange("c", 138, 250, 0, 0, (1,)),
             HeadRange("d", 388, 64, 0, 1, (1,), "lowrank"),
             HeadRange("e", 452, 37, 0, 0, (1,), "hidden", 3))
    layout = VocabLayout(heads, (("m0", 250), ("m1", 64)))
    layout.validate()
    return layout


class _Ref:
    def __init__(self, layout: VocabLayout) -> None:
        g = torch.Generator().manual_seed(0)
        self.layout = layout
        self.matrices = [torch.randn(r, D, generator=g) for _, r in layout.matrices]
        self.bias = {3: torch.randn(64, generator=g), 4: torch.randn(37, generator=g)}
        self.down, self.up = torch.randn(3, D, generator=g), torch.randn(D, 3, generator=g)
        self.softcap = 5.0
        self.gemm_rows: list[int] = []  # rows of every GEMM call, to count matrix reads

    def gemm(self, layer: BlockRows, x: torch.Tensor, w: torch.Tensor,
             bias: object) -> torch.Tensor:
        assert x.is_contiguous() and w is layer.weight
        self.gemm_rows.append(w.shape[0])
        return F.linear(x.float(), w).to(x.dtype)  # in the activations' dtype, as vLLM's

    def adapt(self, i: int, h: torch.Tensor) -> torch.Tensor:
        assert i == 4
        return h + ((h.float() @ self.down.T) @ self.up.T).to(h.dtype)

    def finish(self, i: int, y: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        if i in self.bias:
            y = y + self.bias[i][start:stop]
        return torch.tanh(y / self.softcap) * self.softcap

    def nested(self) -> NestedLogits:
        return NestedLogits(self.layout, self.matrices, self.gemm, lambda b: None, self.finish,
                            self.adapt)

    def expected(self, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        out = torch.full((h.shape[0], self.layout.total_vocab), float("-inf"))
        for r in range(h.shape[0]):
            i = int(head[r])
            spec = self.layout.heads[i]
            x = self.adapt(i, h[r:r + 1]) if spec.adapter == "hidden" else h[r:r + 1]
            y = F.linear(x, self.matrices[spec.unembedding][: spec.vocab_size])
            out[r, spec.offset: spec.offset + spec.vocab_size] = self.finish(
                i, y, 0, spec.vocab_size)[0]
        return out


def test_blocks_cut_each_matrix_at_every_head_size() -> None:
    layout = _layout()
    assert block_cuts(layout) == {0: [37, 101, 250], 1: [64]}
    groups = head_groups(layout)
    assert [(g.matrix, g.members, g.hidden_adapter) for g in groups] == [
        (0, (0, 1, 2), False), (1, (3,), False), (0, (4,), True)]


def test_single_head_batches_equal_the_reference() -> None:
    ref = _Ref(_layout())
    nested = ref.nested()
    # Rows sliced off a wider tensor, as the plugin's [N, d + 1] hidden states are.
    h = torch.randn(7, D + 1, generator=torch.Generator().manual_seed(1))[:, :-1]
    for i in range(5):
        head = torch.full((7,), i)
        torch.testing.assert_close(nested(h, head), ref.expected(h, head), **TOL)


def test_mixed_batches_equal_the_reference_and_read_each_block_once() -> None:
    ref = _Ref(_layout())
    nested = ref.nested()
    h = torch.randn(11, D, generator=torch.Generator().manual_seed(2))
    head = torch.tensor([2, 0, 4, 1, 2, 3, 0, 2, 4, 1, 3])
    ref.gemm_rows.clear()
    torch.testing.assert_close(nested(h, head), ref.expected(h, head), **TOL)
    # Matrix 0's three blocks once for heads a, b, c together; matrix 1 once; the hidden
    # head its own first block: no head's rows are multiplied per head.
    assert sorted(ref.gemm_rows) == sorted([37, 64, 149, 37, 64])
    # Rows of the 262k-like head see every block, so a mix costs no more GEMM calls than it.
    mix = torch.tensor([0, 2, 0, 2])
    ref.gemm_rows.clear()
    torch.testing.assert_close(nested(h[:4], mix), ref.expected(h[:4], mix), **TOL)
    assert ref.gemm_rows == [37, 64, 149]


def _sampler_in_place(out: torch.Tensor, head: torch.Tensor, layout: VocabLayout) -> None:
    """What vLLM's sampler may do to its logits in place: temperature scales every column,
    a penalty or bias changes columns of the row's own head, masks write -inf anywhere."""
    out.div_(0.7)
    for r, i in enumerate(head.tolist()):
        spec = layout.heads[i]
        out[r, spec.offset: spec.offset + 2] += 3.0
    out[:, -5:] = float("-inf")


def test_steps_that_reuse_the_logits_buffer_leave_nothing_of_the_last_step() -> None:
    """Decode-sized calls on CPU write into one kept fp32 buffer and mask only the ranges the
    last step left finite: a step after a wider, mixed or other-head step still equals the
    reference everywhere (no stale logits, every -inf in place), after the sampler wrote into
    the last step's logits; a call past REUSED_ROWS gets its own tensor."""
    ref = _Ref(_layout())
    nested = ref.nested()
    g = torch.Generator().manual_seed(4)
    steps = [torch.tensor([2, 0, 4, 1, 2, 3, 0, 2, 4, 1, 3]), torch.full((5,), 0),
             torch.tensor([3, 1, 1]), torch.full((9,), 2), torch.full((9,), 2),
             torch.tensor([4, 0]), torch.full((11,), 4), torch.full((11,), 1)]
    first = None
    for k, head in enumerate(steps):
        h = torch.randn(head.shape[0], D, generator=g)
        if k % 2:  # bf16 activations (the plugin's default dtype): bf16 block products
            h = h.to(torch.bfloat16)
        out = nested(h, head)
        assert out.dtype == torch.float32  # what vLLM's sampler computes in
        tol = TOL if h.dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
        torch.testing.assert_close(out, ref.expected(h.float(), head), **tol)
        first = first if first is not None else out.data_ptr()
        assert out.data_ptr() == first  # the same storage, rewritten
        _sampler_in_place(out, head, ref.layout)
    n = REUSED_ROWS + 1
    h, head = torch.randn(n, D, generator=g), torch.full((n,), 1)
    big = nested(h, head)
    torch.testing.assert_close(big, ref.expected(h, head), **TOL)
    assert big.data_ptr() != first


@pytest.mark.parametrize("heads", [[1] * 6, [2, 0, 1, 2, 3, 4]])
def test_rows_that_stay_on_their_heads_are_not_masked_again(heads: list[int]) -> None:
    """The kept buffer's rows are -inf outside their heads' ranges from their first step on:
    a later step with every row on the same head writes only those ranges (one head, or a
    mixed batch)."""
    ref = _Ref(_layout())
    nested = ref.nested()
    h, head = torch.randn(len(heads), D), torch.tensor(heads)
    before = nested(h, head).clone()
    own = torch.zeros(before.shape, dtype=torch.bool)
    for r, i in enumerate(heads):
        spec = ref.layout.heads[i]
        own[r, spec.offset: spec.offset + spec.vocab_size] = True
    # Poison the other ranges with a value no mask writes: the next step must leave them.
    out = nested(h, head)
    out[~own] = -1e30
    again = nested(h, head)
    assert (again[~own] == -1e30).all()
    torch.testing.assert_close(again[own], before[own])
    # A row that changes head is masked again where it was.
    fresh = ref.nested()
    _sampler_in_place(fresh(h, head), head, ref.layout)
    moved = head.clone()
    moved[0] = 3 if heads[0] != 3 else 0
    torch.testing.assert_close(fresh(h, moved), ref.expected(h, moved), **TOL)


def test_empty_batch() -> None:
    ref = _Ref(_layout())
    out = ref.nested()(torch.empty(0, D), torch.empty(0, dtype=torch.int64))
    assert out.shape == (0, 489)


def test_tensor_parallel_pieces_cover_each_block_once() -> None:
    """Rank r's piece of a block, all-gathered and trimmed, is the block (odd sizes, padding)."""
    w = torch.randn(250, D)
    for tp in (1, 2, 3, 4):
        for start, stop in ((0, 37), (37, 101), (101, 250)):
            pieces = [BlockRows(w, start, stop, r, tp).weight for r in range(tp)]
            assert len({p.shape for p in pieces}) == 1  # equal widths, as a gather needs
            torch.testing.assert_close(torch.cat(pieces)[: stop - start], w[start:stop])


def test_tensor_parallel_logits_equal_one_rank() -> None:
    """Two ranks in lockstep: each multiplies its pieces; the fake gather pairs them."""
    ref = _Ref(_layout())
    h = torch.randn(9, D, generator=torch.Generator().manual_seed(3))
    head = torch.tensor([2, 0, 4, 1, 2, 3, 0, 2, 4])
    other: list[torch.Tensor] = []  # rank 1's pieces, in call order

    def rank1_gemm(layer: BlockRows, x: torch.Tensor, w: torch.Tensor, b: object) -> torch.Tensor:
        other.append(F.linear(x, w))
        return other[-1]

    rank1 = NestedLogits(ref.layout, ref.matrices, rank1_gemm, lambda b: None, ref.finish,
                         ref.adapt, 1, 2, lambda y: torch.cat([torch.zeros_like(y), y], dim=-1))
    rank1(h, head)  # its own output lacks rank 0's pieces: only its pieces are kept
    pieces = iter(other)
    rank0 = NestedLogits(ref.layout, ref.matrices, ref.gemm, lambda b: None, ref.finish,
                         ref.adapt, 0, 2, lambda y: torch.cat([y, next(pieces)], dim=-1))
    torch.testing.assert_close(rank0(h, head), ref.expected(h, head), **TOL)
