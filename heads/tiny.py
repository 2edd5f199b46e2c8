"""The tiny test model: random Llama weights (~3M parameters) with three nested heads.

Everything is derived deterministically from text the repo carries (heads/data): an 8k
byte-level BPE is trained on the corpus (~240 KB yields about 9k merges, hence 8k), put
into Matryoshka order by corpus frequency, and trimmed to 4k and 1k (boundary-preserving
heads, as the demo's). All heads share one tied matrix; head V reads its first V rows.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import Tokenizer

from heads.checkpoint import save_checkpoint
from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model import MultiHeadModel
from heads.split_table import build_split_table
from heads.tokenizer import vocab_fingerprint
from heads.tokenizer_training import (
    CORPUS_PATH,
    HELDOUT_PATH,
    TINY_SPECIAL_TOKENS,
    read_corpus,
    train_bytelevel_bpe,
)
from heads.trimming import rank_tokens, reorder_tokenizer, trim_tokenizer

log = logging.getLogger(__name__)

# head_dim 32 keeps the model usable by vLLM's CPU attention (it needs head_dim >= 32).
TINY_BACKBONE = BackboneConfig(
    architecture="llama", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
    head_dim=32, intermediate_size=384, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=2048,
)
TINY_HEADS = {"1k": 1024, "4k": 4096, "8k": 8192}
MATRIX = "matrices.shared"
CHATML_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SEED = 0
# Projections at 8x the usual 0.02, so random greedy text varies with context (see random()).
BACKBONE_STD = 0.16


def build_tiny(out: Path) -> Manifest:
    texts = read_corpus(CORPUS_PATH)
    full = train_bytelevel_bpe(texts, max(TINY_HEADS.values()), TINY_SPECIAL_TOKENS)
    if full.get_vocab_size() != max(TINY_HEADS.values()):
        raise RuntimeError(f"corpus too small: trained only {full.get_vocab_size()} tokens")
    ordered, _ = reorder_tokenizer(full, rank_tokens(full, texts))
    heldout = read_corpus(HELDOUT_PATH)
    heldout_bytes = sum(len(t.encode()) for t in heldout)
    # Random weights saw no text; the tokenizer's corpus is the nominal training volume (λ).
    training_bytes = sum(len(t.encode()) for t in texts)
    bos = _special_id(ordered, "<|bos|>")
    eos = tuple(_special_id(ordered, t) for t in ("<|eos|>", "<|im_end|>"))

    heads: list[HeadSpec] = []
    files: dict[str, str | bytes] = {}
    native_v = max(TINY_HEADS.values())
    native_rel = f"tokenizers/{max(TINY_HEADS, key=TINY_HEADS.__getitem__)}.json"
    native_ids = [e.ids for e in ordered.encode_batch(heldout, add_special_tokens=False)]
    for name, v in TINY_HEADS.items():
        # As the demo: smaller heads keep the native segmentation (heads/split_table.py).
        tok = trim_tokenizer(ordered, v)
        rel = f"tokenizers/{name}.json"
        files[rel] = tok.to_str()
        split = None
        if v < native_v:
            table = build_split_table(ordered, v, vocab_fingerprint(ordered))
            split = f"tokenizers/{name}.split.npz"
            files[split] = table.to_bytes()
        n_tokens = sum(len(table.expand(ids)) if split else len(ids) for ids in native_ids)
        heads.append(HeadSpec(
            name=name, vocab_size=v, tokenizer=rel, embedding=MATRIX, unembedding=MATRIX,
            bos_token_id=bos, eos_token_ids=eos, training_bytes=training_bytes,
            bytes_per_token=round(heldout_bytes / n_tokens, 4), bpb=None,
            encoder=native_rel if split else None, split_table=split,
        ))
    manifest = Manifest(model_name="tiny", dtype="float32", backbone=TINY_BACKBONE,
                        heads=tuple(heads), chat_template=CHATML_TEMPLATE)
    model = MultiHeadModel.random(manifest, seed=SEED, backbone_std=BACKBONE_STD)
    save_checkpoint(out, manifest, model.state_dict_for_save(), files)
    log.info("built tiny model in %s", out)
    return manifest


def _special_id(tok: Tokenizer, text: str) -> int:
    tid = tok.token_to_id(text)
    if tid is None:
        raise RuntimeError(f"tokenizer lost its special token {text!r}")
    return int(tid)
