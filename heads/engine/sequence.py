"""Per-request state inside the engine: tokens so far, sampling options and the KV blocks held."""

from __future__ import annotations

import enum
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from heads.engine.types import (
    NO_LOGIT_RULES,
    HeadMove,
    LogitRules,
    PromptScore,
    QualityLadder,
    TokenConstraint,
)
from kernels.row_params import RowParams

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class LadderState:
    """One sequence's measurements and moves."""

    ladder: QualityLadder
    prompt_losses: dict[str, float] | None = None  # rung -> loss on the prompt; None: not yet
    probes: deque[tuple[dict[str, float], float]] = field(default_factory=deque)  # (KL, H)
    moves: list[HeadMove] = field(default_factory=list)
    pending: list[HeadMove] = field(default_factory=list)  # not yet reported in an event
    stretch: int = 1  # probes every ladder.probe_every x stretch decode steps (a power of 2)

    def running_loss(self, rung: str) -> float | None:
        """Σ KL ÷ Σ H over the window's probes; None before min_probes of them."""
        if len(self.probes) < self.ladder.min_probes:
            return None
        kl = sum(p[0][rung] for p in self.probes)
        h = sum(p[1] for p in self.probes)
        return kl / h if h > 0 else 0.0


@dataclass(slots=True)
class DraftState:
    """Exact drafting (heads.engine.drafting): the drafter's tokens after the last verified
    one sit at the end of output_ids until the native head verifies them."""

    drafter: str  # a reading of the native head: it emits native ids
    native: str
    verified: int = 0  # output tokens the native head has verified (the client has them)
    rows: list[torch.Tensor] = field(default_factory=list)  # [d] hidden row of each draft
    verify_next: bool = False  # a draft the next step must not extend (a stop id, a limit)
    drafted: int = 0  # drafts verified so far, and how many of them were accepted
    accepted: int = 0

    @property
    def pending(self) -> int:
        return len(self.rows)


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    head: str
    prompt_ids: list[int]
    params: RowParams
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    want_logprobs: bool = False
    score_prompt: bool = False  # prompt NLL at the first prefill (heads.engine.prompt_score)
    score_positions: int = 0  # at most this many positions scored; 0: every one
    prompt_score: PromptScore | None = None
    top_logprobs: int = 0  # alternatives per sampled token (heads.engine.logprob_tops)
    prompt_logprobs: int | None = None  # None: off; else top-N per prompt position
    constraint: TokenConstraint | None = None  # structured output (heads.engine.grammar)
    rules: LogitRules = NO_LOGIT_RULES  # logit-shaping extensions (heads.engine.logit_rules)
    quality: LadderState | None = None  # measured quality control (heads.engine.quality_control)
    draft: DraftState | None = None  # exact drafting (heads.engine.drafting)
    seq_id: int = field(default_factory=lambda: next(_ids))  # engine-unique, unlike request_id
    output_ids: list[int] = field(default_factory=list)
    # One block table per KV group (heads.engine.kv_layout); a sliding group's entries behind
    # its window are the pad block. Empty while the sequence holds no blocks.
    block_tables: list[list[int]] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chain keys of its full blocks
    num_cached_tokens: int = 0  # leading tokens whose KV the prefix cache supplied this prefill
    cached_prompt_tokens: int = 0  # the same at the first prefill (what usage reports)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a prompt needs at least one token")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @property
    def block_table(self) -> list[int]:
        """The first group's table (the only one when every layer is full attention)."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs are still owed: only a first prefill (after a preemption by
        recompute they went out already) has every prompt row to compute them from."""
        return self.prompt_logprobs is not None and not self.output_ids

    @property
    def needs_prompt_rows(self) -> bool:
        """This prefill must compute every prompt row: the prefix cache may serve none."""
        return (self.score_prompt and self.prompt_score is None) or self.needs_prompt_logprobs

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def committed_tokens(self) -> int:
        """Prompt and output tokens the client has: all but the unverified drafts."""
        return self.num_tokens - (self.draft.pending if self.draft is not None else 0)

    def append_draft(self, token_id: int, row: torch.Tensor, max_model_len: int) -> None:
        """Record a drafted token and the hidden row [d] it was drafted from. No finish
        reason yet: only the verified token may end the sequence, so a draft that would
        (a stop id, the length limit) makes the next step verify instead of drafting on."""
        assert self.draft is not None
        self.output_ids.append(token_id)
        self.draft.rows.append(row)
        if (token_id in self.stop_token_ids or len(self.output_ids) >= self.max_tokens
                or self.num_tokens >= max_model_len):
            self.draft.verify_next = True

    def commit(self, accepted: int, native_token: int, max_model_len: int
               ) -> tuple[list[int], str | None]:
        """After a verify: keep the first `accepted` drafts, drop the rest, then append the
        native head's token. -> (the tokens that reach the client, the finish reason)."""
        draft = self.draft
        assert draft is not None
        drafts = self.output_ids[len(self.output_ids) - draft.pending:]
        del self.output_ids[len(self.output_ids) - draft.pending:]
        draft.drafted += min(accepted + 1, len(drafts))
        draft.accepted += accepted
        draft.rows, draft.verify_next = [], False
        out: list[int] = []
        reason = None
        for tok in [*drafts[:accepted], native_token]:
            out.append(tok)
            reason = self.append(tok, max_model_len)
            if reason is not None:
                break
        draft.verified = len(self.output_ids)
        return out, reason

    def drop_drafts(self) -> None:
        """Forget the unverified drafts (a preemption recomputes from verified tokens)."""
        if self.draft is not None and self.draft.pending:
            del self.output_ids[len(self.output_ids) - self.draft.pending:]
            self.draft.rows, self.draft.verify_next = [], False

    def append(self, token_id: int, max_model_len: int) -> str | None:
        """Record a sampled token; returns the finish reason it causes, if any."""
        self.output_ids.append(token_id)
        if token_id in self.stop_token_ids:
            return "stop"
        if self.constraint is not None and self.constraint.done:
            return "stop"  # the grammar is complete: nothing else may follow
        if len(self.output_ids) >= self.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None
