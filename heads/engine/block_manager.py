"""KV block bookkeeping: a free list of fixed-size blocks; each sequence owns a block table.

No prefix caching: a block belongs to exactly one sequence, so freeing never needs refcounts.
"""

from __future__ import annotations

import logging
from collections import deque

from heads.engine.sequence import Sequence

log = logging.getLogger(__name__)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, seq: Sequence) -> bool:
        """Room for the KV of all the sequence's tokens (a prefill or a recompute)."""
        return blocks_for(seq.num_tokens, self.block_size) <= self.num_free

    def allocate(self, seq: Sequence) -> None:
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        need = blocks_for(seq.num_tokens, self.block_size)
        if need > self.num_free:
            raise RuntimeError(f"need {need} blocks, {self.num_free} free")
        seq.block_table = [self._take() for _ in range(need)]

    def can_append(self, seq: Sequence) -> bool:
        """Room to write the KV of the sequence's last token (the next decode step)."""
        return self._missing(seq) <= self.num_free

    def may_append(self, seq: Sequence) -> None:
        for _ in range(self._missing(seq)):
            seq.block_table.append(self._take())

    def free(self, seq: Sequence) -> None:
        for b in seq.block_table:
            self._used.remove(b)
            self._free.append(b)
        seq.block_table = []

    def _missing(self, seq: Sequence) -> int:
        return max(0, blocks_for(seq.num_tokens, self.block_size) - len(seq.block_table))

    def _take(self) -> int:
        b = self._free.popleft()
        self._used.add(b)
        return b
