from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from heads.build.tiny import TINY_SPECIAL_TOKENS, read_corpus, train_bytelevel_bpe
from heads.data.files import TINY_CORPUS, TINY_HELDOUT
from heads.errors import TokenizerError
from heads.vocab.trimming import (
    _encode_merges,
    _merges,
    rank_tokens,
    reorder_tokenizer,
    trim_tokenizer,
    whitespace_ids,
)

TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
BASE = len(TINY_SPECIAL_TOKENS) + 256  # the smallest legal byte-level head
SIZES = (BASE, 300, 1000, 4000)
FALLBACK_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
FALLBACK_BASE = len(FALLBACK_SPECIALS) + 256 + 1  # specials, <0xXX>, "▁"


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return read_corpus(TINY_CORPUS)


@pytest.fixture(scope="module")
def original(corpus: list[str]) -> Tokenizer:
    return train_bytelevel_bpe(corpus, 16384, TINY_SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def order(original: Tokenizer, corpus: list[str]) -> list[int]:
    return rank_tokens(original, corpus)


@pytest.fixture(scope="module")
def full(original: Tokenizer, order: list[int]) -> Tokenizer:
    return reorder_tokenizer(original, order)[0]


@pytest.fixture(scope="module")
def heads(full: Tokenizer) -> dict[int, Tokenizer]:
    return {v: trim_tokenizer(full, v) for v in (*SIZES, full.get_vocab_size())}


def _parents(tok: Tokenizer) -> dict[str, tuple[str, str]]:
    """token -> parents of the first merge that makes it."""
    out: dict[str, tuple[str, str]] = {}
    for a, b in json.loads(tok.to_str())["model"]["merges"]:
        out.setdefault(a + b, (a, b))
    return out


def test_order_starts_with_specials_then_bytes_in_byte_order(full: Tokenizer) -> None:
    assert [full.id_to_token(i) for i in range(5)] == TINY_SPECIAL_TOKENS
    # GPT-2's symbols for bytes 0x00, 0x20 (space) and 0x41 ("A").
    assert full.id_to_token(5 + 0x00) == "Ā"
    assert full.id_to_token(5 + 0x20) == "Ġ"
    assert full.id_to_token(5 + 0x41) == "A"
    # Whitespace runs ("ĠĠ", "ĊĊ" ...) lead the merged tokens whatever their count, then
    # the most frequent merged token.
    d = json.loads(full.to_str())
    merged_spaces = [i for i in whitespace_ids(d) if i >= BASE]
    assert len(merged_spaces) > 3
    assert merged_spaces == list(range(BASE, BASE + len(merged_spaces)))
    assert full.id_to_token(BASE + len(merged_spaces)) == "Ġt"


def test_order_is_a_permutation_closed_under_merge_ancestry(
    original: Tokenizer, full: Tokenizer, order: list[int]
) -> None:
    assert sorted(order) == list(range(original.get_vocab_size()))
    for child, (a, b) in _parents(full).items():
        assert full.token_to_id(a) < full.token_to_id(child)
        assert full.token_to_id(b) < full.token_to_id(child)


def test_frequent_tokens_come_first(full: Tokenizer) -> None:
    enc = full.encode_batch(read_corpus(TINY_HELDOUT))
    ids = [i for e in enc for i in e.ids]
    # Zipf: on held-out text most tokens come from the first few hundred merged ids.
    assert sum(i < 1000 for i in ids) / len(ids) > 0.6


def test_reordered_tokenizer_is_permutation_equivalent(
    original: Tokenizer, full: Tokenizer, order: list[int]
) -> None:
    _, perm = reorder_tokenizer(original, order)
    assert perm == order
    for text in read_corpus(TINY_HELDOUT)[:50]:
        a, b = original.encode(text), full.encode(text)
        assert a.tokens == b.tokens
        assert [perm[i] for i in b.ids] == a.ids


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_reordered_tokens_equal_on_any_text(original: Tokenizer, full: Tokenizer, text: str):
    assert original.encode(text).tokens == full.encode(text).tokens


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_every_head_round_trips_with_ids_below_v(heads: dict[int, Tokenizer], text: str) -> None:
    for v, tok in heads.items():
        ids = tok.encode(text, add_special_tokens=False).ids
        assert all(i < v for i in ids)
        assert tok.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=100, deadline=None)
@given(st.integers(BASE, 9000))
def test_every_prefix_is_a_closed_vocabulary(full: Tokenizer, v: int) -> None:
    head = trim_tokenizer(full, v)  # raises if a kept token lost its merge ancestors
    assert head.get_vocab_size() == min(v, full.get_vocab_size())
    text = "Return the value of the *key* 😀 in 世界."
    assert head.decode(head.encode(text).ids) == text


def test_nested_heads_share_ids(full: Tokenizer, heads: dict[int, Tokenizer]) -> None:
    biggest = heads[full.get_vocab_size()]
    assert biggest.to_str() == full.to_str()
    for v, tok in heads.items():
        for token, i in tok.get_vocab().items():
            assert i < v and full.token_to_id(token) == i
    text = " ".join(read_corpus(TINY_HELDOUT)[:20])
    lengths = [len(heads[v].encode(text).ids) for v in sorted(heads)]
    assert lengths == sorted(lengths, reverse=True)  # bigger heads compress better


def test_deterministic(original: Tokenizer, corpus: list[str], full: Tokenizer) -> None:
    order = rank_tokens(original, corpus)
    again = reorder_tokenizer(original, order)[0]
    assert again.to_str() == full.to_str()
    assert trim_tokenizer(again, 1000).to_str() == trim_tokenizer(full, 1000).to_str()


def test_merges_in_both_json_encodings(full: Tokenizer) -> None:
    d = json.loads(full.to_str())
    pairs = d["model"]["merges"]
    strings = [f"{a} {b}" for a, b in pairs]
    assert _merges({"merges": strings}) == _merges({"merges": pairs})
    assert _encode_merges(_merges({"merges": strings}), strings) == strings
    # A pre-0.20 file ("a b" strings) trims to the same tokenizer.
    d["model"]["merges"] = strings
    old_style = Tokenizer.from_str(json.dumps(d))
    assert trim_tokenizer(old_style, 1000).to_str() == trim_tokenizer(full, 1000).to_str()


def test_cutting_specials_or_bytes_is_rejected(full: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="base tokens"):
        trim_tokenizer(full, BASE - 1)


def test_trimming_an_unordered_tokenizer_is_rejected(full: Tokenizer) -> None:
    # Put "Ġthe" before its parent "Ġt": the cut at BASE + 1 keeps the child alone.
    order = list(range(full.get_vocab_size()))
    child = full.token_to_id("Ġthe")
    order[BASE], order[child] = order[child], order[BASE]
    bad, _ = reorder_tokenizer(full, order)
    with pytest.raises(TokenizerError, match="Matryoshka"):
        trim_tokenizer(bad, BASE + 1)


def test_bad_order_and_unsupported_models_are_rejected(full: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="permutation"):
        reorder_tokenizer(full, [0, 0, 1])
    word = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    with pytest.raises(TokenizerError, match="only BPE"):
        trim_tokenizer(word, 1)
    plain = Tokenizer(models.BPE())
    plain.train_from_iterator(["abc abd"], trainers.BpeTrainer(vocab_size=20))
    with pytest.raises(TokenizerError, match="neither byte-level nor byte-fallback"):
        rank_tokens(plain, ["abc"])


# --- SentencePiece-style BPE with byte fallback (the shape of Gemma-3's tokenizer) ----------


def _byte_fallback_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("▁"), behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=700, special_tokens=FALLBACK_SPECIALS, show_progress=False))
    d = json.loads(tok.to_str())
    d["model"]["byte_fallback"] = True
    vocab = d["model"]["vocab"]
    # Appended after the merges, as far from Matryoshka order as possible.
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(d))
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    return tok


@pytest.fixture(scope="module")
def fallback(corpus: list[str]) -> tuple[Tokenizer, Tokenizer]:
    original = _byte_fallback_tokenizer(corpus[:300])
    full, _ = reorder_tokenizer(original, rank_tokens(original, corpus[:300]))
    return original, full


def test_byte_fallback_order(fallback: tuple[Tokenizer, Tokenizer]) -> None:
    original, full = fallback
    assert [full.id_to_token(i) for i in range(4)] == FALLBACK_SPECIALS
    assert full.id_to_token(4) == "<0x00>" and full.id_to_token(4 + 255) == "<0xFF>"
    # "▁" is base: spelled in bytes, the decoder would not turn it back into a space.
    assert full.id_to_token(FALLBACK_BASE - 1) == "▁"
    with pytest.raises(TokenizerError, match="'▁'"):
        trim_tokenizer(full, FALLBACK_BASE - 1)
    assert original.encode("a b").tokens == full.encode("a b").tokens
    # The post-processor's id moved with its token.
    assert full.encode("hi").ids[0] == full.token_to_id("<bos>")


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_byte_fallback_heads_round_trip(fallback: tuple[Tokenizer, Tokenizer], text: str):
    _, full = fallback
    want = full.decode(full.encode(text).ids)
    for v in (FALLBACK_BASE, 300, 500, full.get_vocab_size()):
        head = trim_tokenizer(full, v)
        ids = head.encode(text, add_special_tokens=False).ids
        assert all(i < v for i in ids)
        assert head.decode(ids) == want
        if "▁" not in text:  # the Replace normalizer maps "▁" to " " on the way back
            assert head.decode(ids, skip_special_tokens=False) == text


def test_byte_fallback_spells_unseen_chars_in_bytes(fallback: tuple[Tokenizer, Tokenizer]):
    _, full = fallback
    head = trim_tokenizer(full, 300)
    assert head.encode("😀", add_special_tokens=False).tokens == [
        "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert head.encode("x").ids[0] == full.token_to_id("<bos>")


def test_unused_specials_can_go_last(corpus: list[str]) -> None:
    # Gemma-3 reserves thousands of `<unusedN>` specials; they must not crowd out small heads.
    original = _byte_fallback_tokenizer(corpus[:300])
    original.add_special_tokens([f"<unused{i}>" for i in range(40)])
    n = original.get_vocab_size()
    order = rank_tokens(original, corpus[:300], keep_first={"<bos>", "<eos>", "<pad>"})
    full, _ = reorder_tokenizer(original, order)
    assert [full.id_to_token(i) for i in range(n - 40, n)] == [f"<unused{i}>" for i in range(40)]
    # <unk> is not named either, but byte fallback needs it: it stays with the base.
    assert [full.id_to_token(i) for i in range(4)] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    with pytest.raises(TokenizerError, match="special or base"):
        trim_tokenizer(full, 300)
    head = trim_tokenizer(full, 300, keep_all_specials=False)
    assert head.token_to_id("<unused0>") is None and head.token_to_id("<bos>") is not None
    ids = head.encode("<unused3> x", add_special_tokens=False).ids
    assert all(i < 300 for i in ids) and head.decode(ids) == "<unused3> x"
