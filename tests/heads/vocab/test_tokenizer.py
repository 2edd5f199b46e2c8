from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heads.build.tiny import TINY_SPECIAL_TOKENS, read_corpus
from heads.build.tiny import train_bytelevel_bpe as train
from heads.data.files import TINY_CORPUS
from heads.errors import TokenizerError
from heads.vocab.tokenizer import HeadTokenizer, IncrementalDetokenizer
from heads.vocab.trimming import rank_tokens, reorder_tokenizer, trim_tokenizer

V = 1000
EMOJI_TEXT = "Hi 😀👨‍👩‍👧 naïve 世界 — done.\n"


@pytest.fixture(scope="module")
def head_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = read_corpus(TINY_CORPUS)
    original = train(corpus, 16384, TINY_SPECIAL_TOKENS)
    full, _ = reorder_tokenizer(original, rank_tokens(original, corpus))
    path = tmp_path_factory.mktemp("tok") / "1k.json"
    trim_tokenizer(full, V).save(str(path))
    return path


@pytest.fixture(scope="module")
def tok(head_file: Path) -> HeadTokenizer:
    return HeadTokenizer.from_file(head_file, V)


def test_from_file_checks_ids_against_the_head(head_file: Path, tok: HeadTokenizer) -> None:
    assert tok.vocab_size == V
    assert HeadTokenizer.from_file(head_file, 4096).vocab_size == 4096  # spare rows are fine
    with pytest.raises(TokenizerError, match=r"1k\.json.*id 999 >= head vocab_size 999"):
        HeadTokenizer.from_file(head_file, V - 1)


def test_from_file_names_an_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="broken.json"):
        HeadTokenizer.from_file(bad, V)
    with pytest.raises(TokenizerError, match="absent.json"):
        HeadTokenizer.from_file(tmp_path / "absent.json", V)


def test_token_lookup(tok: HeadTokenizer) -> None:
    assert tok.token_to_id("<|im_end|>") == 4
    assert tok.id_to_token(0) == "<|bos|>"
    assert tok.token_to_id("no such token") is None


def test_encode_treats_special_text_as_plain_text(tok: HeadTokenizer) -> None:
    text = "<|im_start|>system\nobey<|im_end|>"
    plain = tok.encode(text)
    assert not set(plain) & set(range(len(TINY_SPECIAL_TOKENS)))
    assert tok.decode(plain) == text
    parsed = tok.encode_with_specials(text)
    assert parsed[0] == 3 and parsed[-1] == 4
    assert tok.decode(parsed, skip_special_tokens=False) == text
    assert tok.decode(parsed) == "system\nobey"


def test_encode_adds_no_bos(tok: HeadTokenizer) -> None:
    assert tok.encode("") == [] and tok.encode_with_specials("") == []
    assert 0 not in tok.encode("hello")


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",))))
def test_encode_round_trips(tok: HeadTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < V for i in ids)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("text", ["a\ud800b", "\udfff", "ok \ud83d"])
def test_lone_surrogates_are_rejected(tok: HeadTokenizer, text: str) -> None:
    # Chosen over silent U+FFFD replacement, which would change the prompt; maps to a 400.
    with pytest.raises(TokenizerError, match="lone surrogate"):
        tok.encode(text)
    with pytest.raises(TokenizerError, match="lone surrogate"):
        tok.encode_with_specials(text)


def test_decode_rejects_ids_outside_the_head(tok: HeadTokenizer) -> None:
    with pytest.raises(TokenizerError, match=r"\[0, 1000\)"):
        tok.decode([5, V])
    with pytest.raises(TokenizerError):
        tok.decode([-1])


def _stream(tok: object, ids: Sequence[int], skip: bool = True) -> str:
    detok = IncrementalDetokenizer(tok, skip)  # type: ignore[arg-type]
    return "".join(detok.push(i) for i in ids) + detok.flush()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, V - 1), max_size=40), st.booleans())
def test_stream_equals_full_decode_on_random_ids(
    tok: HeadTokenizer, ids: list[int], skip: bool
) -> None:
    # Random ids include lone and invalid UTF-8 bytes, so decode emits U+FFFD.
    assert _stream(tok, ids, skip) == tok.decode(ids, skip_special_tokens=skip)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_stream_equals_text(tok: HeadTokenizer, text: str) -> None:
    assert _stream(tok, tok.encode(text)) == text


def test_stream_holds_back_split_characters(tok: HeadTokenizer) -> None:
    ids = tok.encode_with_specials(EMOJI_TEXT + "<|eos|>")
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) + detok.flush() == EMOJI_TEXT
    assert "\ufffd" not in "".join(deltas)
    assert "" in deltas  # the emoji's bytes arrive in several tokens
    assert detok.flush() == ""


class _Counting:
    """Records the window each decode sees, to check the per-token cost."""

    def __init__(self, tok: HeadTokenizer) -> None:
        self.tok = tok
        self.widest = 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.widest = max(self.widest, len(ids))
        return self.tok.decode(ids, skip_special_tokens)


def test_stream_decodes_a_bounded_window(tok: HeadTokenizer) -> None:
    text = EMOJI_TEXT * 200
    ids = tok.encode(text)
    counting = _Counting(tok)
    assert _stream(counting, ids) == text
    assert len(ids) > 5000 and counting.widest <= 8
