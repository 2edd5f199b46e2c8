"""vLLM's logit-shaping sampling extensions on one materialised row of logits, in vLLM's
order: allowed ids, bad words, min_tokens, logit_bias, then the repetition, frequency and
presence penalties; min_p goes last, as vLLM applies it after the temperature."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import torch

from heads.engine.types import LogitRules

NEG_INF = float("-inf")


def shape_logits(logits: torch.Tensor, rules: LogitRules, prompt_ids: Sequence[int],
                 output_ids: Sequence[int], stop_ids: Collection[int]) -> None:
    """logits: [1, V] float32 over one head's rows, changed in place. `stop_ids` are the ids
    that would end the sequence (its EOS and stop_token_ids)."""
    row = logits[0]  # [V]
    v = row.shape[0]
    if rules.allowed_token_ids is not None:
        keep = torch.tensor(sorted(t for t in rules.allowed_token_ids if t < v), dtype=torch.long)
        banned = torch.ones(v, dtype=torch.bool)
        banned[keep] = False
        row.masked_fill_(banned, NEG_INF)
    for word in rules.bad_words_ids:
        # A one-token word is always banned; a longer one only right after its other tokens.
        if len(word) == 1 or tuple(output_ids[-(len(word) - 1):]) == word[:-1]:
            row[word[-1]] = NEG_INF
    if len(output_ids) < rules.min_tokens:
        ids = [t for t in stop_ids if t < v]
        if ids:
            row[torch.tensor(ids, dtype=torch.long)] = NEG_INF
    for tid, bias in rules.logit_bias:
        row[tid] += bias
    _penalize(row, rules, prompt_ids, output_ids)


def _penalize(row: torch.Tensor, rules: LogitRules, prompt_ids: Sequence[int],
              output_ids: Sequence[int]) -> None:
    # row: [V]. vLLM's penalties: repetition over prompt and output ids (divides a positive
    # logit, multiplies a negative one), frequency and presence over the output only.
    v = row.shape[0]
    if rules.repetition_penalty != 1.0:
        seen = torch.zeros(v, dtype=torch.bool)
        ids = torch.tensor([*prompt_ids, *output_ids], dtype=torch.long)
        seen[ids[ids < v]] = True
        p = rules.repetition_penalty
        row.copy_(torch.where(seen, torch.where(row > 0, row / p, row * p), row))
    if (rules.frequency_penalty or rules.presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=v)[:v]
        row -= rules.frequency_penalty * counts.float()
        row -= rules.presence_penalty * (counts > 0).float()


def apply_min_p(logits: torch.Tensor, min_p: float, temperature: float) -> None:
    """logits: [1, V], in place. vLLM drops ids with p < min_p × p_max at the sampling
    temperature: with scaled logits that is logit < max + T·ln(min_p). Greedy ignores it."""
    if min_p <= 0.0 or temperature <= 0.0:
        return
    cut = logits.max() + temperature * math.log(min_p)
    logits.masked_fill_(logits < cut, NEG_INF)
