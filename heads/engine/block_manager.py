"""KV block bookkeeping: one pool of blocks, a block table per sequence and KV group, sliding
groups trimmed to their window, and automatic prefix caching.

Groups (heads.engine.kv_layout): a full-attention group holds a block for every position; a
sliding group of window W holds only the blocks a query can still reach (positions >= the
newest position - W + 1, kept from one block earlier) and hands the older ones back after
each step. Their table entries become PAD, a spare block past the pool that takes the
writes nobody will read and the padding of batched tables; attention masks it.

With prefix caching on, a prefill writes every position of a sliding group into real blocks
and hands the ones behind the window back right after the step (still keyed, so a later
prompt that shares a shorter prefix finds the window before its own cut). Without it those
positions go straight to PAD, so a long prompt never holds more than the window.

Prefix caching: a full block is keyed by a hash chain over (head, its token ids, the previous
block's key), so two sequences of one head whose ids agree up to a block edge share the blocks
before it, in every group. Token ids are per head, so the cache is per head.

- Blocks carry a reference count; a shared block is held once however many sequences use it,
  so "used" (and the admission figure built on it) counts it once.
- A freed block keeps its key at the back of the free queue and can be found again until it
  is taken for new content (least recently freed first): LRU reuse. A sequence's tail blocks
  are queued before its head blocks, so a long shared prefix outlives the tails hanging off it.
- A hit is checked against the stored (head, token ids, group), so a collision cannot mix KV.
- A hit needs every full group's blocks up to the cut and each sliding group's blocks within
  the window before it; the cut moves back until both hold.
- At least the last token is always computed (its logits are needed), so a prefill reuses at
  most (num_tokens - 1) // block_size blocks.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from heads.engine.kv_layout import KVLayout
from heads.engine.sequence import Sequence

log = logging.getLogger(__name__)

_BlockKey = tuple[str, tuple[int, ...], int]  # (head, token ids of the block, group)


def _floor(seq: Sequence) -> int:
    """The fewest tokens the sequence can have at its next step: a drafting one may drop
    its pending drafts (all but the verify's own token), so its window must reach back."""
    return min(seq.num_tokens, seq.committed_tokens + 1)


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
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True,
                 layout: KVLayout | None = None, kv_streams: Mapping[str, str] | None = None
                 ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.windows: tuple[int | None, ...] = layout.windows if layout else (None,)
        self.pad = num_blocks  # the spare block: the KV tensors hold num_blocks + 1
        self._blocks = [_Block() for _ in range(num_blocks)]
        # Free blocks, least recently freed first; values unused (an ordered set).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._by_hash: dict[int, int] = {}  # key hash -> block holding that content
        self.stats = PrefixStats()
        # head -> the head whose token stream (ids, embedding, KV) it shares: a two-level
        # reading and its native head key their blocks alike, so they share the prefix cache
        # and a sequence that moves between them keeps one chain.
        self.kv_streams = dict(kv_streams or {})

    def _stream(self, seq: Sequence) -> str:
        return self.kv_streams.get(seq.head, seq.head)

    @property
    def num_free(self) -> int:
        """Blocks with no holder (cached-but-unheld ones included: they can be taken)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks whose content can be found by key (held or not)."""
        return len(self._by_hash)

    def blocks_needed(self, num_tokens: int) -> int:
        """Most blocks a sequence of num_tokens ever holds at once (over every group)."""
        nb = blocks_for(num_tokens, self.block_size)
        if self.prefix_caching:  # a prefill holds every block until the step ends
            return nb * len(self.windows)
        # Otherwise a sliding group peaks in a prefill after a cached prefix... which needs
        # caching; without it, at the window plus the block being filled.
        return sum(nb if w is None else min(nb, w // self.block_size + 2) for w in self.windows)

    def longest_sequence(self, limit: int) -> int:
        """The most tokens, at most `limit`, that one sequence can reach with the whole pool
        to itself (blocks_needed never decreases as tokens are added)."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.blocks_needed(mid) <= self.num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _kept_from(self, window: int | None, n: int) -> int:
        """First block a prefill of n tokens writes for real (see the module docstring)."""
        return 0 if self.prefix_caching else self._lo(window, n)

    def _lo(self, window: int | None, n: int) -> int:
        """First block a group keeps once the newest query is at position n - 1."""
        return 0 if window is None else max(0, n - window) // self.block_size

    # --- lookups ---------------------------------------------------------------------------

    def _chain(self, seq: Sequence, count: int) -> list[tuple[int, tuple[int, ...]]]:
        # -> (chain hash, token ids) of the sequence's first `count` full blocks
        ids, bs = seq.token_ids, self.block_size
        out: list[tuple[int, tuple[int, ...]]] = []
        parent: int | None = None
        for i in range(count):
            toks = tuple(ids[i * bs:(i + 1) * bs])
            parent = chain_hash(parent, self._stream(seq), toks)
            out.append((parent, toks))
        return out

    def _find(self, head: str, chain: tuple[int, tuple[int, ...]], g: int) -> int | None:
        h, toks = chain
        b = self._by_hash.get(hash((h, g)))
        if b is None or self._blocks[b].key != (head, toks, g):
            return None
        return b

    def _hits(self, seq: Sequence) -> list[list[int]]:
        """-> per group, the blocks of the longest reusable prefix (PAD behind a window)."""
        if not self.prefix_caching or seq.needs_prompt_rows:
            return [[] for _ in self.windows]  # a scored prompt needs every hidden state
        chain = self._chain(seq, (seq.num_tokens - 1) // self.block_size)
        found: dict[tuple[int, int], int | None] = {}

        def get(g: int, i: int) -> int | None:
            if (g, i) not in found:
                found[g, i] = self._find(self._stream(seq), chain[i], g)
            return found[g, i]

        k = 0
        full = [g for g, w in enumerate(self.windows) if w is None]
        while k < len(chain) and all(get(g, k) is not None for g in full):
            k += 1
        while k > 0:
            c = k * self.block_size
            if all(get(g, i) is not None
                   for g, w in enumerate(self.windows) if w is not None
                   for i in range(self._lo(w, c + 1), k)):
                break
            k -= 1
        out = []
        for g, w in enumerate(self.windows):
            lo = self._lo(w, k * self.block_size + 1)
            row = [get(g, i) if i >= lo else None for i in range(k)]
            out.append([self.pad if b is None else b for b in row])
        return out

    # --- allocation ------------------------------------------------------------------------

    def _plan(self, seq: Sequence) -> tuple[list[list[int]], int]:
        # -> (hit tables, blocks to take from the free queue)
        hits = self._hits(seq)
        k = len(hits[0])
        n = seq.num_tokens
        nb = blocks_for(n, self.block_size)
        cost = 0
        for w, table in zip(self.windows, hits, strict=True):
            cost += sum(1 for b in table if b != self.pad and self._blocks[b].ref == 0)
            cost += nb - max(k, self._kept_from(w, n))
        return hits, cost

    def can_allocate(self, seq: Sequence) -> bool:
        """Room for the KV of all the sequence's tokens (a prefill or a recompute); blocks
        already held by other sequences cost nothing."""
        return self._plan(seq)[1] <= self.num_free

    def allocate(self, seq: Sequence) -> None:
        """Give the sequence its block tables; sets seq.num_cached_tokens to the tokens whose
        KV is already there (the prefill computes only the rest)."""
        if seq.block_tables:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
        hits, cost = self._plan(seq)
        if cost > self.num_free:
            raise RuntimeError(f"no room for the {seq.num_tokens} tokens of {seq.seq_id}")
        k = len(hits[0])
        n = seq.num_tokens
        nb = blocks_for(n, self.block_size)
        chain = self._chain(seq, n // self.block_size)
        seq.block_hashes = [h for h, _ in chain]
        # Hold every hit before taking any fresh block: a take may evict an unheld block,
        # and another group's hits sit in the free queue until they are held.
        for b in (b for table in hits for b in table if b != self.pad):
            self._hold(b)
        seq.block_tables = []
        for g, (w, table) in enumerate(zip(self.windows, hits, strict=True)):
            lo = self._kept_from(w, n)
            fresh = [self._take() if i >= lo else self.pad for i in range(k, nb)]
            seq.block_tables.append(table + fresh)
            # Key every full block now: this step writes its KV before any later step reads
            # it, and within the step each layer writes the batch's K/V before attending.
            for i in range(k, len(chain)):
                if fresh[i - k] != self.pad:
                    self._register(fresh[i - k], chain[i], self._stream(seq), g)
        seq.num_cached_tokens = k * self.block_size
        if seq.num_preemptions == 0:
            seq.cached_prompt_tokens = seq.num_cached_tokens
            self.stats.add(seq.head, len(seq.prompt_ids), seq.num_cached_tokens)

    def can_append(self, seq: Sequence) -> bool:
        """Room to write the KV of the sequence's last token (the next decode step)."""
        n, floor = seq.num_tokens, _floor(seq)
        need = sum(1 for t in seq.block_tables if len(t) < blocks_for(n, self.block_size))
        released = sum(1 for w, t in zip(self.windows, seq.block_tables, strict=True)
                       for b in t[:self._lo(w, floor)]
                       if b != self.pad and self._blocks[b].ref == 1)
        return need <= self.num_free + released

    def trim(self, seq: Sequence) -> None:
        """Hand back the sliding groups' blocks that no query of the sequence can reach
        any more (the next one is at position num_tokens - 1, or earlier after a drafting
        sequence's rejected drafts are dropped)."""
        n = _floor(seq)
        for w, table in zip(self.windows, seq.block_tables, strict=True):
            if w is None:
                continue
            for i in range(self._lo(w, n)):
                if table[i] != self.pad:
                    self._release(table[i])
                    table[i] = self.pad

    def may_append(self, seq: Sequence) -> None:
        n, bs = seq.num_tokens, self.block_size
        self.trim(seq)
        for table in seq.block_tables:
            if len(table) < blocks_for(n, bs):
                table.append(self._take())
        # This step writes the KV of token n - 1: key the blocks it completes, but never
        # one holding an unverified draft (a rejection rewrites its tail).
        self.key_full_blocks(seq, min(n, seq.committed_tokens))

    def key_full_blocks(self, seq: Sequence, upto: int) -> None:
        """Key the sequence's full blocks whose tokens all lie before `upto` and are not
        keyed yet (each block's key chains on the one before it)."""
        bs, ids = self.block_size, seq.token_ids
        while len(seq.block_hashes) < upto // bs:
            i = len(seq.block_hashes)
            toks = tuple(ids[i * bs:(i + 1) * bs])
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = chain_hash(parent, self._stream(seq), toks)
            seq.block_hashes.append(h)
            for g, table in enumerate(seq.block_tables):
                if table[i] != self.pad:
                    self._register(table[i], (h, toks), self._stream(seq), g)

    def free(self, seq: Sequence) -> None:
        for table in seq.block_tables:
            for b in reversed(table):  # tails first in the queue: evicted first
                if b != self.pad:
                    self._release(b)
        seq.block_tables = []
        seq.block_hashes = []
        seq.num_cached_tokens = 0

    def reset_cache(self) -> None:
        """Forget every key (after a failed step the content of new blocks is suspect)."""
        for blk in self._blocks:
            blk.key_hash = blk.key = None
        self._by_hash.clear()

    # --- internals -------------------------------------------------------------------------

    def _register(self, b: int, chain: tuple[int, tuple[int, ...]], head: str, g: int) -> None:
        if not self.prefix_caching:
            return
        blk = self._blocks[b]
        if blk.key_hash is not None:
            return  # already keyed (a shared block)
        blk.key_hash, blk.key = hash((chain[0], g)), (head, chain[1], g)
        # Two sequences that computed the same content: the newer copy becomes the one found.
        self._by_hash[blk.key_hash] = b

    def _hold(self, b: int) -> None:
        if self._blocks[b].ref == 0:
            del self._free[b]
        self._blocks[b].ref += 1

    def _release(self, b: int) -> None:
        blk = self._blocks[b]
        blk.ref -= 1
        if blk.ref == 0:
            self._free[b] = None
        elif blk.ref < 0:
            raise RuntimeError(f"block {b} freed more often than taken")

    def _take(self) -> int:
        b, _ = self._free.popitem(last=False)
        blk = self._blocks[b]
        if blk.key_hash is not None:  # evict: its old content is overwritten from now on
            if self._by_hash.get(blk.key_hash) == b:
                del self._by_hash[blk.key_hash]
            blk.key_hash = blk.key = None
        blk.ref = 1
        return b
