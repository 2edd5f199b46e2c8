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


@torch.inference_mode()
def continuation_bits(ckpt: Checkpoint, head: str, prompt: str, continuation: str) -> float:
    """Σ −log2 p(continuation tokens | BOS, prompt) under `head`.

    Prompt and continuation are tokenized apart and joined, so the scored tokens spell
    exactly the continuation's bytes on every head.
    """
    tok, spec = ckpt.tokenizers[head], ckpt.manifest.head(head)
    if spec.reads is not None:
        return _reading_bits(ckpt, spec.reads, tok.encode(prompt), tok.encode(continuation))
    ctx = ([] if spec.bos_token_id is None else [spec.bos_token_id]) + tok.encode(prompt)
    target = tok.encode(continuation)
    if not target:
        return 0.0
    if not ctx:  # nothing predicts the first token; score the rest
        ctx, target = target[:1], target[1:]
    hidden = forward_hidden(ckpt, head, ctx + target)[len(ctx) - 1:-1].float()  # [T, d]
    out = ckpt.model.head_output(head).to(torch.float32)  # bf16 logits would round ~0.1 nat
    ids = torch.tensor(target, device=hidden.device)
    nats = 0.0
    for r in range(0, hidden.shape[0], LOGIT_ROWS):
        logits = out.logits(hidden[r:r + LOGIT_ROWS])
        nats += float(F.cross_entropy(logits, ids[r:r + LOGIT_ROWS], reduction="sum"))
    return nats / math.log(2)


def _reading_bits(ckpt: Checkpoint, head: str, prompt: list[int], target: list[int]) -> float:
    """A two-level reading of `head` scored on the native ids of the continuation, the
    prompt's native ids before it (as the engine serves it)."""
    if not target:
        return 0.0
    split = ckpt.tokenizers[head].split
    assert split is not None  # Manifest.with_readings admits split heads only
    native = ckpt.manifest.native.name
    rows = ckpt.model.unembedding_rows(native).float()  # a view when the model is fp32
    groups = PieceGroups.from_split(split)  # one argsort over the native ids, ~20 ms
    bits, _ = grouped_token_bits(ckpt, native, prompt + target, groups,
                                 first_level(ckpt, head), rows, first=len(prompt))
    return float(bits[-len(target):].sum())
