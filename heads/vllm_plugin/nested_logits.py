"""Every head's logits from row blocks of its (shared, nested) matrix, each block multiplied
once per step, through vLLM's own GEMM dispatch.

Nested heads read the first V_h rows of one matrix. Cutting that matrix at every head's V_h
gives blocks [c_{k-1}, c_k); block k is multiplied only by the hidden states of the requests
whose head covers it (V_h >= c_k), once for all of them. A batch mixing the 32k and 262k
heads then reads each row once, as the 262k head alone does, and a 32k request pays only for
its first block.

Each block's GEMM goes through `dispatch_unquantized_gemm`, the path stock vLLM's lm_head
takes: on CPU a oneDNN handle with its own prepacked copy of the block (the same copy stock
vLLM keeps of a tied lm_head), elsewhere `F.linear`. The profile of the plugin against stock
vLLM on the Gemma-3 262k head (fp32, one thread) showed plain `F.linear` (aten::mm) at 1.6x
the time of the oneDNN call on the same [262144, 640] matrix at B=16; one handle per block,
not per head, so no row is packed twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from heads.vllm_plugin.layout import VocabLayout

REUSED_ROWS = 256  # calls of at most this many rows write into one kept buffer (_kept)
Gemm = Callable[..., torch.Tensor]  # vLLM's (layer, x [n, d], weight [V, d], bias) -> [n, V]


class BlockRows:
    """Rows [start, stop) of one head matrix, or under tensor parallelism this rank's piece
    of them: the `layer` vLLM's GEMM dispatch prepares.

    Vocab-parallel as vLLM's ParallelLMHead, block by block: with tp ranks, rank r holds rows
    [start + r P, start + (r + 1) P) of the block, P = ceil((stop - start) / tp), the last
    piece zero-padded to P rows, so every rank multiplies 1/tp of every block and an
    all-gather of the [n, P] pieces, trimmed to stop - start, is the block's logits."""

    def __init__(self, weight: torch.Tensor, start: int, stop: int, rank: int = 0,
                 tp: int = 1) -> None:
        piece = -(-(stop - start) // tp)
        a = min(start + rank * piece, stop)
        rows = weight[a: min(a + piece, stop)]  # [<= P, d], a view
        if tp > 1:  # an owned (padded) copy, so the gathered whole matrix can go
            rows = torch.cat([rows, rows.new_zeros(piece - rows.shape[0], rows.shape[1])])
        self.weight = rows
        self.bias = None
        self.start, self.stop = start, stop


@dataclass(frozen=True, slots=True)
class HeadGroup:
    """Heads whose requests share one input to the GEMM: the plain heads of one matrix, or a
    single head with a hidden adapter (its own transformed hidden state)."""

    matrix: int
    members: tuple[int, ...]  # head indices into the layout
    hidden_adapter: bool


def head_groups(layout: VocabLayout) -> list[HeadGroup]:
    plain: dict[int, list[int]] = {}
    groups = []
    for i, h in enumerate(layout.heads):
        if h.adapter == "hidden":
            groups.append(HeadGroup(h.unembedding, (i,), True))
        else:
            plain.setdefault(h.unembedding, []).append(i)
    return [HeadGroup(m, tuple(ms), False) for m, ms in plain.items()] + groups


def block_cuts(layout: VocabLayout) -> dict[int, list[int]]:
    """Matrix index -> its cut points: every V_h read from it, ascending."""
    cuts: dict[int, set[int]] = {}
    for h in layout.heads:
        cuts.setdefault(h.unembedding, set()).add(h.vocab_size)
    return {m: sorted(c) for m, c in cuts.items()}


class NestedLogits:
    """`__call__(h [n, d], head [n]) -> logits [n, ΣV_h]`, -inf outside each row's head
    (fp32 in the buffer kept on CPU, else h's dtype)."""

    def __init__(self, layout: VocabLayout, matrices: list[torch.Tensor], gemm: Gemm,
                 prepare: Callable[[BlockRows], None],
                 finish: Callable[[int, torch.Tensor, int, int], torch.Tensor],
                 adapt: Callable[[int, torch.Tensor], torch.Tensor], rank: int = 0,
                 tp: int = 1, gather: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> None:
        """`matrices`: every head matrix, whole (each rank cuts its own pieces);
        `prepare(block)` readies a block for `gemm` (vLLM's CPU dispatch); `finish(i, y,
        start, stop)` adds head i's bias over local columns [start, stop) and soft-caps;
        `adapt(i, h)` maps h through head i's hidden adapter; `gather` all-gathers the
        ranks' [n, P] pieces along the last dim (tp > 1)."""
        self.layout, self.gemm, self.finish, self.adapt = layout, gemm, finish, adapt
        self.gather = gather if tp > 1 else None
        if tp > 1 and gather is None:
            raise ValueError("tensor parallel logits need a gather")
        self.total = layout.total_vocab
        self.groups = head_groups(layout)
        self.blocks: dict[int, list[BlockRows]] = {}
        for m, cuts in block_cuts(layout).items():
            starts = [0, *cuts[:-1]]
            self.blocks[m] = [BlockRows(matrices[m], a, b, rank, tp)
                              for a, b in zip(starts, cuts, strict=True)]
            for block in self.blocks[m]:
                prepare(block)
        self.vocab = torch.tensor([h.vocab_size for h in layout.heads], dtype=torch.int64)
        self._buffer: torch.Tensor | None = None  # see _kept
        self._row_head = torch.empty(0, dtype=torch.int64)  # per _buffer row, see _kept

    def __call__(self, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        n = h.shape[0]
        if n == 0:
            return h.new_empty((0, self.total))
        lo, hi = int(head.min()), int(head.max())
        present = {lo} if lo == hi else {int(i) for i in head.unique().tolist()}
        out = self._kept(n) if h.device.type == "cpu" and n <= REUSED_ROWS else None
        if out is not None:
            self._mask_stale(out, head)
        elif lo == hi:  # a fresh tensor: the head's blocks write its range, -inf around it
            out = h.new_empty((n, self.total))
            spec = self.layout.heads[lo]
            out[:, : spec.offset] = float("-inf")
            out[:, spec.offset + spec.vocab_size:] = float("-inf")
        else:
            out = h.new_full((n, self.total), float("-inf"))
        for g in self.groups:
            members = [i for i in g.members if i in present]
            if not members:
                continue
            if len(present) == 1:  # one head in the batch: no row split anywhere
                x = self.adapt(members[0], h) if g.hidden_adapter else h
                self._single(out, members[0], x.contiguous(), self.blocks[g.matrix])
            else:
                self._mixed(out, members, h, head, g)
        return out

    def _kept(self, n: int) -> torch.Tensor:
        """Rows [0, n) of the kept logits buffer, [n, ΣV_h] fp32.

        On CPU a fresh ΣV-wide tensor is fresh pages from the OS every step (glibc hands
        blocks this large back at free): at n = 64 and ΣV = 425,984 (109 MB, fp32) the
        first-touch page faults took 43 ms against 4 ms to fill a tensor already mapped.
        So decode-sized batches on CPU reuse one buffer, kept in fp32, the dtype vLLM's
        sampler converts logits to (a no-op then, where it would allocate 109 MB per step).
        It starts -inf, and each row remembers the one head whose range it may hold finite
        values in (`_row_head`): a row is masked again only when its head changes, so a
        batch that keeps its rows on their heads writes nothing but their logits. That
        holds because vLLM's runner reads a step's logits (sampler, prompt logprobs) before
        it asks for the next, and what its sampler writes in place keeps -inf where it was
        (masks write -inf; biases, penalties and temperature add to or scale it). Larger
        calls (prompt logprobs over a long prompt) are not kept; on a GPU the caching
        allocator already reuses memory."""
        buf = self._buffer
        if buf is None or buf.shape[0] < n:
            rows = max(n, 64)
            buf = self._buffer = torch.full((rows, self.total), float("-inf"))
            self._row_head = torch.full((rows,), -1, dtype=torch.int64)  # -1: all -inf
        return buf[:n]

    def _mask_stale(self, out: torch.Tensor, head: torch.Tensor) -> None:
        """-inf over each row's previous head's range where the row changes head."""
        old = self._row_head[: out.shape[0]]
        stale = (old >= 0) & (old != head.cpu())
        if bool(stale.any()):
            for i in old[stale].unique().tolist():
                spec = self.layout.heads[i]
                rows = (stale & (old == i)).nonzero(as_tuple=True)[0]
                out[rows, spec.offset: spec.offset + spec.vocab_size] = float("-inf")
        old.copy_(head)

    def _gemm(self, b: BlockRows, x: torch.Tensor) -> torch.Tensor:
        y = self.gemm(b, x, b.weight, None)  # [n, P]: this rank's piece of the block
        if self.gather is None:
            return y
        return self.gather(y)[:, : b.stop - b.start]  # [n, stop - start]

    def _single(self, out: torch.Tensor, i: int, x: torch.Tensor,
                blocks: list[BlockRows]) -> None:
        spec = self.layout.heads[i]
        for b in blocks:
            if b.stop > spec.vocab_size:
                break
            y = self._gemm(b, x)  # [n, stop - start]
            out[:, spec.offset + b.start: spec.offset + b.stop] = self.finish(i, y, b.start,
                                                                                b.stop)

    def _mixed(self, out: torch.Tensor, members: list[int], h: torch.Tensor,
               head: torch.Tensor, g: HeadGroup) -> None:
        mine = torch.isin(head, torch.tensor(members, device=head.device))
        rows = mine.nonzero(as_tuple=True)[0]  # [n_g] rows of this group
        x = h[rows]
        if g.hidden_adapter:
            x = self.adapt(members[0], x)
        x = x.contiguous()
        row_head = head[rows]
        row_vocab = self.vocab.to(head.device)[row_head]  # [n_g] each row's V_h
        top = max(self.layout.heads[i].vocab_size for i in members)
        for b in self.blocks[g.matrix]:
            if b.stop > top:
                break
            sub = (row_vocab >= b.stop).nonzero(as_tuple=True)[0]  # rows this block serves
            y = self._gemm(b, x[sub].contiguous())  # [n_sub, stop - start]
            sub_head = row_head[sub]
            for i in members:
                spec = self.layout.heads[i]
                if spec.vocab_size < b.stop:
                    continue
                sel = (sub_head == i).nonzero(as_tuple=True)[0]
                if sel.numel():
                    cols = slice(spec.offset + b.start, spec.offset + b.stop)
                    y_i = self.finish(i, y[sel], b.start, b.stop)
                    out[rows[sub[sel]], cols] = y_i.to(out.dtype)  # index_put keeps no cast
