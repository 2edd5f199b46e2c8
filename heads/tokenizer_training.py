"""Train a GPT-2 style byte-level BPE tokenizer for the tiny model.

The 256 byte symbols are always in the vocabulary, so every string round-trips.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from heads.errors import TokenizerError

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent / "data"
CORPUS_PATH = DATA_DIR / "tiny_corpus.txt"
HELDOUT_PATH = DATA_DIR / "tiny_heldout.txt"

# Ids 0..4 in this order; the tiny model's config and chat template rely on it.
TINY_SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


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
    single-thread setting (tests/heads/test_tokenizer_training.py checks two runs).
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
