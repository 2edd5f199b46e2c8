"""Rows sampled from their materialised logits: a grammar masks them, or vLLM's logit rules
reshape them. The streaming kernels never hold a row of logits, so only such rows pay for
one: [1, V] over the request's own head.

The reported logprob is the raw one (the head's log-softmax before any mask or rule), as
vLLM reports by default, so it agrees with the top alternatives beside it."""

from __future__ import annotations

import torch

from heads.engine.logit_rules import apply_min_p, shape_logits
from heads.engine.sequence import Sequence
from heads.model.adapter import HeadOutput
from kernels.reference import sample_from_logits
from kernels.sampling_params import SamplingBatch


def needs_row(seq: Sequence) -> bool:
    return seq.constraint is not None or seq.rules.shapes


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
