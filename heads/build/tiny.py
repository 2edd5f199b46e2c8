"""The tiny test model: random Llama weights (~3M parameters) with three nested heads.

Everything is derived deterministically from text the repo carries (heads/data): an 8k
byte-level BPE (GPT-2 style: the 256 byte symbols are always in the vocabulary, so every
string round-trips) is trained on the corpus (~240 KB yields about 9k merges, hence 8k), put
into Matryoshka order by corpus frequency, and trimmed to 4k and 1k (boundary-preserving
heads, as the demo's). All heads share one tied matrix; head V reads its first V rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from heads.data.files import TINY_CORPUS, TINY_HELDOUT
from heads.errors import TokenizerError
from heads.manifest import BackboneConfig, HeadSpec, Manifest
from heads.model.multi_head import MultiHeadModel
from heads.model.weights import save_checkpoint
from heads.vocab.split_table import build_split_table
from heads.vocab.tokenizer import vocab_fingerprint
from heads.vocab.trimming import rank_tokens, reorder_tokenizer, trim_tokenizer

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
# Ids 0..4 in this order; the tiny model's config and chat template rely on it.
TINY_SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
SEED = 0
# Projections at 8x the usual 0.02, so random greedy text varies with context (see random()).
BACKBONE_STD = 0.16


def build_tiny(out: Path) -> Manifest:
    texts = read_corpus(TINY_CORPUS)
    full = train_bytelevel_bpe(texts, max(TINY_HEADS.values()), TINY_SPECIAL_TOKENS)
    if full.get_vocab_size() != max(TINY_HEADS.values()):
        raise RuntimeError(f"corpus too small: trained only {full.get_vocab_size()} tokens")
    ordered, _ = reorder_tokenizer(full, rank_tokens(full, texts))
    heldout = read_corpus(TINY_HELDOUT)
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
        # As the demo: smaller heads keep the native segmentation (heads/vocab/split_table.py).
        tok = trim_tokenizer(ordered, v)
        rel = f"tokenizers/{name}.json"
        files[rel] = tok.to_str()
        split = None
        if v < native_v:
            table = build_split_table(ordered, v, vocab_fingerprint(ordered), "bpe", tok)
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


def read_corpus(path: Path) -> list[str]:
    """Paragraphs of a corpus file; `#` lines (the attribution header) are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read corpus: {e}") from e
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return [p.strip() for p in body.split("\n\n") if p.strip()]


def train_bytelevel_bpe(
    texts: Iterable[str], vocab_size: int, special_tokens: list[str]
) -> Tokenizer:
    """Deterministic: the same texts give a byte-identical `to_str()`.

    The trainer breaks count ties by pair order, not by thread scheduling, so it needs no
    single-thread setting (tests/heads/build/test_tiny.py checks two runs).
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(special_tokens) + len(alphabet):
        raise TokenizerError(
            f"vocab_size {vocab_size} cannot hold {len(special_tokens)} specials "
            f"and the {len(alphabet)} byte symbols"
        )
    tok = Tokenizer(models.BPE())
    # No normalizer: any normalization would break decode(encode(x)) == x.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        # Sorted so the alphabet's ids do not depend on set iteration order.
        initial_alphabet=sorted(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    got = tok.get_vocab_size()
    if got < vocab_size:
        # Merges stop once every pre-token (GPT-2 regex: about a word) is a single token; the
        # ~240 KB tiny corpus saturates near 9.1k tokens. Callers size heads by get_vocab_size().
        log.warning("corpus saturates at %d tokens, fewer than the %d asked", got, vocab_size)
    else:
        log.info("trained byte-level BPE with %d tokens", got)
    return tok
