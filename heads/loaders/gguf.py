"""Load a GGUF file (llama or gemma3 architecture), dequantized, as a `LoadedSource`.

Why not `AutoModelForCausalLM.from_pretrained(gguf_file=...)`: for Gemma-3-270M on the 2-core
box, config + model + tokenizer took ~100 s and 3.3 GB (each re-parses the 262k-token metadata
and the model is randomly initialised first). Here `gguf.GGUFReader` parses the file once
(transformers' newer fast reader rejects this file's Q5_0 tensors), the `gguf` package
dequantizes, and transformers' GGUF tokenizer converter builds the tokenizer: ~15 s to a
LoadedSource, ~20 s with the checkpoint written. Checked against transformers' own GGUF load,
weight for weight and greedy token for token, in tests/heads/model/test_gemma3_real.py.

llama.cpp's converter changes two things that are undone here: Llama q/k rows are permuted
for its interleaved RoPE, and Gemma norm weights are stored as 1 + w.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from tqdm.auto import tqdm
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    convert_gguf_tokenizer,
    get_gguf_tokenizer,
)
from transformers.integrations.gguf.reader import read_gguf_metadata

from heads.errors import CheckpointError
from heads.loaders.gguf_int_groups import int_groups
from heads.loaders.source import (
    EMBEDDING,
    TORCH_DTYPES,
    UNEMBEDDING,
    LoadedSource,
    special_ids,
)
from heads.manifest import BackboneConfig
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

SUPPORTED = ("llama", "gemma3")
GEMMA3_SLIDING_PATTERN = 6  # every 6th layer is global, as llama.cpp and transformers assume
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def load_gguf(path: Path, dtype: str = "bfloat16", progress: bool = True) -> LoadedSource:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist")
    try:
        meta, _ = read_gguf_metadata(str(path))  # plain values, without the token arrays
        reader = GGUFReader(path)  # the tensor table; gguf knows every ggml type
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from e
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} not in {SUPPORTED}")
    backbone = _backbone(meta, arch)
    tensors, int8 = _tensors(reader, backbone, TORCH_DTYPES[dtype], progress)
    embedding_rows = tensors[EMBEDDING].shape[0]

    tok_arch, tok_dict, tok_config = get_gguf_tokenizer(str(path))
    tokenizer, _ = convert_gguf_tokenizer(tok_arch, tok_dict)
    if tokenizer.get_vocab_size() > embedding_rows:
        raise CheckpointError(
            f"{path}: tokenizer has {tokenizer.get_vocab_size()} tokens, matrix {embedding_rows}"
        )
    bos, eos = special_ids(
        tokenizer, meta.get("tokenizer.ggml.bos_token_id"),
        [meta["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in meta else [],
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )
    name = str(meta.get("general.name") or path.stem)
    return LoadedSource(
        model_name=_safe_name(name), backbone=backbone, dtype=dtype, tensors=tensors,
        embedding=EMBEDDING, unembedding=UNEMBEDDING if UNEMBEDDING in tensors else EMBEDDING,
        tokenizer_json=tokenizer.to_str(), bos_token_id=bos, eos_token_ids=eos,
        chat_template=tok_config.get("chat_template") or meta.get("tokenizer.chat_template"),
        origin=f"gguf:{path.name}",
        extra={"gguf_file_type": meta.get("general.file_type")}, int8=int8,
    )


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name.strip()).strip("-").lower() or "model"


def _backbone(meta: dict[str, Any], arch: str) -> BackboneConfig:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(f"GGUF metadata {arch}.{key}: missing")
        return value

    d, n_layers, n_heads = get("embedding_length"), get("block_count"), get("attention.head_count")
    head_dim = get("attention.key_length", d // n_heads)
    common = dict(
        hidden_size=d, num_layers=n_layers, num_heads=n_heads,
        num_kv_heads=get("attention.head_count_kv", n_heads), head_dim=head_dim,
        intermediate_size=get("feed_forward_length"),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=get("context_length"),
    )
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if arch == "llama":
        if scaling not in ("none", None):
            raise CheckpointError(f"GGUF rope scaling {scaling!r} is not supported for llama")
        return BackboneConfig(architecture="llama", rope_theta=float(get("rope.freq_base", 1e4)),
                              **common)
    if scaling not in ("none", "linear", None):
        raise CheckpointError(f"GGUF rope scaling {scaling!r} is not supported for gemma3")
    factor = float(get("rope.scaling.factor")) if scaling == "linear" else None
    window = get("attention.sliding_window")
    return BackboneConfig(
        architecture="gemma3", rope_theta=float(get("rope.freq_base", 1e6)),
        sliding_window=window,
        layer_types=tuple(
            "full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention"
            for i in range(n_layers)
        ),
        rope_local_theta=float(get("rope.freq_base_swa", 1e4)), rope_linear_factor=factor,
        query_pre_attn_scalar=float(head_dim), **common,
    )


def _our_name(gguf_name: str, arch: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return EMBEDDING
    if gguf_name == "output.weight":
        return UNEMBEDDING
    if gguf_name == "output_norm.weight":
        return "backbone.norm.weight"
    m = _LAYER.fullmatch(gguf_name)
    if m is None:
        return None
    part = m.group(2)
    if part == "ffn_norm":  # before the MLP: Llama's second norm, Gemma's third of four
        ours = "post_attention_layernorm" if arch == "llama" else "pre_feedforward_layernorm"
    elif part in _BLOCK_NAMES:
        ours = _BLOCK_NAMES[part]
    else:
        return None
    return f"backbone.layers.{m.group(1)}.{ours}.weight"


def _tensors(
    reader: GGUFReader, cfg: BackboneConfig, dtype: torch.dtype, progress: bool
) -> tuple[dict[str, torch.Tensor], dict[str, IntGroups]]:
    """Every tensor dequantised to `dtype`, and beside them the file's own values as int8
    groups for the block types that have that form (heads.loaders.gguf_int_groups)."""
    out: dict[str, torch.Tensor] = {}
    int8: dict[str, IntGroups] = {}
    for t in tqdm(reader.tensors, desc="dequantizing", unit="tensor", disable=not progress):
        ours = _our_name(t.name, cfg.architecture)
        if ours is None:
            raise CheckpointError(f"GGUF tensor {t.name!r} has no place in a polyhead model")
        if t.tensor_type == GGMLQuantizationType.BF16:  # numpy has no bf16: raw uint16 bits
            w = torch.from_numpy(t.data.copy()).view(torch.bfloat16).float()
        else:  # t.data: [rows, bytes per row] for blocks, values for F32/F16 -> [rows, cols]
            arr = dequantize(t.data, t.tensor_type)
            if arr.dtype != np.float32 or not arr.flags.writeable:  # F32 is a view of the mmap
                arr = np.array(arr, dtype=np.float32)
            w = torch.from_numpy(arr)
            groups = int_groups(t.data, t.tensor_type, arr) if arr.ndim == 2 else None
            if groups is not None:
                int8[ours] = groups
        rope_heads = (cfg.num_heads if ".self_attn.q_proj." in ours else
                  cfg.num_kv_heads if ".self_attn.k_proj." in ours else 0)
        if cfg.architecture == "llama" and rope_heads:
            w = _unpermute(w, rope_heads)
            if ours in int8:
                int8[ours] = int8[ours].map_rows(functools.partial(_unpermute, n_heads=rope_heads))
        elif cfg.architecture == "gemma3" and ours.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's (1 + w)
        out[ours] = w.to(dtype)
    if EMBEDDING not in out:
        raise CheckpointError("GGUF file has no token_embd.weight tensor")
    return out, int8


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    # [n_heads * Dh, d]: llama.cpp interleaves the two RoPE halves of each head; undo it
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
