"""A tiny three-head Llama (V = 1000 / 400 / 128 over one shared matrix) for engine tests."""

from __future__ import annotations

import torch

from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model.multi_head import MultiHeadModel

HEADS = {"1k": 1000, "400": 400, "128": 128}
EOS = 1


def tiny_manifest(max_positions: int = 256) -> Manifest:
    backbone = BackboneConfig(
        architecture="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=128, max_position_embeddings=max_positions,
    )
    heads = tuple(
        HeadSpec(
            name=name, vocab_size=v, tokenizer=f"{name}.json", embedding="matrices.shared",
            unembedding="matrices.shared", bos_token_id=None, eos_token_ids=(EOS,),
            training_bytes=0,
        )
        for name, v in HEADS.items()
    )
    return Manifest(model_name="tiny", dtype="float32", backbone=backbone, heads=heads)


def tiny_model(seed: int = 0, max_positions: int = 256) -> MultiHeadModel:
    model = MultiHeadModel.random(tiny_manifest(max_positions), seed)
    # At N(0, 0.02) the residual stream is dominated by the input embedding and greedy decoding
    # just repeats the last token; larger projections give varied, context-dependent outputs.
    with torch.no_grad():
        for p in model.backbone.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model
