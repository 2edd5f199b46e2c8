"""A small random Gemma-3 (sliding and full layers, GQA, scaled RoPE, QK-norm) and its
transformers twin with the same weights: the oracle for the paged backbone's tests."""

from __future__ import annotations

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model.multi_head import MultiHeadModel

V = 1000
WINDOW = 5  # shorter than both prompts, so the sliding mask matters in prefill and decode
LAYER_TYPES = ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention")


def tiny_manifest(**overrides: object) -> Manifest:
    fields = dict(
        architecture="gemma3", hidden_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, intermediate_size=192, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        max_position_embeddings=256, sliding_window=WINDOW, layer_types=LAYER_TYPES,
        rope_local_theta=10_000.0, rope_linear_factor=2.0, query_pre_attn_scalar=24.0,
    )
    fields.update(overrides)
    backbone = BackboneConfig(**fields)  # type: ignore[arg-type]
    head = HeadSpec(
        name="1k", vocab_size=V, tokenizer="tok.json", embedding="matrices.shared",
        unembedding="matrices.shared", bos_token_id=2, eos_token_ids=(1,), training_bytes=0,
    )
    return Manifest(model_name="tiny-gemma", dtype="float32", backbone=backbone, heads=(head,))


def hf_model(model: MultiHeadModel) -> Gemma3ForCausalLM:
    b = model.manifest.backbone
    cfg = Gemma3TextConfig(
        vocab_size=V, hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
        num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, head_dim=b.head_dim, rms_norm_eps=b.rms_norm_eps,
        max_position_embeddings=b.max_position_embeddings, sliding_window=b.sliding_window,
        layer_types=list(b.layer_types), query_pre_attn_scalar=int(b.query_pre_attn_scalar or 0),
        rope_parameters={
            "full_attention": {"rope_type": "linear", "rope_theta": b.rope_theta,
                               "factor": b.rope_linear_factor},
            "sliding_attention": {"rope_type": "default", "rope_theta": b.rope_local_theta},
        },
        tie_word_embeddings=True, attn_implementation="eager", pad_token_id=0,  # type: ignore[call-arg]
    )
    hf = Gemma3ForCausalLM(cfg).float().eval()
    sd = {"model." + k.removeprefix("backbone."): v for k, v in model.state_dict_for_save().items()
          if k.startswith("backbone.")}
    sd["model.embed_tokens.weight"] = model.unembedding_rows("1k")
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"}  # tied to embed_tokens
    return hf



def random_model(seed: int = 0) -> MultiHeadModel:
    model = MultiHeadModel.random(tiny_manifest(), seed=seed)
    # Larger weights so attention is far from uniform and a RoPE or window bug would show; norm
    # weights random so the (1 + w) convention is exercised.
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.backbone.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model
