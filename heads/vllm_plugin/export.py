"""`polyhead export vllm`: write a polyhead checkpoint as a model directory vLLM can load.

The directory holds
- `config.json`: the backbone as a Hugging Face config (`gemma3_text` or `llama`), with
  `architectures = ["PolyheadForCausalLM"]` (the plugin in heads/vllm_plugin),
  `vocab_size = ΣV_h` and the head layout (sizes, offsets, matrices) under `polyhead`;
- `model.safetensors`: the backbone as `model.<HF name>`, the first head matrix as
  `model.embed_tokens.weight` (so vLLM's own decoder owns it) and any further matrices as
  `head_matrices.<i>`; nested heads still share one matrix, nothing is duplicated, except
  that a low-rank adapted head gets its own folded rows W + A B (fp32) as a further matrix;
  adapted heads also carry `head_biases.<h>` and, for a hidden adapter, `head_down.<h>` and
  `head_up.<h>` (h: the head's index);
- `generation_config.json`: every head's EOS IDs, offset, so vLLM stops on each of them.

The tokenizers stay with the gateway: the engine receives and returns token IDs only.

`export_vllm_per_head` writes the fallback layout instead: one standard model directory per
head (stock `Gemma3ForCausalLM`/`LlamaForCausalLM`, no plugin), each with its own copy of the
backbone and of its rows, for one stock vLLM engine per head.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from heads.checkpoint import validate_checkpoint
from heads.errors import CheckpointError
from heads.manifest import (
    BIAS,
    HIDDEN_DOWN,
    HIDDEN_UP,
    LOWRANK_A,
    LOWRANK_B,
    BackboneConfig,
    HeadSpec,
    Manifest,
    folded_rows_name,
)
from heads.model.adapter import fold_lowrank
from heads.model.multi_head import BACKBONE_PREFIX
from heads.model.weights import load_adapter_tensors
from heads.vllm_plugin.layout import (
    ARCHITECTURE,
    BIAS_PREFIX,
    CONFIG_KEY,
    DOWN_PREFIX,
    UP_PREFIX,
    VocabLayout,
)

log = logging.getLogger(__name__)

EXTRA_MATRIX_PREFIX = "head_matrices."


def hf_backbone_config(b: BackboneConfig) -> dict[str, Any]:
    """The backbone as transformers' own config class writes it (rope layout included)."""
    from transformers import Gemma3TextConfig, LlamaConfig

    common: dict[str, Any] = dict(
        hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
        num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, head_dim=b.head_dim, rms_norm_eps=b.rms_norm_eps,
        max_position_embeddings=b.max_position_embeddings, tie_word_embeddings=False,
    )
    if b.architecture == "llama":
        return LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": b.rope_theta},
        ).to_dict()
    if b.architecture == "gemma3":
        full: dict[str, Any] = {"rope_type": "default", "rope_theta": b.rope_theta}
        if b.rope_linear_factor:
            full = {"rope_type": "linear", "factor": b.rope_linear_factor,
                    "rope_theta": b.rope_theta}
        local = {"rope_type": "default", "rope_theta": b.rope_local_theta or b.rope_theta}
        layer_types = list(b.layer_types) or ["full_attention"] * b.num_layers
        return Gemma3TextConfig(
            **common, rope_parameters={"full_attention": full, "sliding_attention": local},
            sliding_window=b.sliding_window or b.max_position_embeddings,
            layer_types=layer_types,
            query_pre_attn_scalar=int(b.query_pre_attn_scalar or b.head_dim),
            final_logit_softcapping=b.final_logit_softcapping,
        ).to_dict()
    raise CheckpointError(f"backbone.architecture: {b.architecture!r} has no vLLM export")


def export_config(manifest: Manifest, layout: VocabLayout) -> dict[str, Any]:
    config = hf_backbone_config(manifest.backbone)
    config.update(
        architectures=[ARCHITECTURE], vocab_size=layout.total_vocab, dtype=manifest.dtype,
        bos_token_id=None, eos_token_id=layout.all_eos(), pad_token_id=None,
    )
    config[CONFIG_KEY] = layout.to_json()
    return config


def export_vllm(checkpoint: Path, out: Path) -> VocabLayout:
    manifest = validate_checkpoint(checkpoint)
    layout = VocabLayout.from_manifest(manifest)
    tensors = load_file(str(checkpoint / manifest.weights))
    tensors.update(load_adapter_tensors(checkpoint, manifest))
    weights = {
        "model." + k.removeprefix(BACKBONE_PREFIX): v
        for k, v in tensors.items() if k.startswith(BACKBONE_PREFIX)
    }
    folded = _fold_adapters(manifest, tensors)
    for i, (name, rows) in enumerate(layout.matrices):
        # Only the rows some head reads; contiguous so safetensors can write it.
        matrix = folded[name] if name in folded else tensors[name][:rows].contiguous()
        weights["model.embed_tokens.weight" if i == 0 else f"{EXTRA_MATRIX_PREFIX}{i}"] = matrix
    weights.update(_adapter_weights(manifest, tensors))
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(export_config(manifest, layout), indent=2))
    _write_generation_config(out, layout.all_eos())
    log.info("exported %s for vLLM: %d heads, vocab %d, to %s", manifest.model_name,
             len(layout.heads), layout.total_vocab, out)
    return layout


def _fold_adapters(manifest: Manifest, tensors: dict[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """Folded-rows matrix name -> W + A B [V, d] of each low-rank adapted head, in fp32:
    vLLM rounds it once to its dtype, as the local engine's own fold does."""
    out = {}
    for h in manifest.heads:
        a = h.adapter
        if a is not None and a.kind == "lowrank":
            rows = tensors[h.unembedding][: h.vocab_size]
            out[folded_rows_name(a)] = fold_lowrank(
                rows, tensors[a.prefix + LOWRANK_A], tensors[a.prefix + LOWRANK_B],
                torch.float32)
    return out


def _adapter_weights(manifest: Manifest, tensors: dict[str, torch.Tensor]
                     ) -> dict[str, torch.Tensor]:
    """Per adapted head (index i in manifest order): `head_biases.<i>` [V_h] and, for a
    hidden adapter, `head_down.<i>` [r, d] and `head_up.<i>` [d, r]."""
    out = {}
    for i, h in enumerate(manifest.heads):
        a = h.adapter
        if a is None:
            continue
        out[f"{BIAS_PREFIX}{i}"] = tensors[a.prefix + BIAS].contiguous()
        if a.kind == "hidden":
            out[f"{DOWN_PREFIX}{i}"] = tensors[a.prefix + HIDDEN_DOWN].contiguous()
            out[f"{UP_PREFIX}{i}"] = tensors[a.prefix + HIDDEN_UP].contiguous()
    return out


def _write_generation_config(out: Path, eos: list[int]) -> None:
    gen = {"eos_token_id": eos, "_from_model_config": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def _write_tokenizer(src: Path, out: Path, head: HeadSpec, chat_template: str | None) -> None:
    """The head's tokenizer as stock vLLM reads it: `tokenizer.json` whose post-processor
    prepends the head's BOS (the gateway prepends it to every prompt, and Gemma-style models
    continue badly without it), and a `tokenizer_config.json` naming BOS and EOS (and the
    model's chat template, where the checkpoint has one)."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(src))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "eos_token": tok.id_to_token(head.eos_token_ids[0]),
                              "add_bos_token": head.bos_token_id is not None,
                              "add_eos_token": False, "clean_up_tokenization_spaces": False}
    if head.bos_token_id is not None:
        bos = tok.id_to_token(head.bos_token_id)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, head.bos_token_id)])
        config["bos_token"] = bos
    if chat_template:
        config["chat_template"] = chat_template
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def export_vllm_per_head(checkpoint: Path, out: Path) -> dict[str, Path]:
    """The fallback: head name -> a stock model directory holding only that head."""
    manifest = validate_checkpoint(checkpoint)
    tensors = load_file(str(checkpoint / manifest.weights))
    backbone = {"model." + k.removeprefix(BACKBONE_PREFIX): v
                for k, v in tensors.items() if k.startswith(BACKBONE_PREFIX)}
    arch = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}
    dirs = {}
    for h in manifest.heads:
        if h.adapter is not None:
            raise CheckpointError(f"head {h.name!r} is adapted; a stock model has no place for "
                                  "its adapter (use the multi-head export)")
        tied = h.embedding == h.unembedding
        weights = dict(backbone)
        weights["model.embed_tokens.weight"] = tensors[h.embedding][: h.vocab_size].contiguous()
        if not tied:
            weights["lm_head.weight"] = tensors[h.unembedding][: h.vocab_size].contiguous()
        config = hf_backbone_config(manifest.backbone)
        config.update(architectures=[arch[manifest.backbone.architecture]],
                      vocab_size=h.vocab_size, dtype=manifest.dtype, tie_word_embeddings=tied,
                      bos_token_id=h.bos_token_id, eos_token_id=list(h.eos_token_ids))
        d = out / h.name
        d.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps(config, indent=2))
        _write_generation_config(d, list(h.eos_token_ids))
        _write_tokenizer(checkpoint / h.tokenizer, d, h, manifest.chat_template)
        dirs[h.name] = d
    log.info("exported %d single-head vLLM models under %s", len(dirs), out)
    return dirs
