"""Logprobs an evaluator can use: each position's log-probability under the request's head
and its top-N alternatives, for sampled tokens (`top_logprobs`) and for the prompt
(`prompt_logprobs`, what lm-eval's loglikelihood tasks read through `echo`).

The sampling kernels stream the unembedding and never hold a row of logits, so the rows that
ask are unembedded again here: one [k, d]×[d, V] product and a log-softmax over the head's
own V rows (a 32k head's logprob is a distribution over its 32k tokens). Only requests that
ask pay for it. Values are natural logs at temperature 1, as OpenAI and vLLM report them.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from heads.engine.sequence import Sequence
from heads.engine.types import TokenLogprobs
from heads.model.adapter import HeadOutput

# Rows per log-softmax: bounds the fp32 temporary to CHUNK·V·4 B (64 MiB at V=262k).
CHUNK = 64


def position_logprobs(hidden: torch.Tensor, head: HeadOutput, targets: torch.Tensor,
                      n: int) -> list[TokenLogprobs]:
    # hidden: [k, d]; targets: [k] int64 -> per row, log p(target) and the top n (id, log p)
    out: list[TokenLogprobs] = []
    for i in range(0, hidden.shape[0], CHUNK):
        logp = torch.log_softmax(head.logits(hidden[i:i + CHUNK]).float(), dim=-1)  # [c, V]
        target = logp.gather(1, targets[i:i + CHUNK, None])  # [c, 1]
        ranks = ((logp > target).sum(dim=1) + 1).tolist()
        picked = target.squeeze(1).tolist()
        if n > 0:
            values, ids = logp.topk(min(n, logp.shape[1]), dim=-1)
            tops = [tuple(zip(r_ids, r_vals, strict=True))
                    for r_ids, r_vals in zip(ids.tolist(), values.tolist(), strict=True)]
        else:
            tops = [()] * len(picked)
        out += [TokenLogprobs(lp, top, rank)
                for lp, top, rank in zip(picked, tops, ranks, strict=True)]
    return out


def sampled_tops(hidden: torch.Tensor, seqs: Seq[Sequence], token_ids: Seq[int],
                 output_of: Callable[[str], HeadOutput]) -> list[TokenLogprobs | None] | None:
    """Per sequence, the sampled token's logprob and top-N alternatives where it asked."""
    # hidden: [B, d], row i the state that sampled token_ids[i]
    wanted = [i for i, s in enumerate(seqs) if s.top_logprobs > 0]
    if not wanted:
        return None
    out: list[TokenLogprobs | None] = [None] * len(seqs)
    for head, rows in _by_head(seqs, wanted).items():
        n = max(seqs[i].top_logprobs for i in rows)
        got = position_logprobs(hidden[_index(rows, hidden)], output_of(head),
                                _index([token_ids[i] for i in rows], hidden), n)
        for i, lp in zip(rows, got, strict=True):
            out[i] = TokenLogprobs(lp.logprob, lp.top[:seqs[i].top_logprobs], lp.rank)
    return out


def prompt_tops(hidden: torch.Tensor, seqs: Seq[Sequence], last: Seq[int],
                output_of: Callable[[str], HeadOutput]
                ) -> list[tuple[TokenLogprobs, ...] | None] | None:
    """At a sequence's first prefill, every prompt token's logprob after the first (row p
    predicts token p + 1), with its top-N alternatives."""
    # hidden: [T, d]; sequence i's rows end at last[i], and all of its prompt rows are here
    # (heads.engine.block_manager serves no prefix from the cache while they are needed).
    wanted = [i for i, s in enumerate(seqs) if s.needs_prompt_logprobs]
    if not wanted:
        return None
    out: list[tuple[TokenLogprobs, ...] | None] = [None] * len(seqs)
    for i in wanted:
        s = seqs[i]
        first = last[i] - s.num_tokens + 1
        rows = list(range(first, first + len(s.prompt_ids) - 1))
        got = position_logprobs(hidden[_index(rows, hidden)], output_of(s.head),
                                _index(s.prompt_ids[1:], hidden), s.prompt_logprobs or 0)
        out[i] = tuple(got)
    return out


def _by_head(seqs: Seq[Sequence], rows: list[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i in rows:
        out.setdefault(seqs[i].head, []).append(i)
    return out


def _index(values: Seq[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=like.device)
