"""Per-request state inside the engine: tokens so far, sampling options and the KV blocks held."""

from __future__ import annotations

import enum
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field

from heads.engine.types import (
    NO_LOGIT_RULES,
    HeadMove,
    LogitRules,
    PromptScore,
    QualityLadder,
    TokenConstraint,
)
from kernels.row_params import RowParams

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

    def running_loss(self, rung: str) -> float | None:
        """Σ KL ÷ Σ H over the window's probes; None before min_probes of them."""
        if len(self.probes) < self.ladder.min_probes:
            return None
        kl = sum(p[0][rung] for p in self.probes)
        h = sum(p[1] for p in self.probes)
        return kl / h if h > 0 else 0.0



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
