"""Load a Hugging Face model directory or hub ID (safetensors; llama or gemma3_text) as a
`LoadedSource`. Hub IDs download through transformers' usual cache, so they need a network."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from heads.errors import CheckpointError
from heads.loaders.source import (
    EMBEDDING,
    TORCH_DTYPES,
    UNEMBEDDING,
    LoadedSource,
    special_ids,
)
from heads.manifest import BackboneConfig

log = logging.getLogger(__name__)

SUPPORTED = ("llama", "gemma3_text")


def load_hf(name_or_path: str, dtype: str = "bfloat16", revision: str | None = None
            ) -> LoadedSource:
    try:
        cfg = AutoConfig.from_pretrained(name_or_path, revision=revision)
        tok = AutoTokenizer.from_pretrained(name_or_path, revision=revision)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{name_or_path}: cannot load config/tokenizer ({e})") from e
    backbone = backbone_from_hf(cfg)
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, revision=revision, dtype=TORCH_DTYPES[dtype]
    )
    tensors = tensors_from_hf(model.state_dict(), bool(cfg.tie_word_embeddings))
    del model
    backend = tok.backend_tokenizer
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    if tok.eos_token_id is not None:
        eos.append(tok.eos_token_id)
    # Gemma's tokenizer adds <bos> itself; a tokenizer that does not was trained without one.
    add_bos = tok.bos_token_id is not None and tok("a").input_ids[:1] == [tok.bos_token_id]
    bos, eos_ids = special_ids(backend, tok.bos_token_id, [e for e in eos if e is not None],
                               add_bos)
    return LoadedSource(
        model_name=re.sub(r"[^A-Za-z0-9._-]+", "-", name_or_path.rstrip("/").split("/")[-1])
        .lower(),
        backbone=backbone, dtype=dtype, tensors=tensors, embedding=EMBEDDING,
        unembedding=UNEMBEDDING if UNEMBEDDING in tensors else EMBEDDING,
        tokenizer_json=backend.to_str(), bos_token_id=bos, eos_token_ids=eos_ids,
        chat_template=tok.chat_template if isinstance(tok.chat_template, str) else None,
        origin=f"hf:{name_or_path}",
    )


def backbone_from_hf(cfg: PretrainedConfig) -> BackboneConfig:
    kind = cfg.model_type
    if kind not in SUPPORTED:
        raise CheckpointError(f"model_type {kind!r} not in {SUPPORTED}")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise CheckpointError(f"{kind}: attention/MLP biases are not supported")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    common: dict[str, Any] = dict(
        hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim, intermediate_size=cfg.intermediate_size,
        rms_norm_eps=float(cfg.rms_norm_eps),
        max_position_embeddings=cfg.max_position_embeddings,
    )
    rope = cfg.rope_parameters or {}
    if kind == "llama":
        if cfg.hidden_act != "silu" or rope.get("rope_type", "default") != "default":
            raise CheckpointError("llama: only SiLU and unscaled RoPE are supported")
        return BackboneConfig(architecture="llama", rope_theta=float(rope["rope_theta"]),
                              **common)
    if cfg.hidden_activation != "gelu_pytorch_tanh" or cfg.attn_logit_softcapping is not None:
        raise CheckpointError("gemma3: only tanh GELU and no attention softcapping are supported")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise CheckpointError("gemma3: bidirectional attention is not supported")
    full, local = rope["full_attention"], rope["sliding_attention"]
    if local.get("rope_type", "default") != "default" or full.get("rope_type") not in (
        "default", "linear"
    ):
        raise CheckpointError(f"gemma3: RoPE {full.get('rope_type')!r} is not supported")
    return BackboneConfig(
        architecture="gemma3", rope_theta=float(full["rope_theta"]),
        sliding_window=cfg.sliding_window, layer_types=tuple(cfg.layer_types),
        rope_local_theta=float(local["rope_theta"]),
        rope_linear_factor=float(full["factor"]) if full.get("rope_type") == "linear" else None,
        query_pre_attn_scalar=float(cfg.query_pre_attn_scalar),
        final_logit_softcapping=cfg.final_logit_softcapping, **common,
    )


def tensors_from_hf(sd: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """HF `*ForCausalLM` names -> ours: model.X -> backbone.X, the matrices by role."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "model.embed_tokens.weight":
            out[EMBEDDING] = v
        elif k == "lm_head.weight":
            if not tied:
                out[UNEMBEDDING] = v
        elif k.startswith("model."):
            out["backbone." + k.removeprefix("model.")] = v
        else:
            raise CheckpointError(f"tensor {k!r} has no place in a polyhead model")
    return out
