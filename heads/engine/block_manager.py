"""KV block bookkeeping with automatic prefix caching.

Each sequence owns a block table. A full block is keyed by a hash chain over (head, its token
ids, the previous block's key), so two sequences of one head whose token ids agree up to a
block edge can share the blocks before it. Token ids are per head, so the cache is per head:
the same ids under another head are different tokens and never match.

- Blocks carry a reference count; a shared block is held once however many sequences use it,
  so "used" (and the admission figure built on it) counts it once.
- A freed block keeps its key and goes to the back of the free queue; it can be found again
  until it is taken for new content (least recently freed first), which is the LRU reuse.
- A sequence's tail blocks are queued before its head blocks when freed, so a long shared
  prefix outlives the tails that hang off it.
- A hash hit is checked against the stored (head, token ids), so a collision cannot mix KV.
- At least the last token of a sequence is always computed (its logits are needed), so a
  prefill reuses at most (num_tokens - 1) // block_size blocks.

With caching off the manager is the plain free list it was before: no keys, no lookups.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from heads.engine.sequence import Sequence

log = logging.getLogger(__name__)

_BlockKey = tuple[str, tuple[int, ...]]  # (head, token ids of the block)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def chain_hash(parent: int | None, head: str, tokens: tuple[int, ...]) -> int:
    """Key of one full block: hashed with its parent's key, so a match implies the whole
    prefix matches (up to collisions, which lookups rule out against the stored ids)."""
    return hash((parent, head, tokens))


@dataclass(slots=True)
class _Block:
    ref: int = 0
    key_hash: int | None = None  # set once the block is full and registered
    key: _BlockKey | None = None


@dataclass(slots=True)
class PrefixStats:
    """Prompt tokens looked up and found, at each sequence's first admission."""

    queries: dict[str, int] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)

    def add(self, head: str, queried: int, hit: int) -> None:
        self.queries[head] = self.queries.get(head, 0) + queried
        self.hits[head] = self.hits.get(head, 0) + hit


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._blocks = [_Block() for _ in range(num_blocks)]
        # Free blocks, least recently freed first; values unused (an ordered set).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._by_hash: dict[int, int] = {}  # key hash -> block holding that content
        self.stats = PrefixStats()

    @property
    def num_free(self) -> int:
        """Blocks with no holder (cached-but-unheld ones included: they can be taken)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks whose content can be found by key (held or not)."""
        return len(self._by_hash)

    # --- lookups ---------------------------------------------------------------------------

    def _full_keys(self, seq: Sequence, limit: int) -> list[tuple[int, _BlockKey]]:
        # -> (hash, key) of the sequence's first `limit` full blocks
        ids, bs = seq.token_ids, self.block_size
        out: list[tuple[int, _BlockKey]] = []
        parent: int | None = None
        for i in range(limit):
            toks = tuple(ids[i * bs:(i + 1) * bs])
            parent = chain_hash(parent, seq.head, toks)
            out.append((parent, (seq.head, toks)))
        return out

    def _hits(self, seq: Sequence) -> list[int]:
        """Blocks holding the sequence's leading full blocks, longest run from the start."""
        if not self.prefix_caching or (seq.score_prompt and seq.prompt_score is None):
            return []  # a scored prompt needs the hidden state of every position
        found: list[int] = []
        for h, key in self._full_keys(seq, (seq.num_tokens - 1) // self.block_size):
            b = self._by_hash.get(h)
            if b is None or self._blocks[b].key != key:
                break
            found.append(b)
        return found

    # --- allocation ------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        """Room for the KV of all the sequence's tokens (a prefill or a recompute); blocks
        already held by other sequences cost nothing."""
        need = blocks_for(seq.num_tokens, self.block_size)
        held = sum(1 for b in self._hits(seq) if self._blocks[b].ref > 0)
        return need - held <= self.num_free

    def allocate(self, seq: Sequence) -> None:
        """Give the sequence its block table; sets seq.num_cached_tokens to the tokens whose
        KV is already there (the prefill computes only the rest)."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"no room for the {seq.num_tokens} tokens of {seq.seq_id}")
        hits = self._hits(seq)
        for b in hits:
            if self._blocks[b].ref == 0:
                del self._free[b]
            self._blocks[b].ref += 1
        seq.block_table = hits + [self._take() for _ in
                                  range(blocks_for(seq.num_tokens, self.block_size) - len(hits))]
        seq.num_cached_tokens = len(hits) * self.block_size
        if seq.num_preemptions == 0:
            seq.cached_prompt_tokens = seq.num_cached_tokens
            self.stats.add(seq.head, len(seq.prompt_ids), seq.num_cached_tokens)
        # Register every full block now: this step writes their KV before any later step
        # reads it, and within the step each layer writes the batch's K/V before attending.
        full = seq.num_tokens // self.block_size
        for i, (h, key) in enumerate(self._full_keys(seq, full)):
            if i >= len(hits):
                self._register(seq.block_table[i], h, key)

    def can_append(self, seq: Sequence) -> bool:
        """Room to write the KV of the sequence's last token (the next decode step)."""
        return self._missing(seq) <= self.num_free

    def may_append(self, seq: Sequence) -> None:
        for _ in range(self._missing(seq)):
            seq.block_table.append(self._take())
        n, bs = seq.num_tokens, self.block_size
        if self.prefix_caching and n % bs == 0:
            # This step's token completes the last block: key it on the chain so far.
            idx = n // bs - 1
            parent = self._blocks[seq.block_table[idx - 1]].key_hash if idx else None
            if idx == 0 or parent is not None:
                toks = tuple(seq.token_ids[idx * bs:n])
                self._register(seq.block_table[idx], chain_hash(parent, seq.head, toks),
                               (seq.head, toks))

    def free(self, seq: Sequence) -> None:
        for b in reversed(seq.block_table):  # tails first in the queue: evicted first
            blk = self._blocks[b]
            blk.ref -= 1
            if blk.ref == 0:
                self._free[b] = None
            elif blk.ref < 0:
                raise RuntimeError(f"block {b} freed more often than taken")
        seq.block_table = []
        seq.num_cached_tokens = 0

    def reset_cache(self) -> None:
        """Forget every key (after a failed step the content of new blocks is suspect)."""
        for blk in self._blocks:
            blk.key_hash = blk.key = None
        self._by_hash.clear()

    # --- internals -------------------------------------------------------------------------

    def _register(self, b: int, h: int, key: _BlockKey) -> None:
        if not self.prefix_caching:
            return
        blk = self._blocks[b]
        if blk.key_hash is not None:
            return  # already keyed (a shared block)
        blk.key_hash, blk.key = h, key
        # Two sequences that computed the same content: the newer copy becomes the one found.
        self._by_hash[h] = b

    def _missing(self, seq: Sequence) -> int:
        return max(0, blocks_for(seq.num_tokens, self.block_size) - len(seq.block_table))

    def _take(self) -> int:
        b, _ = self._free.popitem(last=False)
        blk = self._blocks[b]
        if blk.key_hash is not None:  # evict: its old content is overwritten from now on
            if self._by_hash.get(blk.key_hash) == b:
                del self._by_hash[blk.key_hash]
            blk.key_hash = blk.key = None
        blk.ref = 1
        return b
