"""What the router knows about each head and each request, as plain frozen dataclasses."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernels.crossover import dtype_for_bytes

log = logging.getLogger(__name__)

# Fallback bytes/token for English prose when the manifest has no measurement:
# bpt(V) ≈ A·ln V + B, a two-point fit through commonly reported figures for BPE tokenizers
# on English web text: ~3.9 B/token at V=32k (Llama-2/Mistral SentencePiece) and ~4.6 at
# V=262k (Gemma-3). It gives ~3.4 at 8k and ~4.4 at 131k. The fit is rough on purpose;
# heads/ measures the real value per head and the manifest records it.
_BPT_A = 0.7 / math.log(8.0)
_BPT_B = 3.9 - _BPT_A * math.log(32768.0)
BPT_LOG_SLOPE = _BPT_A  # bytes/token per e-fold of V, for fits through one measured head


def estimate_bytes_per_token(vocab_size: int) -> float:
    # Never below 1 byte/token: byte-level fallback tokens cover one byte each.
    return max(1.0, _BPT_A * math.log(vocab_size) + _BPT_B)


@dataclass(frozen=True, slots=True)
class HeadProfile:
    """One vocabulary head on the shared backbone."""

    name: str
    vocab_size: int  # V
    hidden_size: int  # d
    backbone_params: int  # N: transformer parameters excluding input embedding and unembedding
    kv_bytes_per_token: float  # KV cache bytes per token of context, all layers
    weight_bytes_per_param: float = 2.0  # s: 2 for bf16
    bytes_per_token: float | None = None  # measured; None -> estimate_bytes_per_token(V)
    training_bytes: float = 0.0  # bytes of text the head was trained on
    bpb: float | None = None  # measured on held-out text (manifest); the quality guard's base
    # Whether the head's training cost is already paid. A head derived from a trained one
    # (trimmed, nested) or trained before serving is sunk: its C_train cannot change which
    # head is cheaper to serve. Only a head still to be trained or adapted is not.
    training_sunk: bool = True
    # The matrix whose first V rows this head's logits use unchanged (a nested head, or one
    # with a hidden-state adapter); None when it owns its rows (its own matrix, or low-rank
    # adapted rows folded into a copy). Heads naming the same matrix share one read of the
    # largest live one's rows per step (kernels/nested_plan.py).
    shared_rows: str | None = None
    # The head's own fit of the per-request BPB penalty (router.segmentation), measured when
    # its checkpoint was built: (per unit of split share, per unit share of byte-token bytes[,
    # prior split share]), router.segmentation.PenaltyFit's fields. None: the default fit.
    bpb_penalty: tuple[float, ...] | None = None
    # A two-level reading (a split head's V rows pick a group of native tokens, the group's
    # rows pick the token): `vocab_size` is its first level's V, `group_rows` the native rows
    # each of its sequences reads per step past them (mean over evaluated text), and
    # `reads` the split head it reads, whose split share of a prompt predicts its penalty.
    group_rows: float = 0.0
    reads: str | None = None
    # Native rows a step with this reading's sequences reads for the engine's measured quality
    # control (heads.engine.quality_control: one native product per probe, shared by the
    # step's laddered sequences), amortised per step: V_native ÷ probe_every. 0: unmeasured.
    probe_rows: float = 0.0
    # Native rows its prompt measurement reads once per request (V_native); 0: unmeasured.
    measure_rows: float = 0.0
    # Prompt positions that measurement scores at most (the gateway's quality_positions).
    measure_positions: int = 64

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("head name must be non-empty")
        for what, value in (("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size)):
            if value <= 0:
                raise ValueError(f"{self.name}: {what} must be > 0, got {value}")
        if self.backbone_params < 0 or self.kv_bytes_per_token < 0 or self.training_bytes < 0:
            raise ValueError(f"{self.name}: params, KV bytes and training bytes must be >= 0")
        dtype_for_bytes(self.weight_bytes_per_param)  # the kernels' crossover needs a dtype
        if self.bytes_per_token is not None and self.bytes_per_token <= 0:
            raise ValueError(f"{self.name}: bytes_per_token must be > 0")
        if self.bpb is not None and self.bpb <= 0:
            raise ValueError(f"{self.name}: bpb must be > 0")
        if min(self.group_rows, self.probe_rows, self.measure_rows, self.measure_positions) < 0:
            raise ValueError(f"{self.name}: group_rows, probe_rows, measure_rows must be >= 0")
        if self.bpb_penalty is not None and min(self.bpb_penalty) < 0:
            raise ValueError(f"{self.name}: bpb_penalty coefficients must be >= 0")

    @property
    def bpt(self) -> float:
        """Bytes of text per token: measured if known, else the documented estimate."""
        if self.bytes_per_token is not None:
            return self.bytes_per_token
        return estimate_bytes_per_token(self.vocab_size)

    @property
    def unembed_params(self) -> int:
        return self.vocab_size * self.hidden_size


@dataclass(frozen=True, slots=True)
class HeadTokens:
    """The prompt as one head tokenizes it."""

    prompt_tokens: int  # ids the engine prefills, BOS and template tokens included
    fallback_bytes: int = 0  # prompt bytes this head could only spell as <0xXX> byte tokens

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.fallback_bytes < 0:
            raise ValueError("prompt_tokens and fallback_bytes must be >= 0")


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the router sees of a request: its size and, when the gateway tokenized the prompt
    with every head before deciding, each head's own token counts and the text's script.

    Without `tokens` (content-blind callers: the simulator, old traces) every head is judged
    by its manifest bytes/token.
    """

    prompt_bytes: int  # UTF-8 bytes of the prompt
    max_tokens: int  # output cap, in tokens of whichever head serves it
    pinned_head: str | None = None
    tokens: Mapping[str, HeadTokens] = field(default_factory=dict)  # head -> its tokenization
    script: str = "unknown"  # dominant Unicode script class of the prompt (heads.vocab.scripts)
    session: str | None = None  # the client's conversation id (router.affinity)
    min_vocab: int = 0  # only heads with V >= this hold every token id the request names
    # The request needs every id's logit (a grammar, logit rules, alternatives, a prompt's
    # logprobs): a two-level reading never materialises them, so it is not a candidate.
    needs_logits: bool = False
    # Filled by the router before the policy runs (router.compression, router.segmentation):
    predicted_bpt: Mapping[str, float] = field(default_factory=dict)  # head -> output B/token
    bpb_penalty: Mapping[str, float] = field(default_factory=dict)  # head -> predicted loss
    excluded: Mapping[str, float] = field(default_factory=dict)  # head -> loss past the bound
    # Measured readings this request would start on without a prompt measurement, its class
    # having stayed put on them (router.ladder_outcomes.stays_put).
    unmeasured: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.prompt_bytes < 0 or self.max_tokens < 0:
            raise ValueError("prompt_bytes and max_tokens must be >= 0")

    def prompt_bpt(self, head: str) -> float | None:
        """The prompt's own bytes/token on `head`; None when it was not tokenized there."""
        t = self.tokens.get(head)
        if t is None or t.prompt_tokens == 0 or self.prompt_bytes == 0:
            return None
        return self.prompt_bytes / t.prompt_tokens

    def output_bpt(self, head: HeadProfile) -> float:
        """Predicted output bytes/token on `head`; its manifest figure when not predicted."""
        return self.predicted_bpt.get(head.name, head.bpt)

    def fallback_share(self, head: str) -> float:
        t = self.tokens.get(head)
        return 0.0 if t is None or self.prompt_bytes == 0 else t.fallback_bytes / self.prompt_bytes
