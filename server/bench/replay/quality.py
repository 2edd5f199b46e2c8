"""Served quality in a replay: how well a head predicts the text that really followed the
prompt, in bits per byte, so heads with different segmentations compare on the same bytes."""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from heads.eval.grouped import first_level, grouped_token_bits
from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint
from heads.vocab.piece_groups import PieceGroups

log = logging.getLogger(__name__)

LOGIT_ROWS = 128  # [128, V] fp32 logits at a time: 128 MB at V = 262k


def continuation_bits(ckpt: Checkpoint, head: str, prompt: str, continuation: str) -> float:
    """Σ −log2 p(continuation tokens | BOS, prompt) under `head`."""
    return float(continuation_token_bits(ckpt, head, prompt, continuation).sum())


@torch.inference_mode()
def continuation_token_bits(ckpt: Checkpoint, head: str, prompt: str,
                            continuation: str) -> torch.Tensor:
    """−log2 p(t | BOS, prompt, tokens before t) of each continuation token under `head`,
    [n] fp64 (a first token nothing predicts scores 0).

    Prompt and continuation are tokenized apart and joined, so the scored tokens spell
    exactly the continuation's bytes on every head; heads that spell native ids (the
    native head and its readings) score the same tokens, index for index.
    """
    tok, spec = ckpt.tokenizers[head], ckpt.manifest.head(head)
    if spec.reads is not None:
        return _reading_bits(ckpt, spec.reads, tok.encode(prompt), tok.encode(continuation))
    ctx = ([] if spec.bos_token_id is None else [spec.bos_token_id]) + tok.encode(prompt)
    target = tok.encode(continuation)
    lead = []
    if target and not ctx:  # nothing predicts the first token; score the rest
        ctx, target, lead = target[:1], target[1:], [0.0]
    if not target:
        return torch.tensor(lead, dtype=torch.float64)
    hidden = forward_hidden(ckpt, head, ctx + target)[len(ctx) - 1:-1].float()  # [T, d]
    out = ckpt.model.head_output(head).to(torch.float32)  # bf16 logits would round ~0.1 nat
    ids = torch.tensor(target, device=hidden.device)
    nats = [F.cross_entropy(out.logits(hidden[r:r + LOGIT_ROWS]), ids[r:r + LOGIT_ROWS],
                            reduction="none").double()
            for r in range(0, hidden.shape[0], LOGIT_ROWS)]
    return torch.cat([torch.tensor(lead, dtype=torch.float64), *nats]) / math.log(2)


def _reading_bits(ckpt: Checkpoint, head: str, prompt: list[int], target: list[int]
                  ) -> torch.Tensor:
    """A two-level reading of `head` scored on the native ids of the continuation, the
    prompt's native ids before it (as the engine serves it)."""
    if not target:
        return torch.zeros(0, dtype=torch.float64)
    split = ckpt.tokenizers[head].split
    assert split is not None  # Manifest.with_readings admits split heads only
    native = ckpt.manifest.native.name
    rows = ckpt.model.unembedding_rows(native).float()  # a view when the model is fp32
    groups = PieceGroups.from_split(split)  # one argsort over the native ids, ~20 ms
    bits, _ = grouped_token_bits(ckpt, native, prompt + target, groups,
                                 first_level(ckpt, head), rows, first=len(prompt))
    return bits[-len(target):]
