"""Llama-family backbone (RMSNorm, RoPE, GQA, SwiGLU) over a paged KV cache.

No embedding or unembedding lives here: those belong to the heads. The backbone maps input
embeddings [T, d] plus attention metadata to final-normed hidden states [T, d].

State-dict keys (Hugging Face `LlamaModel` names without the `model.` prefix):

    layers.{i}.input_layernorm.weight            [d]
    layers.{i}.self_attn.q_proj.weight           [H * Dh, d]
    layers.{i}.self_attn.k_proj.weight           [n_kv * Dh, d]
    layers.{i}.self_attn.v_proj.weight           [n_kv * Dh, d]
    layers.{i}.self_attn.o_proj.weight           [d, H * Dh]
    layers.{i}.post_attention_layernorm.weight   [d]
    layers.{i}.mlp.gate_proj.weight              [I, d]
    layers.{i}.mlp.up_proj.weight                [I, d]
    layers.{i}.mlp.down_proj.weight              [d, I]
    norm.weight                                  [d]

The RoPE table is a non-persistent buffer, so it is not part of the state dict.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from heads.manifest import BackboneConfig
from heads.model.attention import (
    AttentionMetadata,
    KVCache,
    StepMetadata,
    paged_attention,
    per_layer,
)

log = logging.getLogger(__name__)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, as Hugging Face Llama does, so
        # bf16 checkpoints round the same way. In fp32 that is the fused op's formula.
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_table(head_dim: int, max_positions: int, theta: float) -> torch.Tensor:
    # -> [max_positions, 2, Dh] fp32: (cos, sin) in the rotate-half layout (frequencies repeated)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((emb.cos(), emb.sin()), dim=1)


def project(module: nn.Module, group: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of `module.FUSED_PROJECTIONS[group]` for input x: from one fused product
    when the CPU engine packed them (heads.engine.cpu_linear), else one linear each."""
    fused: dict[str, nn.Module] = module.fused  # type: ignore[assignment]
    product = fused.get(group)
    if product is not None:
        sizes: tuple[int, ...] = product.sizes  # type: ignore[assignment]
        return product(x).split(sizes, dim=-1)
    names: dict[str, tuple[str, ...]] = module.FUSED_PROJECTIONS  # type: ignore[assignment]
    return tuple(getattr(module, name)(x) for name in names[group])


def project_joined(module: nn.Module, group: str, x: torch.Tensor) -> torch.Tensor:
    """The outputs of `module.FUSED_PROJECTIONS[group]` side by side, [T, sum(out)]: the fused
    product's own output when there is one."""
    fused: dict[str, nn.Module] = module.fused  # type: ignore[assignment]
    product = fused.get(group)
    if product is not None:
        out: torch.Tensor = product(x)
        return out
    return torch.cat(project(module, group, x), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, Dh]; cos, sin: [T, 1, Dh] in x's dtype
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    FUSED_PROJECTIONS = {"qkv": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.fused: dict[str, nn.Module] = {}  # filled by heads.engine.cpu_linear
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = project(self, "qkv", x)
        q = q.view(t, self.n_heads, self.head_dim)  # q: [T, H, Dh]
        k = k.view(t, self.n_kv, self.head_dim)  # k: [T, n_kv, Dh]
        v = v.view(t, self.n_kv, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = paged_attention(q, k, v, meta, kv, self.scale)
        return self.o_proj(o.reshape(t, self.n_heads * self.head_dim))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU for Llama (silu), GeGLU for Gemma (tanh GELU)."""

    FUSED_PROJECTIONS = {"gate_up": ("gate_proj", "up_proj")}

    def __init__(
        self, cfg: BackboneConfig, act: Callable[[torch.Tensor], torch.Tensor] = F.silu
    ) -> None:
        super().__init__()
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.act = act
        self.fused: dict[str, nn.Module] = {}  # filled by heads.engine.cpu_linear
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(self, "gate_up", x)
        return self.down_proj(self.act(gate) * up)



class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        if cfg.architecture != "llama":
            raise ValueError(f"LlamaBackbone cannot run architecture {cfg.architecture!r}")
        self.config = cfg
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer(
            "rope",
            rope_table(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta),
            persistent=False,
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        # x: [T, d]; positions: [T] int64 -> final-normed hidden states [T, d]
        rope: torch.Tensor = self.rope  # type: ignore[assignment]  # a buffer, not a Module
        table = rope[positions].to(x.dtype)  # [T, 2, Dh]
        cos, sin = table[:, 0:1], table[:, 1:2]  # [T, 1, Dh], broadcast over heads
        metas = per_layer(meta, len(self.layers))
        for layer, m, kv in zip(self.layers, metas, kv_cache, strict=True):
            x = layer(x, cos, sin, m, kv)
        return self.norm(x)
