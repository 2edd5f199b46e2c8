"""What the router knows about each head and each request, as plain frozen dataclasses."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("head name must be non-empty")
        for field, value in (("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size)):
            if value <= 0:
                raise ValueError(f"{self.name}: {field} must be > 0, got {value}")
        if self.backbone_params < 0 or self.kv_bytes_per_token < 0 or self.training_bytes < 0:
            raise ValueError(f"{self.name}: params, KV bytes and training bytes must be >= 0")
        if self.weight_bytes_per_param <= 0:
            raise ValueError(f"{self.name}: weight_bytes_per_param must be > 0")
        if self.bytes_per_token is not None and self.bytes_per_token <= 0:
            raise ValueError(f"{self.name}: bytes_per_token must be > 0")
        if self.bpb is not None and self.bpb <= 0:
            raise ValueError(f"{self.name}: bpb must be > 0")

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
class RequestFeatures:
    """What the router sees of a request before tokenizing it."""

    prompt_bytes: int  # UTF-8 bytes of the prompt
    max_tokens: int  # output cap, in tokens of whichever head serves it
    pinned_head: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_bytes < 0 or self.max_tokens < 0:
            raise ValueError("prompt_bytes and max_tokens must be >= 0")
