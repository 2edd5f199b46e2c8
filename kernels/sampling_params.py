"""Per-group sampling parameters: one entry per row of the hidden-state batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.errors import InvalidSamplingParams
from kernels.row_params import RowParams


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Sampling options for a head group of b rows, as tensors the kernels consume directly."""

    temperature: torch.Tensor  # [b] float32; 0 marks greedy rows
    top_p: torch.Tensor  # [b] float32
    top_k: torch.Tensor  # [b] int64; 0 = off
    seed: torch.Tensor  # [b] int64
    position: torch.Tensor  # [b] int64; index of the token being sampled in its sequence
    want_logprobs: bool = False

    @staticmethod
    def from_rows(
        rows: list[RowParams], positions: list[int], want_logprobs: bool = False
    ) -> SamplingBatch:
        if len(rows) != len(positions):
            raise InvalidSamplingParams("one position per row is required")
        return SamplingBatch(
            temperature=torch.tensor([r.temperature for r in rows], dtype=torch.float32),
            top_p=torch.tensor([r.top_p for r in rows], dtype=torch.float32),
            top_k=torch.tensor([r.top_k for r in rows], dtype=torch.int64),
            seed=torch.tensor([r.seed for r in rows], dtype=torch.int64),
            position=torch.tensor(positions, dtype=torch.int64),
            want_logprobs=want_logprobs,
        )

    def __len__(self) -> int:
        return int(self.temperature.shape[0])


@dataclass(frozen=True, slots=True)
class SampleOutput:
    token_ids: torch.Tensor  # [b] int64, each < the head's V
    logprobs: torch.Tensor | None  # [b] float32: log p(token) under softmax(logits), T=1
