from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

from heads.build.tiny import TINY_SPECIAL_TOKENS, read_corpus, train_bytelevel_bpe
from heads.data.files import TINY_CORPUS, TINY_HELDOUT
from heads.errors import TokenizerError

ROOT = Path(__file__).resolve().parents[3]
# Python strs with lone surrogates have no UTF-8 form; HeadTokenizer rejects them.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)))


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return read_corpus(TINY_CORPUS)


@pytest.fixture(scope="module")
def tok(corpus: list[str]) -> Tokenizer:
    return train_bytelevel_bpe(corpus, 16384, TINY_SPECIAL_TOKENS)


def test_corpus_files_are_carried_and_disjoint(corpus: list[str]) -> None:
    held = read_corpus(TINY_HELDOUT)
    assert 150_000 < TINY_CORPUS.stat().st_size < 300_000
    assert 0.05 < TINY_HELDOUT.stat().st_size / TINY_CORPUS.stat().st_size < 0.2
    assert not set(held) & set(corpus)
    assert TINY_CORPUS.read_text().startswith("# Text extracted from Python 3.11")
    assert not any(p.startswith("#") for p in corpus)


def test_specials_then_all_byte_symbols(tok: Tokenizer) -> None:
    assert [tok.id_to_token(i) for i in range(5)] == TINY_SPECIAL_TOKENS
    vocab = tok.get_vocab()
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(vocab)
    # The corpus saturates below 16384: every word becomes one token (see heads/build/tiny.py).
    assert 8000 < tok.get_vocab_size() <= 16384


def test_deterministic_in_process(corpus: list[str], tok: Tokenizer) -> None:
    again = train_bytelevel_bpe(corpus, 16384, TINY_SPECIAL_TOKENS)
    assert again.to_str() == tok.to_str()


def test_deterministic_across_processes_and_thread_counts(tok: Tokenizer) -> None:
    script = (
        "import hashlib\n"
        "from heads.build.tiny import TINY_SPECIAL_TOKENS, read_corpus, train_bytelevel_bpe\n"
        "from heads.data.files import TINY_CORPUS\n"
        "t = train_bytelevel_bpe(read_corpus(TINY_CORPUS), 16384, TINY_SPECIAL_TOKENS)\n"
        "print(hashlib.sha256(t.to_str().encode()).hexdigest())\n"
    )
    want = hashlib.sha256(tok.to_str().encode()).hexdigest()
    for threads in ("1", "4"):
        env = {**os.environ, "RAYON_NUM_THREADS": threads, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_round_trips_any_text(tok: Tokenizer, text: str) -> None:
    # Special-token text in `text` encodes as the special, so decode must not skip it.
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_round_trips_emoji_cjk_and_controls(tok: Tokenizer) -> None:
    text = "naïve 😀👨‍👩‍👧 世界 \x00\x01\x7f\u200b\r\n\t end"
    assert tok.decode(tok.encode(text).ids) == text


def test_too_small_vocab_is_rejected(corpus: list[str]) -> None:
    with pytest.raises(TokenizerError, match="cannot hold"):
        train_bytelevel_bpe(corpus[:10], 200, TINY_SPECIAL_TOKENS)


def test_unreadable_corpus_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="missing.txt"):
        read_corpus(tmp_path / "missing.txt")
