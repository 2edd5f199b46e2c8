"""Rows of a nested pass grouped by their head's V: the per-head reference for the rows a
streaming pass cannot sample exactly, and the batch reordering the nested kernels use."""

from __future__ import annotations

import logging

import torch

from kernels import reference
from kernels.errors import ShapeMismatch
from kernels.sampling_params import SampleOutput, SamplingBatch

log = logging.getLogger(__name__)


def row_bias(bias: torch.Tensor | None, b: int, vocab: int) -> torch.Tensor | None:
    """A kernel's `bias` argument as [b, Vb] fp32 (zero past Vb): a head's [V] bias broadcast
    to every row, or per-row [b, Vb] as given. Per-row biases are how a few ids' logit rules
    (min_tokens' masked stop ids, logit_bias, bad words) reach the streaming kernels without
    a row of logits: their Vb ends at the highest id they touch."""
    if bias is None:
        return None
    if bias.dim() == 1:
        return bias.to(torch.float32).expand(b, vocab)
    if bias.dim() != 2 or bias.shape[0] != b or not 1 <= bias.shape[1] <= vocab:
        raise ShapeMismatch(f"bias must be [{vocab}] or [{b}, <= {vocab}], got "
                            f"{tuple(bias.shape)}")
    return bias.to(torch.float32)


def bias_columns(bias: torch.Tensor, v: int) -> torch.Tensor:
    """bias [b, Vb] -> [b, v]: cut, or padded with zeros. A nested pass's bias only spans the
    largest biased head (Vb <= Vmax): a [B, Vmax] buffer of zeros for an adapted 32k head in a
    262k step would be 16 MB written and read per step at B = 16."""
    vb = bias.shape[1]
    return bias[:, :v] if vb >= v else torch.nn.functional.pad(bias, (0, v - vb))


def bias_at(bias: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    # bias [b, Vb], tokens [b] int64 -> [b] fp32, 0 for a token at or past Vb
    inside = tokens < bias.shape[1]
    got = bias.gather(1, torch.where(inside, tokens, 0)[:, None]).squeeze(1)
    return torch.where(inside, got, torch.zeros_like(got))


def take_rows(batch: SamplingBatch, rows: torch.Tensor) -> SamplingBatch:
    return SamplingBatch(
        batch.temperature[rows], batch.top_p[rows], batch.top_k[rows], batch.seed[rows],
        batch.position[rows], batch.want_logprobs,
    )


def reference_per_head(
    hidden: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch,
    bias: torch.Tensor | None, row_vocab: torch.Tensor, rows: torch.Tensor,
) -> SampleOutput:
    """The reference on `rows` [r], each against its own head's rows weight[:V_i].
    hidden [b, d]; bias [b, Vb] fp32 or None (zero past Vb); row_vocab [b] int64."""
    dev = hidden.device
    tokens = torch.zeros(rows.shape[0], dtype=torch.int64, device=dev)
    logprobs = (torch.zeros(rows.shape[0], dtype=torch.float32, device=dev)
                if batch.want_logprobs else None)
    sub_vocab = row_vocab.to(dev)[rows]
    for v in torch.unique(sub_vocab).tolist():
        at = torch.nonzero(sub_vocab == v).squeeze(1)  # positions in `rows`
        r = rows[at]
        out = reference.unembed_and_sample(
            hidden[r], weight[:v], take_rows(batch, r),
            None if bias is None else bias_columns(bias[r], v))
        tokens[at] = out.token_ids.to(dev)
        if logprobs is not None and out.logprobs is not None:
            logprobs[at] = out.logprobs.to(dev)
    return SampleOutput(tokens, logprobs)


def descending_order(row_vocab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inverse): hidden[perm] lists the rows by V descending, ties in batch order,
    so the rows that see a column are always a prefix; out[inverse] undoes it."""
    perm = torch.argsort(-row_vocab.to(torch.int64), stable=True)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.shape[0], device=perm.device)
    return perm, inverse
