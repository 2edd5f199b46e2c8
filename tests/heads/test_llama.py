"""The paged Llama backbone against transformers' LlamaForCausalLM, prefill and decode."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from heads.attention import AttentionMetadata, allocate_kv_cache, slots_for
from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model import MultiHeadModel

V = 1000
BLOCK = 4
TOL = 1e-4


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


def _hf_logits(hf: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0]  # [T, V]


def test_prefill_and_decode_match_transformers(models) -> None:
    model, hf = models
    b = model.manifest.backbone
    kv = allocate_kv_cache(b.num_layers, 32, BLOCK, b.num_kv_heads, b.head_dim, torch.float32)
    w = model.unembedding_rows("1k")
    gen = torch.Generator().manual_seed(1)
    # Two sequences with scattered, non-contiguous blocks, prefilled together.
    prompts = [torch.randint(0, V, (11,), generator=gen).tolist(),
               torch.randint(0, V, (6,), generator=gen).tolist()]
    tables = [[7, 2, 30, 11, 5, 19], [3, 25, 0, 14, 9]]
    ids = torch.tensor(prompts[0] + prompts[1])
    positions = torch.tensor(list(range(11)) + list(range(6)))
    slots = slots_for(tables[0], 0, 11, BLOCK) + slots_for(tables[1], 0, 6, BLOCK)
    meta = AttentionMetadata.prefill([11, 6], torch.tensor(slots))
    with torch.inference_mode():
        logits = model(model.embed("1k", ids), positions, meta, kv) @ w.T  # [T, V]
    torch.testing.assert_close(logits[:11], _hf_logits(hf, prompts[0]), atol=TOL, rtol=0)
    torch.testing.assert_close(logits[11:], _hf_logits(hf, prompts[1]), atol=TOL, rtol=0)

    seqs = [list(p) for p in prompts]
    for _ in range(6):  # decode both sequences together through the paged cache
        nxt = [int(torch.randint(0, V, (1,), generator=gen)) for _ in seqs]
        for s, t in zip(seqs, nxt, strict=True):
            s.append(t)
        pos = [len(s) - 1 for s in seqs]
        slots = [slots_for(t, p, p + 1, BLOCK)[0] for t, p in zip(tables, pos, strict=True)]
        meta = AttentionMetadata.decode(
            torch.tensor(slots),
            torch.tensor([t[:5] for t in tables]),
            torch.tensor([len(s) for s in seqs]),
        )
        with torch.inference_mode():
            h = model(model.embed("1k", torch.tensor(nxt)), torch.tensor(pos), meta, kv)
        for i, s in enumerate(seqs):
            torch.testing.assert_close(h[i] @ w.T, _hf_logits(hf, s)[-1], atol=TOL, rtol=0)


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
