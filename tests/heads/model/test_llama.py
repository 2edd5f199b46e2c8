"""The paged Llama backbone against transformers' LlamaForCausalLM, prefill and decode."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model.multi_head import MultiHeadModel
from tests.heads.paged_oracle import check_cached_prefix, check_prefill_and_decode

V = 1000


def _manifest() -> Manifest:
    backbone = BackboneConfig(
        architecture="llama", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, intermediate_size=256, rope_theta=5000.0, rms_norm_eps=1e-5,
        max_position_embeddings=256,
    )
    head = HeadSpec(
        name="1k", vocab_size=V, tokenizer="tok.json", embedding="matrices.shared",
        unembedding="matrices.shared", bos_token_id=None, eos_token_ids=(0,), training_bytes=0,
    )
    return Manifest(model_name="tiny", dtype="float32", backbone=backbone, heads=(head,))


def _hf_model(model: MultiHeadModel) -> LlamaForCausalLM:
    b = model.manifest.backbone
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
        num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, head_dim=b.head_dim, rms_norm_eps=b.rms_norm_eps,
        rope_theta=b.rope_theta, max_position_embeddings=b.max_position_embeddings,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
    )
    hf = LlamaForCausalLM(cfg).float().eval()
    sd = {"model." + k.removeprefix("backbone."): v for k, v in model.state_dict_for_save().items()
          if k.startswith("backbone.")}
    sd["model.embed_tokens.weight"] = model.unembedding_rows("1k")
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"}  # tied to embed_tokens
    return hf


@pytest.fixture(scope="module")
def models() -> tuple[MultiHeadModel, LlamaForCausalLM]:
    model = MultiHeadModel.random(_manifest(), seed=0)
    # Bigger than N(0, 0.02) so attention is far from uniform and a RoPE bug would show.
    with torch.no_grad():
        for p in model.backbone.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    return model, _hf_model(model)


def test_prefill_and_decode_match_transformers(models) -> None:
    model, hf = models
    check_prefill_and_decode(model, hf, V, (11, 6))



def test_prefill_after_a_cached_prefix_matches_transformers(models) -> None:
    """A prefill that starts after a cached prefix attends to it."""
    model, hf = models
    check_cached_prefix(model, hf, V, (8, 0), (3, 6))

def test_state_dict_round_trip(models) -> None:
    model, _ = models
    sd = model.state_dict_for_save()
    assert "backbone.layers.0.self_attn.q_proj.weight" in sd
    assert "backbone.norm.weight" in sd
    assert [k for k in sd if not k.startswith("backbone.")] == ["matrices.shared"]
    again = MultiHeadModel(model.manifest, sd)
    for k, v in again.state_dict_for_save().items():
        assert torch.equal(v, sd[k]), k


def test_embed_rejects_ids_outside_head(models) -> None:
    model, _ = models
    with pytest.raises(ValueError):
        model.embed("1k", torch.tensor([V]))
    rows = model.unembedding_rows("1k")
    assert rows.shape == (V, 128)
    assert rows.untyped_storage().data_ptr() == model.state_dict_for_save()[
        "matrices.shared"].untyped_storage().data_ptr()  # a view, not a copy
