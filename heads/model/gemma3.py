"""Gemma-3 text backbone over the paged KV cache.

Differences from Llama: RMSNorm scales by (1 + w) after the fp32 cast; q/k are RMS-normed per
head before RoPE (QK-norm); scores scale by query_pre_attn_scalar^-1/2; four norms per layer
(post-attention and post-MLP outputs are normed before the residual add); GeGLU with tanh GELU;
input embeddings are multiplied by sqrt(d) rounded to the embedding dtype; sliding-window and
full-attention layers as `layer_types` says, with their own RoPE bases.

State-dict keys (Hugging Face `Gemma3TextModel` names without the `model.` prefix):

    layers.{i}.input_layernorm.weight             [d]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight    [H*Dh, d] [n_kv*Dh, d] x2 [d, H*Dh]
    layers.{i}.self_attn.{q,k}_norm.weight        [Dh]
    layers.{i}.post_attention_layernorm.weight    [d]
    layers.{i}.pre_feedforward_layernorm.weight   [d]
    layers.{i}.mlp.{gate,up}_proj.weight          [I, d]
    layers.{i}.mlp.down_proj.weight               [d, I]
    layers.{i}.post_feedforward_layernorm.weight  [d]
    norm.weight                                   [d]
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from heads.errors import CheckpointError
from heads.manifest import BackboneConfig
from heads.model.attention import (
    AttentionMetadata,
    KVCache,
    StepMetadata,
    paged_attention,
    per_layer,
)
from heads.model.gemma3_fused import fused_forward
from heads.model.llama import GatedMLP, apply_rope, project

log = logging.getLogger(__name__)

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self._scale: tuple[tuple[int, int], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Unlike Llama, the weight multiplies in fp32 before the cast back (as transformers
        # does): x * rsqrt(mean(x^2) + eps) * (1 + w), all in fp32. One fused op instead of
        # seven; this runs six times per layer and step.
        return F.rms_norm(x.float(), (x.shape[-1],), self.scale(), self.eps).to(x.dtype)

    def scale(self) -> torch.Tensor:
        # -> [d] fp32. Cached for inference (decode calls this ~100 times per step) until the
        # weight is replaced or written; under autograd it is computed afresh.
        if not torch.is_inference_mode_enabled():
            return 1.0 + self.weight.float()
        key = (self.weight.data_ptr(), self.weight._version)
        if self._scale is None or self._scale[0] != key:
            self._scale = (key, 1.0 + self.weight.detach().float())
        return self._scale[1]


def inv_frequencies(head_dim: int, theta: float, linear_factor: float | None) -> torch.Tensor:
    # -> [Dh / 2] fp32
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    return inv / linear_factor if linear_factor else inv


class Gemma3Attention(nn.Module):
    FUSED_PROJECTIONS = {"qkv": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, cfg: BackboneConfig, window: int | None) -> None:
        super().__init__()
        self.fused: dict[str, nn.Module] = {}  # filled by heads.engine.cpu_linear
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.window = window
        self.scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)

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
        q = self.q_norm(q.view(t, self.n_heads, self.head_dim))  # [T, H, Dh]
        k = self.k_norm(k.view(t, self.n_kv, self.head_dim))  # [T, n_kv, Dh]
        v = v.view(t, self.n_kv, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = paged_attention(q, k, v, meta, kv, self.scale, self.window)
        return self.o_proj(o.reshape(t, self.n_heads * self.head_dim))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: BackboneConfig, layer_type: str) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(d, eps)
        self.self_attn = Gemma3Attention(cfg, cfg.sliding_window if layer_type == SLIDING else None)
        self.post_attention_layernorm = GemmaRMSNorm(d, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(d, eps)
        self.mlp = GatedMLP(cfg, _gelu_tanh)
        self.post_feedforward_layernorm = GemmaRMSNorm(d, eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(x), cos, sin, meta, kv)
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Backbone(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        if cfg.architecture != "gemma3":
            raise ValueError(f"Gemma3Backbone cannot run architecture {cfg.architecture!r}")
        if cfg.final_logit_softcapping is not None:
            # The engine's samplers take raw logits; a tanh cap would change sampling (not argmax).
            raise CheckpointError(
                "backbone.final_logit_softcapping: not supported by the local engine"
            )
        self.config = cfg
        self.layer_types = cfg.layer_types or (FULL,) * cfg.num_layers
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, t) for t in self.layer_types)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        local_theta = cfg.rope_local_theta or cfg.rope_theta
        self.register_buffer(
            "inv_freq_full", inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_linear_factor),
            persistent=False,
        )
        self.register_buffer(
            "inv_freq_sliding", inv_frequencies(cfg.head_dim, local_theta, None), persistent=False
        )
        # Set by the CPU engine once heads.model.native.build loaded the fused ops: inference
        # (no autograd) then runs heads.model.gemma3_fused. Training always runs the eager ops.
        self.fused_ops = False

    def scale_embeddings(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, d] raw embedding rows -> a new [T, d] (bf16: the factor 25.298 rounds to 25.25)
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)

    def ropes(self, positions: torch.Tensor, dtype: torch.dtype
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Layer kind -> its (cos, sin) [T, 1, Dh] for these positions."""
        full: torch.Tensor = self.inv_freq_full  # type: ignore[assignment]  # buffers
        sliding: torch.Tensor = self.inv_freq_sliding  # type: ignore[assignment]
        return {FULL: self._rope(full, positions, dtype), SLIDING: self._rope(sliding, positions,
                                                                              dtype)}

    def _rope(self, inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
        # -> cos, sin: [T, 1, Dh] in the activations' dtype, computed in fp32 as transformers does
        freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, Dh / 2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        # x: [T, d] raw embedding rows; positions: [T] int64 -> final-normed hidden states [T, d]
        if self.fused_ops and not torch.is_grad_enabled():
            return fused_forward(self, x, positions, meta, kv_cache)
        x = self.scale_embeddings(x)
        ropes = self.ropes(positions, x.dtype)
        metas = per_layer(meta, len(self.layers))
        for layer, kind, m, kv in zip(self.layers, self.layer_types, metas, kv_cache, strict=True):
            cos, sin = ropes[kind]
            x = layer(x, cos, sin, m, kv)
        return self.norm(x)
