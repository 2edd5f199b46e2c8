"""A pretrained model as the loaders hand it over, and its single-head polyhead checkpoint.

Every loader (GGUF, Hugging Face, our own format) produces a `LoadedSource`: the backbone
config, backbone tensors under `backbone.<key>` (keys of heads/model/llama.py or
heads/model/gemma3.py), the native vocabulary's embedding/unembedding matrices, and the
tokenizer as tokenizers JSON.
Head building (vocabulary trimming) consumes the same object.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from heads.errors import CheckpointError
from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model.multi_head import BACKBONE_PREFIX, build_backbone
from heads.model.weights import save_checkpoint
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

EMBEDDING = "matrices.shared"  # also the unembedding when the model ties them
UNEMBEDDING = "matrices.unembedding"  # only for untied models
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Chat-turn terminators that end generation as well as the model's own EOS, where present.
TURN_END_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>")


@dataclass(frozen=True)
class LoadedSource:
    model_name: str
    backbone: BackboneConfig
    dtype: str  # manifest dtype name; every tensor below is in it
    tensors: dict[str, torch.Tensor]  # backbone.* plus the matrices named below, [V, d]
    embedding: str
    unembedding: str  # == embedding when tied
    tokenizer_json: str
    bos_token_id: int | None  # None: the model is trained without a BOS
    eos_token_ids: tuple[int, ...]
    chat_template: str | None
    origin: str  # where it was loaded from, for the manifest's `extra`
    extra: dict[str, Any] = field(default_factory=dict)
    # The file's own quantised values of the tensors that have an integer-group form, by name
    # (GGUF; kernels.int_groups): kept beside the dequantised `tensors`.
    int8: dict[str, IntGroups] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return int(self.tensors[self.embedding].shape[0])

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_str(self.tokenizer_json)


def head_name_for(vocab_size: int) -> str:
    """262144 -> "262k", 49152 -> "49k", 32768 -> "32k" (thousands, rounded down)."""
    return f"{vocab_size // 1000}k" if vocab_size >= 1000 else str(vocab_size)


def check_backbone_tensors(backbone: BackboneConfig, tensors: dict[str, torch.Tensor]) -> None:
    """Names and shapes against the backbone the engine will build, before anything is written."""
    manifest_like = Manifest("check", "float32", backbone, ())
    with torch.device("meta"):
        expected = build_backbone(manifest_like).state_dict()
    have = {k.removeprefix(BACKBONE_PREFIX): v for k, v in tensors.items()
            if k.startswith(BACKBONE_PREFIX)}
    missing = sorted(set(expected) - set(have))
    extra = sorted(set(have) - set(expected))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise CheckpointError(f"source backbone tensors: {what}")
    for k, v in have.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise CheckpointError(
                f"source tensor {k}: shape {tuple(v.shape)}, expected {tuple(expected[k].shape)}"
            )


def special_ids(
    tok: Tokenizer, bos: int | None, eos: list[int], add_bos: bool
) -> tuple[int | None, tuple[int, ...]]:
    """BOS only when the model prepends it (Gemma does; SmolLM2 does not); EOS plus turn ends."""
    ids = list(dict.fromkeys(eos))
    for text in TURN_END_TOKENS:
        tid = tok.token_to_id(text)
        if tid is not None and tid not in ids:
            ids.append(tid)
    if not ids:
        raise CheckpointError("source tokenizer: no EOS token")
    return (bos if add_bos else None), tuple(ids)


def write_checkpoint(
    src: LoadedSource, out: Path, training_bytes: int = 0, extra: dict[str, Any] | None = None
) -> Manifest:
    """One head over the native vocabulary, named by its size; written atomically."""
    v = src.vocab_size
    rel = f"tokenizers/{head_name_for(v)}.json"
    head = HeadSpec(
        name=head_name_for(v), vocab_size=v, tokenizer=rel, embedding=src.embedding,
        unembedding=src.unembedding, bos_token_id=src.bos_token_id,
        eos_token_ids=src.eos_token_ids, training_bytes=training_bytes,
    )
    manifest = Manifest(
        model_name=src.model_name, dtype=src.dtype, backbone=src.backbone, heads=(head,),
        chat_template=src.chat_template,
        extra={"source": src.origin, **src.extra, **(extra or {})},
    )
    check_backbone_tensors(src.backbone, src.tensors)
    save_checkpoint(out, manifest, src.tensors, {rel: src.tokenizer_json}, src.int8)
    log.info("wrote %s (%s, V=%d) to %s", src.model_name, src.backbone.architecture, v, out)
    return manifest
