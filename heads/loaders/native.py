"""Our own checkpoint format as a `LoadedSource`: one head's vocabulary, rows [0, V)."""

from __future__ import annotations

import logging
from pathlib import Path

from heads.loaders.source import EMBEDDING, UNEMBEDDING, LoadedSource
from heads.model.weights import load_checkpoint

log = logging.getLogger(__name__)


def load_native(directory: Path, head: str | None = None) -> LoadedSource:
    """`head` defaults to the largest one (the native vocabulary of a trimmed model)."""
    ckpt = load_checkpoint(Path(directory))
    m = ckpt.manifest
    spec = m.head(head) if head else max(m.heads, key=lambda h: h.vocab_size)
    saved = ckpt.model.state_dict_for_save()
    tensors = {k: v for k, v in saved.items() if k.startswith("backbone.")}
    tensors[EMBEDDING] = saved[spec.embedding][: spec.vocab_size]
    tied = spec.embedding == spec.unembedding
    if not tied:
        tensors[UNEMBEDDING] = saved[spec.unembedding][: spec.vocab_size]
    return LoadedSource(
        model_name=m.model_name, backbone=m.backbone, dtype=m.dtype, tensors=tensors,
        embedding=EMBEDDING, unembedding=EMBEDDING if tied else UNEMBEDDING,
        tokenizer_json=ckpt.tokenizers[spec.name].tokenizer.to_str(),
        bos_token_id=spec.bos_token_id, eos_token_ids=spec.eos_token_ids,
        chat_template=m.chat_template, origin=f"polyhead:{directory}:{spec.name}",
        extra=dict(m.extra),
    )
