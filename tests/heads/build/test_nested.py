from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from tokenizers import Tokenizer

from heads.build.nested import build_heads
from heads.build.ranking import load_ranking
from heads.build.tiny import TINY_BACKBONE, TINY_SPECIAL_TOKENS, read_corpus, train_bytelevel_bpe
from heads.data.files import TINY_CORPUS, TINY_HELDOUT
from heads.errors import TokenizerError
from heads.eval.measure import sequence_bits
from heads.eval.report import run_eval
from heads.manifest import HeadSpec, Manifest
from heads.model.forward import forward_logits
from heads.model.multi_head import MultiHeadModel
from heads.model.weights import Checkpoint, load_checkpoint, save_checkpoint
from heads.vocab.trimming import reorder_tokenizer
from server.cli import main

V = 2048
SIZES = [512, 1024]
TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
SAMPLES = ["The quick brown fox, 1913.", "def f(x):\n\treturn x ** 2  # ok", "naïve café 😀 漢字"]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single-head checkpoint whose vocabulary is in random order (nothing Matryoshka)."""
    texts = read_corpus(TINY_CORPUS)
    tok = train_bytelevel_bpe(texts, V, TINY_SPECIAL_TOKENS)
    order = list(range(V))
    random.Random(0).shuffle(order)
    tok, _ = reorder_tokenizer(tok, order)
    ids = {t: tok.token_to_id(t) for t in TINY_SPECIAL_TOKENS}
    head = HeadSpec(name="2k", vocab_size=V, tokenizer="tokenizers/2k.json",
                    embedding="matrices.shared", unembedding="matrices.shared",
                    bos_token_id=ids["<|bos|>"], eos_token_ids=(ids["<|eos|>"],),
                    training_bytes=1000)
    manifest = Manifest(model_name="scrambled", dtype="float32", backbone=TINY_BACKBONE,
                        heads=(head,))
    model = MultiHeadModel.random(manifest, seed=1, backbone_std=0.16)
    out = tmp_path_factory.mktemp("src") / "model"
    save_checkpoint(out, manifest, model.state_dict_for_save(), {head.tokenizer: tok.to_str()})
    return out


@pytest.fixture(scope="module")
def built_dir(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("built")
    build_heads(src, base / "model", SIZES, corpus=[TINY_CORPUS],
                save_ranking_to=base / "ranking.npz")
    return base / "model"


@pytest.fixture(scope="module")
def built(built_dir: Path) -> Checkpoint:
    return load_checkpoint(built_dir)


def test_heads_share_one_matrix_in_size_order(built: Checkpoint) -> None:
    m = built.manifest
    assert [(h.name, h.vocab_size) for h in m.heads] == [("512", 512), ("1k", 1024), ("2k", V)]
    assert {h.embedding for h in m.heads} == {"matrices.shared"}
    assert len({h.bos_token_id for h in m.heads}) == 1 and m.heads[0].bos_token_id < 512
    assert m.extra["ranking"]["source"] == f"{TINY_CORPUS.name}=1.000"
    assert m.extra["trim"] == "split"
    # Smaller heads encode with the native tokenizer and re-spell what they lack.
    assert [(h.encoder, h.split_table) for h in m.heads] == [
        ("tokenizers/2k.json", "tokenizers/512.split.npz"),
        ("tokenizers/2k.json", "tokenizers/1k.split.npz"), (None, None)]
    assert built.tokenizers["512"].encoder is built.tokenizers["2k"]


def test_split_heads_keep_native_tokens_merge_filtered_heads_may_not(
        src: Path, built: Checkpoint, tmp_path: Path) -> None:
    merges = load_checkpoint(build_heads(src, tmp_path / "m", SIZES, corpus=[TINY_CORPUS],
                                         trim="merges") and tmp_path / "m")
    assert all(h.split_table is None for h in merges.manifest.heads)
    text = " ".join(SAMPLES) + " " + TINY_HELDOUT.read_text()[:3000]
    native = built.tokenizers["2k"].encode(text)
    for name, v in (("512", 512), ("1k", 1024)):
        kept_native = [t for t in native if t < v]
        split_ids = built.tokenizers[name].encode(text)
        # Every native token the head has is still there, in order; re-spelled pieces between.
        src_of = built.tokenizers[name].split.sources(native)
        assert [split_ids[k] for k, j in enumerate(src_of) if native[j] < v] == kept_native
        assert len(split_ids) <= len(merges.tokenizers[name].encode(text)) * 1.02


@settings(max_examples=200, deadline=None)
@given(TEXT)
@example("emoji 😀👍🏽, CJK 漢字かな, controls \x00\x01\x07\x1b\x7f\r\n\t, <|im_end|>")
def test_every_head_round_trips_with_ids_below_v(built: Checkpoint, text: str) -> None:
    for h in built.manifest.heads:
        tok = built.tokenizers[h.name]
        ids = tok.encode(text)
        assert all(0 <= i < h.vocab_size for i in ids)
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_lone_surrogates_are_rejected_clearly(built: Checkpoint) -> None:
    for h in built.manifest.heads:
        with pytest.raises(TokenizerError, match="lone surrogate U\\+D800"):
            built.tokenizers[h.name].encode("ok \ud800 no")


def _perm(src: Checkpoint, built: Checkpoint) -> list[int]:
    """perm[new id] = old id, recovered from the token strings."""
    old, new = src.tokenizers["2k"], built.tokenizers["2k"]
    return [int(old.token_to_id(new.id_to_token(i))) for i in range(V)]  # type: ignore[arg-type]


def test_native_head_is_permutation_equivalent(src: Path, built: Checkpoint) -> None:
    before = load_checkpoint(src)
    perm = _perm(before, built)
    assert perm != list(range(V))  # the build really moved ids
    new_of_old = {old: new for new, old in enumerate(perm)}
    for text in SAMPLES:
        old_ids = before.tokenizers["2k"].encode(text)
        new_ids = built.tokenizers["2k"].encode(text)
        assert new_ids == [new_of_old[i] for i in old_ids]
        bos_old = before.manifest.heads[0].bos_token_id
        bos_new = built.manifest.head("2k").bos_token_id
        assert bos_new == new_of_old[bos_old]
        old_logits = forward_logits(before, "2k", [bos_old, *old_ids])
        new_logits = forward_logits(built, "2k", [bos_new, *new_ids])
        torch.testing.assert_close(new_logits, old_logits[:, perm], rtol=0, atol=1e-5)


def test_saved_ranking_rebuilds_the_same_checkpoint(built_dir: Path, src: Path, tmp_path: Path):
    ranking = built_dir.parent / "ranking.npz"
    assert len(load_ranking(ranking).order) == V
    build_heads(src, tmp_path / "again", SIZES, ranking=ranking)
    for h in load_checkpoint(built_dir).manifest.heads:
        again = (tmp_path / "again" / h.tokenizer).read_text()
        assert again == (built_dir / h.tokenizer).read_text()
    a, b = load_file(str(built_dir / "model.safetensors")), load_file(
        str(tmp_path / "again" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ranking_for_another_vocabulary_is_rejected(built_dir: Path, tmp_path: Path) -> None:
    # The built checkpoint's vocabulary is in a different order than the one ranked.
    with pytest.raises(TokenizerError, match="another vocabulary"):
        build_heads(built_dir, tmp_path / "x", SIZES, ranking=built_dir.parent / "ranking.npz")


def test_bad_sizes_are_rejected(src: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sizes must be in"):
        build_heads(src, tmp_path / "x", [V], corpus=[TINY_CORPUS])


def test_sequence_bits_matches_a_direct_computation(built: Checkpoint) -> None:
    ids = built.tokenizers["1k"].encode(" ".join(SAMPLES))
    bos = built.manifest.head("1k").bos_token_id
    assert bos is not None
    logp = torch.log_softmax(forward_logits(built, "1k", [bos, *ids]), dim=-1)
    want = -float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum()) / math.log(2)
    bits, _ = sequence_bits(built, "1k", ids, window=len(ids) + 1)
    assert bits == pytest.approx(want, rel=1e-4)
    # Shorter windows lose context, so they cost bits, but they still score every token.
    windowed, _ = sequence_bits(built, "1k", ids, window=8)
    assert windowed > 0 and windowed != pytest.approx(want, rel=1e-6)


def test_eval_writes_manifest_json_and_plot(built_dir: Path, tmp_path: Path) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(built_dir, model)
    results, png = run_eval(model, [TINY_HELDOUT], max_bytes=3000, window=64)
    assert png.is_file() and png.stat().st_size > 1000
    by_head = {r.head: r for r in results}
    assert by_head["2k"].differing_tokens == 0
    assert by_head["512"].bytes_per_token < by_head["2k"].bytes_per_token
    # Random weights: close to uniform over V, so BPB ~ log2(V) / bytes-per-token.
    for r in results:
        assert 0.3 < r.bpb / (math.log2(r.vocab_size) / r.bytes_per_token) < 3
    m = Manifest.load(model)
    assert all(h.bpb is not None and h.bytes_per_token is not None for h in m.heads)
    rows = json.loads((model / "eval" / "eval.json").read_text())
    assert {r["source"] for r in rows} == {"tiny_heldout", "all"}


def test_cli_corpus_build_and_heads_build(src: Path, tmp_path: Path, capsys) -> None:
    assert main(["corpus", "build", "--files", str(TINY_CORPUS), "--out",
                 str(tmp_path / "c")]) == 0
    train = tmp_path / "c" / "tiny_corpus.train.txt"
    held = tmp_path / "c" / "tiny_corpus.heldout.txt"
    assert train.stat().st_size > 10 * held.stat().st_size > 0
    assert main(["heads", "build", str(src), "--sizes", "600", "--corpus", str(train),
                 "--out", str(tmp_path / "m"), "--fit-bytes", "256"]) == 0
    out = capsys.readouterr().out
    assert "600 (V=600)" in out and "BPB penalty" in out
    # The router's quality model was fitted on the new heads and stored with them.
    m = Manifest.load(tmp_path / "m")
    native = m.penalty(max(m.heads, key=lambda h: h.vocab_size).name)
    assert native is not None and native.per_split == 0.0
    assert all((f := m.penalty(h.name)) is not None and f.points > 0 for h in m.heads)
    assert (tmp_path / "m" / "eval-languages" / "eval-by-source.json").is_file()
    assert main(["heads", "build", str(src), "--sizes", "99999", "--corpus", str(train),
                 "--out", str(tmp_path / "m2"), "--no-fit-penalty"]) == 2
    tok = Tokenizer.from_file(str(tmp_path / "m" / "tokenizers" / "600.json"))
    assert tok.get_vocab_size() == 600
