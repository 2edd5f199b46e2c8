"""Sampling options of one request, validated on construction; no torch, so the gateway
and remote backends can build them without the engine."""

from __future__ import annotations

from dataclasses import dataclass

from kernels.errors import InvalidSamplingParams


@dataclass(frozen=True, slots=True)
class RowParams:
    """Sampling options of one request. temperature == 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int = 0  # keys the counter-based Gumbel noise together with position and token id

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidSamplingParams(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidSamplingParams(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
