"""The Gemma-3 backbone's inference forward through the fused CPU ops (heads.model.native).

Per layer: the q/k/v product; one op for the q/k norms, RoPE and the KV-cache write; one op
for decode attention over the paged cache (prefill keeps SDPA); the o product; one op for the
post-attention norm, the residual add and the pre-MLP norm; the gate/up product, one op for
GeGLU's tanh GELU and product, the down product; one op for the post-MLP norm, the residual
add and the next layer's input norm (the final norm after the last layer). That is 10
dispatches per layer where the eager forward makes about 50; the residual stream is one
[T, d] tensor updated in place.
"""

from __future__ import annotations

from typing import Any

import torch

from heads.model.attention import KVCache, StepMetadata, paged_prefill_attention, per_layer
from heads.model.llama import project_joined


def fused_forward(
    backbone: Any,  # a heads.model.gemma3.Gemma3Backbone, whose forward calls this one
    x: torch.Tensor,
    positions: torch.Tensor,
    meta: StepMetadata,
    kv_cache: KVCache,
) -> torch.Tensor:
    # x: [T, d] raw embedding rows; positions: [T] int64 -> final-normed hidden states [T, d]
    ops = torch.ops.polyhead
    eps = backbone.config.rms_norm_eps
    residual = backbone.scale_embeddings(x)  # a fresh tensor: updated in place below
    ropes = backbone.ropes(positions, x.dtype)
    layers = list(backbone.layers)
    next_norms = [layer.input_layernorm for layer in layers[1:]] + [backbone.norm]
    metas = per_layer(meta, len(layers))
    t = x.shape[0]
    h = ops.rms_norm(residual, layers[0].input_layernorm.scale(), eps)
    for layer, kind, m, kv, next_norm in zip(
        layers, backbone.layer_types, metas, kv_cache, next_norms, strict=True
    ):
        attn = layer.self_attn
        cos, sin = ropes[kind]
        q, k, v = ops.qk_norm_rope(
            project_joined(attn, "qkv", h), attn.q_norm.scale(), attn.k_norm.scale(), cos, sin,
            eps, attn.n_heads, attn.n_kv, kv[0], kv[1], m.slot_mapping,
        )
        if m.is_prefill:
            o = paged_prefill_attention(q, k, v, m, kv, attn.scale, attn.window)
        else:
            o = ops.paged_decode_attention(q, kv[0], kv[1], m.block_tables, m.context_lens,
                                           attn.window or 0, attn.scale)
        a = attn.o_proj(o.reshape(t, attn.n_heads * attn.head_dim))
        h = ops.add_rms_norm(residual, a, layer.post_attention_layernorm.scale(),
                             layer.pre_feedforward_layernorm.scale(), eps)
        mlp = layer.mlp
        f = mlp.down_proj(ops.gelu_tanh_mul(project_joined(mlp, "gate_up", h)))
        h = ops.add_rms_norm(residual, f, layer.post_feedforward_layernorm.scale(),
                             next_norm.scale(), eps)
    return h
