"""Boundary-preserving heads: native segmentation, removed tokens re-spelled in kept ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from heads.build.tiny import TINY_SPECIAL_TOKENS, read_corpus, train_bytelevel_bpe
from heads.data.files import TINY_CORPUS
from heads.errors import TokenizerError
from heads.vocab.split_table import SplitTable, build_split_table
from heads.vocab.tokenizer import HeadTokenizer, vocab_fingerprint
from heads.vocab.trimming import rank_tokens, reorder_tokenizer, trim_tokenizer
from tests.heads.vocab.test_trimming import FALLBACK_BASE, _byte_fallback_tokenizer

TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
SAMPLES = ["The quick brown fox, 1913.\n\nNext paragraph.", "def f(x):\n\treturn x ** 2",
           "naïve café 😀 漢字", "unbelievably", ""]


@pytest.fixture(scope="module")
def bytelevel() -> Tokenizer:
    corpus = read_corpus(TINY_CORPUS)
    tok = train_bytelevel_bpe(corpus, 4096, TINY_SPECIAL_TOKENS)
    return reorder_tokenizer(tok, rank_tokens(tok, corpus))[0]


@pytest.fixture(scope="module")
def fallback() -> Tokenizer:
    corpus = read_corpus(TINY_CORPUS)[:300]
    tok = _byte_fallback_tokenizer(corpus)
    return reorder_tokenizer(tok, rank_tokens(tok, corpus))[0]


_BUILT: dict[tuple[int, int], tuple[HeadTokenizer, HeadTokenizer]] = {}


def _heads(full: Tokenizer, v: int) -> tuple[HeadTokenizer, HeadTokenizer]:
    """(native, split head of size v), built once per tokenizer and size."""
    key = (id(full), v)
    if key not in _BUILT:
        _BUILT[key] = _build(full, v)
    return _BUILT[key]


def _build(full: Tokenizer, v: int) -> tuple[HeadTokenizer, HeadTokenizer]:
    n = full.get_vocab_size()
    native = HeadTokenizer(full, n)
    trimmed = trim_tokenizer(full, v)
    table = build_split_table(full, v, vocab_fingerprint(full), "bpe", trimmed)
    return native, HeadTokenizer(trimmed, v, split=table, encoder=native)


@pytest.mark.parametrize("which", ["bytelevel", "fallback"])
@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_split_heads_round_trip_below_v(request, which: str, text: str) -> None:
    full = request.getfixturevalue(which)
    native, _ = _heads(full, full.get_vocab_size())
    want = native.decode(native.encode(text))
    for v in (FALLBACK_BASE if which == "fallback" else 300, 500):
        _, head = _heads(full, v)
        ids = head.encode(text)
        assert all(i < v for i in ids)
        assert head.decode(ids) == want
        assert head.encode_batch([text, text]) == [ids, ids]


@pytest.mark.parametrize("which", ["bytelevel", "fallback"])
def test_every_native_boundary_is_kept(request, which: str) -> None:
    full = request.getfixturevalue(which)
    native, head = _heads(full, 400)
    for text in SAMPLES:
        nat = native.encode(text)
        ids = head.encode(text)
        src = head.split.sources(nat)
        # The pieces of each native token decode to that token: no boundary moved.
        for j, t in enumerate(nat):
            pieces = [ids[k] for k in np.flatnonzero(src == j)]
            assert native.decode(pieces) == native.decode([t]) or t >= 400 and any(
                full.id_to_token(p).startswith("<0x") for p in pieces)
        assert [t for t in nat if t < 400] == [ids[k] for k, j in enumerate(src) if nat[j] < 400]


def test_bpe_spelling_is_the_trimmed_bpe_of_the_token_alone(fallback: Tokenizer) -> None:
    v = 300
    trimmed = trim_tokenizer(fallback, v)
    table = build_split_table(fallback, v, "x", "bpe", trimmed)
    for t in range(v, fallback.get_vocab_size()):
        text = fallback.decode([t])
        pieces = table.pieces[table.offsets[t]:table.offsets[t + 1]].tolist()
        assert pieces == trimmed.encode(text, add_special_tokens=False).ids
    with pytest.raises(ValueError, match="needs the head's trimmed tokenizer"):
        build_split_table(fallback, v, "x", "bpe")


def test_split_uses_fewest_pieces(bytelevel: Tokenizer) -> None:
    v = 400
    table = build_split_table(bytelevel, v, "x", "fewest")
    trimmed = trim_tokenizer(bytelevel, v)
    vocab = {i: t for t, i in bytelevel.get_vocab().items()}
    for t in range(v, bytelevel.get_vocab_size(), 37):
        pieces = table.pieces[table.offsets[t]:table.offsets[t + 1]].tolist()
        assert "".join(vocab[p] for p in pieces) == vocab[t]
        # Never more pieces than merge filtering spells the same text in.
        text = bytelevel.decode([t])
        assert len(pieces) <= len(trimmed.encode(text, add_special_tokens=False).ids)


def test_unspellable_chars_become_byte_tokens(fallback: Tokenizer) -> None:
    _, head = _heads(fallback, FALLBACK_BASE)
    assert [head.id_to_token(i) for i in head.encode("😀")] == [
        "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


def test_table_round_trips_through_bytes_and_rejects_mismatch(bytelevel: Tokenizer,
                                                              tmp_path) -> None:
    table = build_split_table(bytelevel, 500, vocab_fingerprint(bytelevel), "fewest")
    path = tmp_path / "t.split.npz"
    path.write_bytes(table.to_bytes())
    loaded = SplitTable.load(path)
    assert np.array_equal(loaded.offsets, table.offsets) and loaded.vocab_size == 500
    native = HeadTokenizer(bytelevel, bytelevel.get_vocab_size())
    with pytest.raises(TokenizerError, match="split table maps"):
        HeadTokenizer(trim_tokenizer(bytelevel, 400), 400, split=loaded, encoder=native)
    path.write_bytes(b"not a table")
    with pytest.raises(TokenizerError, match="not a split table"):
        SplitTable.load(path)
