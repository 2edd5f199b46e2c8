"""One sequence through the backbone from position 0, outside the engine: hidden states and
a head's logits (evaluation, adaptation and the replay's quality check score text this way)."""

from __future__ import annotations

import torch

from heads.model.attention import AttentionMetadata, allocate_kv_cache
from heads.model.weights import Checkpoint


@torch.inference_mode()
def forward_hidden(ckpt: Checkpoint, head: str, ids: list[int]) -> torch.Tensor:
    """Final hidden states [T, d] for one sequence starting at position 0 (fresh KV cache)."""
    model = ckpt.model
    b = ckpt.manifest.backbone
    block = 16
    t = len(ids)
    kv = allocate_kv_cache(b.num_layers, -(-t // block), block, b.num_kv_heads, b.head_dim,
                           model.dtype, model.device)
    x = torch.tensor(ids, dtype=torch.int64, device=model.device)
    positions = torch.arange(t, device=model.device)
    meta = AttentionMetadata.prefill([t], positions.clone())  # slot i holds position i
    return model(model.embed(head, x), positions, meta, kv)


def forward_logits(ckpt: Checkpoint, head: str, ids: list[int]) -> torch.Tensor:
    # -> [T, V_head] fp32, the head's adapter applied
    out = ckpt.model.head_output(head).to(torch.float32)
    return out.logits(forward_hidden(ckpt, head, ids).float())
