"""The engine's request, event and load types. No torch: the gateway and the echo and vLLM
backends use them without loading the local engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from kernels.row_params import RowParams


@dataclass(frozen=True, slots=True)
class PromptScore:
    nll_nats: float  # estimated total NLL of the predicted prompt tokens, nats
    predicted: int  # prompt tokens predicted: all but the first
    scored: int  # positions actually scored; == predicted when exact

    def bpb(self, text_bytes: int) -> float | None:
        """Bits per UTF-8 byte of the text the predicted tokens cover (None if undefined)."""
        if self.predicted == 0 or text_bytes <= 0:
            return None
        return self.nll_nats / math.log(2) / text_bytes


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's log p(token) under its head (nats, temperature 1), and the top
    alternatives when asked: (id, log p), most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 1  # 1 + how many of the head's tokens are more likely


@dataclass(frozen=True, slots=True)
class StructuredSpec:
    """What a structured output must match: `kind` is one of STRUCTURED_KINDS; `value` the
    JSON schema (as JSON text), regex, EBNF grammar, or the choices as a JSON list."""

    kind: str
    value: str = ""


STRUCTURED_KINDS = ("json_object", "json_schema", "regex", "grammar", "choice")


@dataclass(frozen=True, slots=True)
class LogitRules:
    """vLLM's logit-shaping sampling extensions, for one sequence on one head (its ids are
    that head's ids). The defaults change nothing; a request with any other value is sampled
    from its materialised row of logits (heads.engine.logit_rules)."""

    repetition_penalty: float = 1.0  # >1 damps every id seen in the prompt or the output
    presence_penalty: float = 0.0  # subtracted once from each id the output holds
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    min_p: float = 0.0  # drop ids whose probability is below min_p × the top one's
    min_tokens: int = 0  # the stop ids are masked until the output has this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, added to its logit)
    allowed_token_ids: frozenset[int] | None = None  # None: every id of the head
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # the last id of each is masked after the rest
    unmasked_stop_ids: frozenset[int] = frozenset()  # stop ids min_tokens leaves: end of turn

    @property
    def shapes(self) -> bool:
        """Whether these rules change any logit (min_tokens alone changes none once met)."""
        return self != NO_LOGIT_RULES


NO_LOGIT_RULES = LogitRules()


class TokenConstraint(Protocol):
    """What may come next in one sequence (heads.engine.grammar implements it)."""

    def mask(self, logits: Any) -> None:
        """logits: a [1, V] float32 tensor; disallowed ids become -inf in place."""
        ...

    def accept(self, token_id: int) -> None: ...

    @property
    def done(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class QualityLadder:
    """Heads of one native token stream a request may move up during its life, and the loss
    that moves it. Every rung reads and writes the native head's ids and shares its KV cache,
    so a move costs nothing but the new rung's step (heads.engine.quality_control).

    The engine measures each rung's loss against the native head: at the first prefill on
    sampled prompt positions (Σ NLL_rung ÷ Σ NLL_native − 1 on the prompt's own next tokens),
    then every `probe_every` decode steps on the step's own distribution (Σ KL(native ‖ rung)
    ÷ Σ H(native) over the last `window` probes: the expected extra bits per bit on text the
    native head would write). A sequence starts on the first rung whose prompt loss is within
    `bound`, and moves up when its running estimate on its rung exceeds it."""

    rungs: tuple[str, ...]  # cheapest first; the last is the native head (loss 0)
    bound: float  # relative BPB loss against the native head, e.g. 0.05
    # Prompt positions scored at the first prefill; 0: none, the sequence starts on rung 0
    # and the decode probes alone guard it (the router's choice for a content class whose
    # laddered requests stayed put, router.ladder_outcomes.stays_put).
    positions: int = 64
    min_positions: int = 8  # fewer predicted positions: the prompt says nothing, keep rung 0
    probe_every: int = 8  # decode steps between probes (engine-wide, so probes share a read)
    # A sequence whose running loss stays under bound x relax_below probes half as often,
    # down to one probe per probe_every x max_stretch steps; it goes back to probe_every
    # once its loss comes nearer the bound. The intervals stay multiples of probe_every, so
    # the sequences probed in one step still share one read of the native rows.
    relax_below: float = 0.5
    max_stretch: int = 8
    window: int = 8  # probes in the running estimate
    min_probes: int = 2  # probes before the running estimate may move a sequence

    def __post_init__(self) -> None:
        if len(self.rungs) < 2 or len(set(self.rungs)) != len(self.rungs):
            raise ValueError(f"a ladder needs two or more distinct rungs, got {self.rungs}")
        if not math.isfinite(self.bound) or self.bound < 0:
            raise ValueError(f"bound must be a finite number >= 0, got {self.bound}")
        if min(self.probe_every, self.window, self.min_probes, self.max_stretch) < 1 \
                or self.positions < 0:
            raise ValueError("probe_every, window, min_probes and max_stretch must be >= 1, "
                             "positions >= 0")
        if not 0 <= self.relax_below <= 1:
            raise ValueError(f"relax_below must be in [0, 1], got {self.relax_below}")

    def first_within(self, losses: dict[str, float], start: int = 0) -> str:
        """The cheapest rung from `start` whose measured loss is within the bound (an
        unmeasured rung never is); the native head, the last rung, when none is."""
        for rung in self.rungs[start:-1]:
            loss = losses.get(rung)
            if loss is not None and loss <= self.bound:
                return rung
        return self.rungs[-1]


@dataclass(frozen=True, slots=True)
class HeadMove:
    """A sequence moved up its ladder: at output token `at` (0: before its first token)."""

    at: int
    from_head: str
    to_head: str
    loss: float  # the measured loss on `from_head` that moved it
    source: str  # "prompt" (first prefill) or "probes" (decode)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    head: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: RowParams
    stop_token_ids: frozenset[int]
    want_logprobs: bool = False
    score_prompt: bool = False  # report the prompt's NLL with the first token
    score_positions: int = 0  # score at most this many prompt positions; 0: all
    top_logprobs: int = 0  # alternatives reported beside each sampled token
    prompt_logprobs: int | None = None  # None: off; N: each prompt token's logprob + top N
    structured: StructuredSpec | None = None  # constrain the output to a grammar
    rules: LogitRules = NO_LOGIT_RULES  # vLLM's logit-shaping extensions
    ladder: QualityLadder | None = None  # measured quality control; rungs[0] is `head`
    # Exact drafting (heads.engine.drafting): a reading of the native head `head` drafts,
    # the native head verifies; the output is the native head's, token for token.
    drafter: str | None = None


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    logprob: float | None
    finish_reason: str | None  # "stop" | "length" | None
    prompt_score: PromptScore | None = None  # on the first event, when asked for
    cached_tokens: int | None = None  # on the first event: prompt tokens the prefix cache served
    top: TokenLogprobs | None = None  # when the request asked for top_logprobs
    # On the first event, when asked for: prompt tokens 1.. (the first has no prediction).
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    head: str | None = None  # the head that sampled this token, when a ladder moved it
    # On the first event of a laddered request: each rung's loss measured on the prompt.
    prompt_losses: tuple[tuple[str, float], ...] | None = None
    moves: tuple[HeadMove, ...] = ()  # the moves this step made (at most one)


@dataclass(frozen=True, slots=True)
class HeadLoad:
    running: int
    waiting: int


@dataclass(frozen=True, slots=True)
class DraftTally:
    """One drafter's verifies so far (exact drafting, heads.engine.drafting)."""

    drafted: int = 0  # drafts the native head judged (up to the first rejected one)
    accepted: int = 0
    verifies: int = 0
    committed: int = 0  # tokens the verifies committed: accepted drafts + the native token
    verify_seconds: float = 0.0  # the verifying steps' unembedding, shared among verifies
    # The smallest batch measured so far at which drafting at this acceptance stops paying
    # (k = 0); None while it pays at every batch measured.
    break_even_batch: int | None = None


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One measured step, for the router's cost calibration (router.calibration)."""

    prefill: bool
    groups: tuple[tuple[str, int, float], ...]  # (head, requests, mean context tokens)
    seconds: float
    # Prefill steps: per head, (prompt tokens computed past the prefix cache, prompt
    # positions the measured quality control scored); () for decode steps.
    prompts: tuple[tuple[str, int, int], ...] = ()
