"""Continuous batching: each step is either one prefill batch or one decode batch.

- Prefill first: waiting sequences are admitted in FIFO order while the token budget, the
  sequence cap and the free blocks allow. A prompt is never chunked; one longer than the
  budget is prefilled alone.
- Otherwise decode every running sequence. When a sequence cannot get a block for its next
  token, the most recently admitted running sequence is preempted by recompute: its blocks
  are freed and it goes back to the front of the queue, to be prefilled again over prompt +
  outputs so far; its freed blocks stay findable in the prefix cache until they are reused.
  Sampling noise is keyed by position, so a recompute samples the same tokens.
- A request whose worst case can never fit (alone, in an empty cache) is refused at add time
  with EngineOverloaded, so the queue can never hold a sequence that blocks it forever.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence as Sequence_

from heads.engine.block_manager import BlockManager
from heads.engine.drafting import DraftOutcome
from heads.engine.sequence import Sequence, SequenceStatus
from heads.errors import EngineOverloaded

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def check_fits(self, seq: Sequence) -> None:
        """Raise EngineOverloaded if the sequence could never run to completion. Reads only
        immutable sizes, so any thread may call it."""
        if len(seq.prompt_ids) >= self.max_model_len:
            raise EngineOverloaded(
                f"prompt of {len(seq.prompt_ids)} tokens leaves no room under max_model_len "
                f"{self.max_model_len}"
            )
        # Worst case: every output token is produced and then a preemption re-prefills them
        # all. The last sampled token never needs KV, but counting it keeps this simple.
        worst = min(len(seq.prompt_ids) + seq.max_tokens, self.max_model_len)
        need = self.block_manager.blocks_needed(worst)
        if need > self.block_manager.num_blocks:
            raise EngineOverloaded(
                f"request needs up to {need} KV blocks, the cache has "
                f"{self.block_manager.num_blocks}"
            )

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def is_idle(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> tuple[list[Sequence], bool]:
        """-> (sequences to run, is_prefill). Empty when there is nothing to do."""
        batch: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) + len(batch) < self.max_num_seqs:
            seq = self.waiting[0]
            # The token budget bounds batching only: a sequence longer than the budget (a long
            # prompt, or a recompute after many outputs) still runs, alone.
            if batch and tokens + seq.num_tokens > self.max_num_batched_tokens:
                break
            if not self.block_manager.can_allocate(seq):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            tokens += seq.num_tokens - seq.num_cached_tokens
            batch.append(seq)
        if batch:
            self.running.extend(batch)
            return batch, True

        while self.running and len(batch) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                batch.append(seq)
        self.running.extendleft(reversed(batch))
        return batch, False

    def _preempt(self, seq: Sequence) -> None:
        seq.drop_drafts()  # recomputed from its verified tokens
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def postprocess(self, seqs: list[Sequence], token_ids: list[int],
                    drafts: Sequence_[DraftOutcome | None] | None = None
                    ) -> list[tuple[list[int], str | None]]:
        """Append each sequence's step: its sampled token, a draft (held back), or the
        tokens a verify committed; free the finished ones. -> per sequence (the tokens the
        client now gets, the finish reason)."""
        out: list[tuple[list[int], str | None]] = []
        for i, (seq, tok) in enumerate(zip(seqs, token_ids, strict=True)):
            d = drafts[i] if drafts is not None else None
            if d is None:
                committed, reason = [tok], seq.append(tok, self.max_model_len)
            elif d.row is not None:
                seq.append_draft(tok, d.row, self.max_model_len)
                committed, reason = [], None
            else:
                committed, reason = seq.commit(d.accepted, tok, self.max_model_len)
                # the verified blocks whose KV is written: all but the new token's
                self.block_manager.key_full_blocks(seq, seq.num_tokens - 1)
            if reason is not None:
                self.finish(seq, reason)
            else:  # sliding-window blocks the next step cannot reach go back now
                self.block_manager.trim(seq)
            out.append((committed, reason))
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence wherever it is (running, waiting) and release its blocks."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass  # never added: the engine aborted it before its add was applied
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def head_counts(self) -> dict[str, tuple[int, int]]:
        """-> {head: (running, waiting)} for the heads with any sequence."""
        counts: dict[str, list[int]] = {}
        for seq in self.running:
            counts.setdefault(seq.head, [0, 0])[0] += 1
        for seq in self.waiting:
            counts.setdefault(seq.head, [0, 0])[1] += 1
        return {h: (r, w) for h, (r, w) in counts.items()}
