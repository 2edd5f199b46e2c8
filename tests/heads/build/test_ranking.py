"""Token rankings: whole-file counts, deliberate source weights, whitespace runs kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from heads.build.ranking import (
    ENGLISH_TRAFFIC,
    OTHER_LANGUAGES_SHARE,
    SourceWeights,
    file_pieces,
    rank_on_corpus,
)
from heads.vocab.trimming import whitespace_ids
from tests.heads.vocab.test_trimming import _byte_fallback_tokenizer


def _corpus(tmp_path: Path, sources: dict[str, tuple[str, str]]) -> list[Path]:
    """name -> (language, text) written as a built corpus directory with its corpus.json."""
    files = []
    for name, (_, text) in sources.items():
        files.append(tmp_path / f"{name}.train.txt")
        files[-1].write_text(text)
    (tmp_path / "corpus.json").write_text(json.dumps({"sources": [
        {"name": n, "language": lang} for n, (lang, _) in sources.items()]}))
    return files


def test_presets_weigh_sources_as_documented(tmp_path: Path) -> None:
    files = _corpus(tmp_path, {"wiki": ("en", "a"), "gcide": ("en", "b"),
                               "man-de": ("de", "c"), "man-ja": ("ja", "d")})
    by = {p.name.split(".")[0]: w for p, w in SourceWeights.parse("english-first").of(files)
          .items()}
    en = ENGLISH_TRAFFIC["wiki"] + ENGLISH_TRAFFIC["gcide"]
    assert by["wiki"] == pytest.approx((1 - OTHER_LANGUAGES_SHARE) * ENGLISH_TRAFFIC["wiki"] / en)
    assert by["man-de"] == by["man-ja"] == pytest.approx(OTHER_LANGUAGES_SHARE / 2)
    balanced = SourceWeights.parse("balanced").of(files)
    assert balanced[files[2]] == pytest.approx(1 / 3)
    assert balanced[files[0]] + balanced[files[1]] == pytest.approx(1 / 3)
    assert set(SourceWeights.parse("equal").of(files).values()) == {0.25}
    explicit = SourceWeights.parse("wiki=3,gcide=1,man-de=0,man-ja=0").of(files)
    assert explicit == {files[0]: 0.75, files[1]: 0.25}
    with pytest.raises(ValueError, match="no weight for man-de"):
        SourceWeights.parse("wiki=1,gcide=1").of(files)
    with pytest.raises(ValueError, match="NAME=WEIGHT"):
        SourceWeights.parse("wiki")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=" \nab\t", max_size=300), st.integers(1, 40))
def test_file_pieces_concatenate_and_never_cut_whitespace(text: str, size: int) -> None:
    pieces = file_pieces(text, size)
    assert "".join(pieces) == text
    for p in pieces[1:]:
        assert not p[0].isspace()


def test_whole_file_counts_rank_paragraph_breaks_and_weights_matter(tmp_path: Path) -> None:
    prose = "the cat sat on the mat.\n\nthe dog ran.\n\n" * 50
    code = "def f(x):\n    return x\n" * 50
    tok = _byte_fallback_tokenizer([prose, code])
    files = _corpus(tmp_path, {"wiki": ("en", prose), "python-doc": ("en", code)})
    d = json.loads(tok.to_str())
    spaces = whitespace_ids(d)
    assert tok.token_to_id("▁") in spaces
    order = rank_on_corpus(tok, files, None, SourceWeights.parse("wiki=1,python-doc=0")).order
    # Whitespace tokens come right after the specials and the base, before any word.
    head = order[:len(spaces) + 4 + 256 + 1 + 8]
    assert set(spaces) <= set(head)
    words = [i for i in order if i not in spaces][4 + 256 + 1:]
    top_prose = [tok.id_to_token(i) for i in words[:5]]
    order_code = rank_on_corpus(tok, files, None, SourceWeights.parse("wiki=0,python-doc=1"))
    top_code = [tok.id_to_token(i) for i in order_code.order if i not in spaces][261:266]
    assert top_prose != top_code
    assert "wiki.train.txt=1.000" in rank_on_corpus(
        tok, files, None, SourceWeights.parse("wiki=1,python-doc=0")).source


def test_whitespace_ids_of_a_metaspace_vocabulary() -> None:
    tok = Tokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {"▁": 0, "\n": 1, "a": 2, "\n\n": 3, "▁▁": 4, "▁a": 5},
                  "merges": [["\n", "\n"], ["▁", "▁"], ["▁", "a"]]}}))
    assert whitespace_ids(json.loads(tok.to_str())) == [0, 1, 3, 4]
