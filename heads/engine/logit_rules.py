"""vLLM's logit-shaping sampling extensions, in vLLM's order: allowed ids, bad words,
min_tokens, logit_bias, then the repetition, frequency and presence penalties; min_p goes
last, as vLLM applies it after the temperature.

Rules that change only a few named ids (bad words, min_tokens, logit_bias) reach the
streaming kernels as a per-row bias (`few_id_changes`, `row_biases`); the rest are applied
to one materialised row of logits (`shape_logits`)."""

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
    changes = few_id_changes(rules, output_ids, stop_ids, v)
    if changes:
        row[torch.tensor(list(changes), dtype=torch.long)] += torch.tensor(list(changes.values()))
    _penalize(row, rules, prompt_ids, output_ids)


def touches_few_ids(rules: LogitRules) -> bool:
    """Whether every rule changes only a few named ids (bad words, min_tokens, logit_bias):
    then a per-row bias in the streaming kernels applies them, and no row of logits is
    materialised. An allowed set, the penalties and min_p need the whole row."""
    return (rules.allowed_token_ids is None and rules.repetition_penalty == 1.0
            and rules.presence_penalty == 0.0 and rules.frequency_penalty == 0.0
            and rules.min_p <= 0.0)


def few_id_changes(rules: LogitRules, output_ids: Sequence[int], stop_ids: Collection[int],
                   vocab: int) -> dict[int, float]:
    """This step's bad words, min_tokens and logit_bias as id -> what is added to its logit
    (-inf bans it), in vLLM's order: a ban wins over a bias."""
    out: dict[int, float] = {}
    for word in rules.bad_words_ids:
        # A one-token word is always banned; a longer one only right after its other tokens.
        if len(word) == 1 or tuple(output_ids[-(len(word) - 1):]) == word[:-1]:
            out[word[-1]] = NEG_INF
    if len(output_ids) < rules.min_tokens:
        out.update((t, NEG_INF) for t in stop_ids
                   if t < vocab and t not in rules.unmasked_stop_ids)
    for tid, bias in rules.logit_bias:
        out[tid] = out.get(tid, 0.0) + bias
    return out


def row_biases(changes: list[dict[int, float]], head_bias: torch.Tensor | None,
               device: torch.device) -> torch.Tensor | None:
    """A head group's `bias` for the kernels (kernels.row_groups.row_bias): the head's own [V]
    (or None) when no row changes an id; else [b, Vb] fp32, the head's bias (Vb = V) or zeros
    up to the highest changed id, plus each row's changes."""
    if not any(changes):
        return head_bias
    if head_bias is not None:
        out = head_bias.to(device, torch.float32).expand(len(changes), -1).clone()
    else:
        width = max(max(c) for c in changes if c) + 1
        out = torch.zeros(len(changes), width, device=device)
    for i, c in enumerate(changes):
        if c:
            out[i, torch.tensor(list(c), device=device)] += torch.tensor(list(c.values()),
                                                                          device=device)
    return out


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
