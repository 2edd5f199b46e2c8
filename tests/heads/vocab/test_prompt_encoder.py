"""Tokenizing a prompt with every head at once, and the script classes the router learns by."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heads.checkpoint import load_metadata
from heads.errors import TokenizerError
from heads.vocab.prompt_encoder import PromptEncoder
from heads.vocab.scripts import UNKNOWN, script_class, script_histogram

SAMPLES = {
    "latin": "The quick brown fox jumps over the lazy dog; ça va très bien, Tiếng Việt.",
    "cyrillic": "Москва — столица России, крупнейший по численности населения город.",
    "kana": "東京は日本の首都であり、世界有数の大都市です。",
    "han": "北京是中华人民共和国的首都，也是全国政治文化中心。",
    "hangul": "서울은 대한민국의 수도이자 최대 도시이다.",
    "devanagari": "भारत दक्षिण एशिया में स्थित एक देश है।",
    "greek": "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "arabic": "القاهرة هي عاصمة جمهورية مصر العربية.",
    "hebrew": "ירושלים היא בירת ישראל.",
    "thai": "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
}


@pytest.mark.parametrize(("script", "text"), SAMPLES.items())
def test_script_class_of_real_text(script: str, text: str) -> None:
    assert script_class(text) == script


def test_script_histogram_counts_letters_only() -> None:
    assert script_histogram("12 + 34 = 46 !?") == {}
    assert script_class("🙂 42") == UNKNOWN
    hist = script_histogram("abc Жж 日本")
    assert hist == {"latin": 3, "cyrillic": 2, "han": 2}
    assert script_class("def f(x):\n    return x  # Привет") == "latin"


@pytest.fixture(scope="module")
def encoder(tiny_model_dir: Path):
    manifest, toks = load_metadata(tiny_model_dir)
    enc = PromptEncoder(toks, {h.name: h.bos_token_id for h in manifest.heads})
    yield enc, manifest, toks
    enc.close()


def test_every_head_tokenizes_as_its_own_encode(encoder) -> None:
    enc, manifest, toks = encoder
    texts = ["Hello there, how are you?", SAMPLES["cyrillic"]]
    out = enc.encode(texts, chat=False)
    assert set(out.heads) == set(manifest.head_names)
    assert out.prompt_bytes == sum(len(t.encode()) for t in texts)
    assert out.script == "latin" or out.script == "cyrillic"
    for spec in manifest.heads:
        want = []
        for t in texts:
            ids = toks[spec.name].encode(t)
            if spec.bos_token_id is not None:
                ids = [spec.bos_token_id, *ids]
            want.append(tuple(ids))
        assert out.heads[spec.name].ids == tuple(want)
        assert out.heads[spec.name].tokens == sum(len(w) for w in want)
    one = enc.encode(texts, chat=False, heads=[manifest.head_names[0]])
    assert set(one.heads) == {manifest.head_names[0]}


def test_special_token_text_is_plain_in_completions(encoder) -> None:
    enc, manifest, toks = encoder
    head = manifest.head_names[-1]
    eos = toks[head].id_to_token(manifest.head(head).eos_token_ids[0])
    assert eos
    plain = enc.encode([f"a {eos} b"], chat=False, heads=[head]).heads[head].ids[0]
    chat = enc.encode([f"a {eos} b"], chat=True, heads=[head]).heads[head].ids[0]
    assert manifest.head(head).eos_token_ids[0] not in plain
    assert manifest.head(head).eos_token_ids[0] in chat


def test_lone_surrogate_is_refused(encoder) -> None:
    enc, _, _ = encoder
    with pytest.raises(TokenizerError, match="surrogate"):
        enc.encode(["ok \ud800 no"], chat=False)


@settings(max_examples=40, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_fallback_bytes_never_exceed_the_text(tiny_model_dir: Path, text: str) -> None:
    manifest, toks = load_metadata(tiny_model_dir)
    for spec in manifest.heads:
        ids = toks[spec.name].encode(text)
        assert 0 <= toks[spec.name].fallback_bytes(ids) <= len(text.encode())


MULTILINGUAL = Path(__file__).resolve().parents[2] / "heads" / "data" / "multilingual"


def _check_counts_equal_the_spelled_ids(model_dir: Path) -> None:
    """A split head's counts, read from its table per native id, against its ids spelled
    out and its own encode, on every committed multilingual sample."""
    manifest, toks = load_metadata(model_dir)
    assert any(t.split is not None for t in toks.values())  # the path under test
    enc = PromptEncoder(toks, {h.name: h.bos_token_id for h in manifest.heads})
    try:
        for path in sorted(MULTILINGUAL.glob("*.txt")):
            texts = [p for p in path.read_text().split("\n\n") if p.strip()][:40]
            texts += ["", " ", path.read_text()[:2048]]
            for chat in (False, True):
                out = enc.encode(texts, chat)
                for spec in manifest.heads:
                    got = out.heads[spec.name]
                    lengths, fallback = got.lengths, got.fallback_bytes
                    ids = got.ids  # spelled now, after the counts were read
                    tok = toks[spec.name]
                    want = [tok.encode_with_specials(t) if chat else tok.encode(t)
                            for t in texts]
                    bos = spec.bos_token_id
                    full = [tuple(w if bos is None or (w and w[0] == bos) else [bos, *w])
                            for w in want]
                    assert ids == tuple(full), (path.name, spec.name)
                    assert lengths == tuple(len(w) for w in full), (path.name, spec.name)
                    assert fallback == sum(tok.fallback_bytes(w) for w in want)
                    assert got.tokens == sum(lengths)
    finally:
        enc.close()


def test_split_head_counts_equal_the_spelled_ids(tiny_model_dir: Path) -> None:
    _check_counts_equal_the_spelled_ids(tiny_model_dir)


@pytest.mark.model
def test_split_head_counts_equal_the_spelled_ids_on_the_demo() -> None:
    from kernels.cache_paths import cache_root
    from server.model_source import resolve_model_dir

    _check_counts_equal_the_spelled_ids(resolve_model_dir("gemma3-270m",
                                                          cache_root(expand_user=True)))
