"""oneDNN-packed vocabulary rows for the CPU unembedding.

PyTorch's dense `h @ W.T` is slow for decode's skinny shapes: on one core here, [b, 640] against
131072 rows took 31 / 62 / 92 / 292 ms at b = 1 / 4 / 16 / 64, and the same product over
16384-row blocks reordered once for oneDNN took 16 / 17 / 29 / 75 ms. So the CPU engine packs
each head's rows in blocks of `BLOCK_ROWS`, and the chunked and split kernels read logits
block by block from them.

Rows pack in their own dtype: fp32, or bf16 where oneDNN has a bf16 GEMM (AVX512-BF16 or
AMX), which halves the bytes a memory-bound step reads. oneDNN accumulates in fp32 either way;
a bf16 product's output is rounded to bf16 (as stock vLLM's bf16 LM head is) and then widened,
so callers always get fp32 logits.

Nested heads are prefixes of one shared matrix, so blocks are keyed by where their rows live
(`RowPacker`): the 32k head's two blocks are the 262k head's first two, and the packed copy
costs one extra copy of the largest head's rows. Results agree with `h @ W.T` to fp32 rounding.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from kernels import onednn_gemm
from kernels.errors import ShapeMismatch
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

BLOCK_ROWS = 16384


def packing_supported(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


class PackedRows:
    """Rows [V, d] (fp32 or bf16) as blocks of up to BLOCK_ROWS rows in oneDNN's layout."""

    def __init__(self, blocks: list[onednn_gemm.Product], sizes: list[int], d: int,
                 block_rows: int = BLOCK_ROWS, dtype: torch.dtype = torch.float32) -> None:
        self.blocks = blocks  # block j's product: h [b, d] -> [b, sizes[j]]
        self.sizes = sizes  # rows per block; all block_rows but the last
        self.block_rows = block_rows
        self.vocab = sum(sizes)
        self.d = d
        self.dtype = dtype  # the rows' dtype: a product's inputs are cast to it

    def block_logits(self, h: torch.Tensor, j: int) -> torch.Tensor:
        # h: [b, d] any float dtype -> [b, sizes[j]] fp32, rows j * block_rows onwards
        return self.blocks[j](h.to(self.dtype).contiguous()).float()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        # [b, d] -> [b, V] fp32
        self.check(h)
        h = h.to(self.dtype)
        return torch.cat([self.block_logits(h, j) for j in range(len(self.blocks))], dim=1)

    def check(self, h: torch.Tensor) -> None:
        if h.dim() != 2 or h.shape[1] != self.d or not h.dtype.is_floating_point:
            raise ShapeMismatch(f"packed rows take [b, {self.d}] floats, got "
                                f"{tuple(h.shape)} {h.dtype}")


class RowPacker:
    """Packs heads' rows, sharing the blocks of rows that live at the same address."""

    def __init__(self, block_rows: int = BLOCK_ROWS, provider: str = "torch",
                 int8_rows: int = 0) -> None:
        self.block_rows = block_rows
        self.provider = provider  # whose oneDNN product (kernels.onednn_gemm)
        self.int8_rows = int8_rows  # products of at most this many rows read integer groups
        self._blocks: dict[tuple[int, int, int], onednn_gemm.Product] = {}  # (address, rows, d)
        self._bytes = 0

    def pack(self, weight: torch.Tensor, int8: IntGroups | None = None) -> PackedRows:
        # weight: [V, d] fp32 or bf16 on the CPU, row-contiguous (a prefix view of a shared
        # matrix is); int8: the same rows as the source file stores them, or None
        if not packing_supported(weight) or weight.dim() != 2 or weight.stride(1) != 1:
            raise ShapeMismatch(f"cannot pack {weight.dtype} {tuple(weight.shape)} rows")
        blocks, sizes = [], []
        for lo in range(0, weight.shape[0], self.block_rows):
            rows = weight[lo:lo + self.block_rows]
            key = (rows.data_ptr(), rows.shape[0], rows.shape[1])
            if key not in self._blocks:
                few = None if int8 is None else int8.rows(lo, lo + rows.shape[0])
                self._blocks[key] = onednn_gemm.pack(rows, self.provider, few, self.int8_rows)
                self._bytes += rows.nbytes
            blocks.append(self._blocks[key])
            sizes.append(rows.shape[0])
        return PackedRows(blocks, sizes, weight.shape[1], self.block_rows, weight.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of packed copies made so far."""
        return self._bytes


class RowCover(Protocol):
    def rows(self, col: int) -> int:
        """How many leading rows of the batch see vocabulary column `col`."""
        ...


class BlockReader:
    """Logits of any column range [lo, hi) of packed rows for one hidden batch, computing
    each block once (the chunked kernel walks the columns in order, in sub-block chunks).

    `cover`: a nested pass (rows sorted by their head's V, descending) multiplies block j by
    the rows that see its first column only; a range then has cover.rows(lo) rows."""

    def __init__(self, packed: PackedRows, h: torch.Tensor,
                 cover: RowCover | None = None) -> None:
        packed.check(h)
        # h in the rows' dtype, cast once for every block
        self.packed, self.h, self.cover = packed, h.to(packed.dtype), cover
        self._j, self._block = -1, h.new_empty(0, dtype=torch.float32)

    def _rows(self, col: int) -> int:
        return self.h.shape[0] if self.cover is None else self.cover.rows(col)

    def __call__(self, lo: int, hi: int) -> torch.Tensor:
        # -> [rows(lo), hi - lo] fp32 (a view of the block when the range lies inside one)
        n = self.packed.block_rows
        j = lo // n
        end = (j + 1) * n
        if hi > end:  # spans blocks: only when a caller's chunk does not divide block_rows
            head, tail = self(lo, end), self(end, hi)
            if tail.shape[0] < head.shape[0]:
                # Rows that stop before `end` never read these cells (they score -inf).
                tail = torch.cat((tail, tail.new_zeros(head.shape[0] - tail.shape[0],
                                                       tail.shape[1])))
            return torch.cat((head, tail), dim=1)
        if j != self._j:
            rows = self._rows(j * n)
            self._j, self._block = j, self.packed.block_logits(self.h[:rows], j)
        base = j * n
        return self._block[:self._rows(lo), lo - base:hi - base]
