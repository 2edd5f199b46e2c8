"""Prompt log-likelihood from the prefill's hidden states, under the head that serves it.

Each prompt token after the first is predicted by the hidden state before it; its NLL is
`logsumexp(z) − z[target]` with z the head's logits
(h·Wᵀ, plus its adapter's correction). Scoring a position costs one [d]×[d,V] product and a
log-softmax over V, so every position of a 500-token prompt on a 262k head costs more than
the backbone's prefill on a small model. `max_positions` bounds the cost: k of the m
predicted positions, drawn uniformly without replacement, give `m/k · Σ NLL` (an unbiased
estimate of the total). Bits per byte need the prompt's UTF-8 length, which only the gateway
knows, so the engine reports nats and the gateway divides (PromptScore.bpb).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from heads.engine.types import PromptScore
from heads.model.adapter import HeadOutput

log = logging.getLogger(__name__)

# Rows per log-softmax: bounds the fp32 temporary to CHUNK·V·4 B (64 MiB at V=262k).
CHUNK = 64


@dataclass(frozen=True, slots=True)
class ScoreJob:
    """One prompt to score: where its hidden rows are and what they predict."""

    head: str
    first_row: int  # row of the prompt's first token in the prefill's hidden [T, d]
    prompt_ids: Sequence[int]
    max_positions: int  # 0: every position
    seed: int  # picks the sampled positions; reproducible per request


def pick_positions(predicted: int, max_positions: int, rng: random.Random) -> list[int]:
    """Indices into the m predicted positions: all of them, or k drawn without replacement."""
    if max_positions <= 0 or predicted <= max_positions:
        return list(range(predicted))
    return sorted(rng.sample(range(predicted), max_positions))


def token_nll(hidden: torch.Tensor, head: HeadOutput, targets: torch.Tensor) -> torch.Tensor:
    # hidden: [k, d], head: rows [V, d] (+ adapter), targets: [k] int64 -> [k] float32 NLL
    out = []
    for i in range(0, hidden.shape[0], CHUNK):
        logits = head.logits(hidden[i:i + CHUNK]).float()  # [c, V]
        picked = logits.gather(1, targets[i:i + CHUNK, None]).squeeze(1)  # [c]
        out.append(torch.logsumexp(logits, dim=-1) - picked)
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def score_prompts(
    hidden: torch.Tensor, jobs: Sequence[ScoreJob], output_of: Callable[[str], HeadOutput]
) -> list[PromptScore]:
    """One PromptScore per job; one chunked product per head over all its jobs' rows."""
    # hidden: [T, d], final-normed, as the prefill produced it
    picks: list[list[int]] = []
    for job in jobs:
        positions = pick_positions(len(job.prompt_ids) - 1, job.max_positions,
                                   random.Random(job.seed))
        picks.append(positions)
    nll_sums = [0.0] * len(jobs)
    by_head: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        by_head.setdefault(job.head, []).append(i)
    for head, members in by_head.items():
        rows: list[int] = []
        targets: list[int] = []
        owner: list[int] = []
        for i in members:
            job = jobs[i]
            rows += [job.first_row + p for p in picks[i]]  # row p predicts token p + 1
            targets += [job.prompt_ids[p + 1] for p in picks[i]]
            owner += [i] * len(picks[i])
        if not rows:
            continue
        device = hidden.device
        nll = token_nll(hidden[torch.tensor(rows, device=device)], output_of(head),
                        torch.tensor(targets, dtype=torch.int64, device=device))
        sums = torch.zeros(len(jobs), dtype=torch.float64, device=device)
        sums.index_add_(0, torch.tensor(owner, device=device), nll.double())
        totals = sums.tolist()  # one host sync per head group
        for i in members:
            nll_sums[i] = totals[i]
    out = []
    for job, positions, total in zip(jobs, picks, nll_sums, strict=True):
        m, k = len(job.prompt_ids) - 1, len(positions)
        out.append(PromptScore(total * m / k if k else 0.0, m, k))
    return out
