"""oneDNN-packed projections: the same products as nn.Linear (to fp32 rounding), same state,
and fused q/k/v and gate/up groups that give the unfused modules' outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from heads.engine.cpu_linear import PackedLinear, pack_linears, packing_available
from heads.manifest import BackboneConfig
from heads.model.llama import GatedMLP, LlamaAttention

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu"), torch.float32), reason="no oneDNN in this torch")


def test_packed_linear_matches_dense_at_every_batch_size() -> None:
    torch.manual_seed(0)
    dense = nn.Linear(64, 96, bias=False)
    packed = PackedLinear(dense)
    with torch.inference_mode():
        for b in (1, 3, 16, 65):
            x = torch.randn(b, 64)
            torch.testing.assert_close(packed(x), dense(x), atol=1e-5, rtol=1e-5)


def test_fused_packed_linear_concatenates_outputs() -> None:
    torch.manual_seed(0)
    parts = [nn.Linear(40, n, bias=False) for n in (24, 8, 8)]
    fused = PackedLinear(*parts)
    assert fused.sizes == (24, 8, 8) and not hasattr(fused, "weight")
    x = torch.randn(7, 40)
    with torch.inference_mode():
        for got, lin in zip(fused(x).split(fused.sizes, dim=-1), parts, strict=True):
            torch.testing.assert_close(got, lin(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        PackedLinear(nn.Linear(40, 8, bias=False), nn.Linear(41, 8, bias=False))


def test_pack_linears_swaps_nested_layers_and_keeps_the_state_dict() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Sequential(nn.Linear(16, 4, bias=False)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert pack_linears(model) == 2
    assert pack_linears(model) == 0  # already packed
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_pack_linears_fuses_attention_and_mlp_projections() -> None:
    torch.manual_seed(0)
    cfg = BackboneConfig(architecture="llama", hidden_size=32, intermediate_size=48,
                         num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                         rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64)
    attn, mlp = LlamaAttention(cfg), GatedMLP(cfg)
    x = torch.randn(5, 32)
    with torch.inference_mode():
        want = mlp(x)
        keys = set(attn.state_dict()) | set(mlp.state_dict())
        # q, k, v and gate, up: one fused product each; o and down: swapped one by one.
        assert pack_linears(attn) + pack_linears(mlp) == 7
        assert set(attn.fused) == {"qkv"} and set(mlp.fused) == {"gate_up"}
        assert isinstance(attn.o_proj, PackedLinear) and isinstance(mlp.down_proj, PackedLinear)
        assert set(attn.state_dict()) | set(mlp.state_dict()) == keys
        torch.testing.assert_close(mlp(x), want, atol=1e-5, rtol=1e-5)
        assert pack_linears(attn) == 0
