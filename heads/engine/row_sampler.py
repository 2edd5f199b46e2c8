"""Rows sampled from their materialised logits: a grammar masks them, or vLLM's logit rules
over the whole row reshape them. The streaming kernels never hold a row of logits, so only
such rows pay for one: [1, V] over the request's own head. Rules on a few ids go to the
kernels as a per-row bias instead (heads.engine.model_runner).

The reported logprob is the raw one (the head's log-softmax before any mask or rule), as
vLLM reports by default, so it agrees with the top alternatives beside it."""

from __future__ import annotations

import torch

from heads.engine.logit_rules import apply_min_p, shape_logits, touches_few_ids
from heads.engine.sequence import Sequence
from heads.model.adapter import HeadOutput
from kernels.reference import sample_from_logits
from kernels.sampling_params import SamplingBatch


def needs_row(seq: Sequence) -> bool:
    """A grammar, a rule over the whole row, or logprobs beside a rule (reported raw, as vLLM
    does, while the kernels' logprobs would include the rule's bias)."""
    if seq.constraint is not None:
        return True
    return seq.rules.shapes and (seq.want_logprobs or not touches_few_ids(seq.rules))


def sample_row(head: HeadOutput, hidden: torch.Tensor, seq: Sequence
               ) -> tuple[int, float | None]:
    """hidden: [1, d]. One token for `seq` from its shaped logits, sampled as the kernels
    sample (the same seeded noise), then fed to its grammar."""
    logits = head.logits(hidden).float()  # [1, V]
    raw = torch.log_softmax(logits, dim=-1) if seq.want_logprobs else None
    if seq.constraint is not None:
        seq.constraint.mask(logits)
    if seq.rules.shapes:
        shape_logits(logits, seq.rules, seq.prompt_ids, seq.output_ids, seq.stop_token_ids)
        apply_min_p(logits, seq.rules.min_p, seq.params.temperature)
    batch = SamplingBatch.from_rows([seq.params], [seq.num_tokens], want_logprobs=False)
    token = int(sample_from_logits(logits, batch).token_ids[0])
    if seq.constraint is not None:
        seq.constraint.accept(token)
    return token, None if raw is None else float(raw[0, token])
