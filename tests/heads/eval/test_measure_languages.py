"""Per-language evaluation in byte-aligned windows, on the tiny model and the committed
samples; and that measuring leaves the manifest alone unless asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from heads.corpus.languages import sample, sample_path
from heads.eval.measure import KINDS, byte_windows, evaluate, kind_of, sequence_bits
from heads.manifest import MANIFEST_FILE, Manifest
from heads.model.weights import load_checkpoint
from server.cli import main


@pytest.mark.parametrize("lang", ["en", "ja", "hi", "ko"])
def test_byte_windows_cover_the_text_at_character_boundaries(lang: str) -> None:
    text = sample(lang)
    pieces = byte_windows(text, 700)
    assert "".join(pieces) == text and len(pieces) > 5
    assert all(0 < len(p.encode()) <= 700 for p in pieces)
    assert all(len(p.encode()) > 600 for p in pieces[:-1])  # cuts only near the end
    if lang == "en":  # spaced text: every cut falls after whitespace
        assert all(p[-1].isspace() for p in pieces[:-1])


def test_byte_windows_edge_cases() -> None:
    assert byte_windows("", 64) == []
    assert byte_windows("a" * 20, 8) == ["a" * 8, "a" * 8, "a" * 4]
    assert byte_windows("€" * 5, 8) == ["€€", "€€", "€"]  # 3-byte characters never split
    with pytest.raises(ValueError):
        byte_windows("abc", 4)


def test_byte_window_eval_scores_each_window_on_its_own(tiny_model_dir: Path) -> None:
    ckpt = load_checkpoint(tiny_model_dir)
    files = [sample_path("en"), sample_path("ja")]
    results = evaluate(ckpt, files, max_bytes=3000, window=64, window_bytes=512)
    assert {r.source for r in results} == {"en", "ja"}
    for source in ("en", "ja"):
        rs = [r for r in results if r.source == source]
        assert len(rs) == len(ckpt.manifest.heads)
        assert len({r.bytes for r in rs}) == 1  # every head scores the same bytes
    native = max(ckpt.manifest.heads, key=lambda h: h.vocab_size).name
    for r in results:  # the kinds split each head's bits exactly
        assert set(r.bits_by_kind) == set(KINDS)
        assert sum(r.bits_by_kind.values()) == pytest.approx(r.bits, rel=1e-9)
        if r.head == native:
            assert r.bits_by_kind["native"] == pytest.approx(r.bits, rel=1e-9)
        else:
            assert r.bits_by_kind["split_word"] > 0 and r.differing_tokens > 0
    # Recompute one head by hand: each byte window is one context, BOS first, all scored.
    head = min(ckpt.manifest.heads, key=lambda h: h.vocab_size).name
    (r,) = [r for r in results if r.source == "ja" and r.head == head]
    from heads.eval.measure import _head_of

    tok = ckpt.tokenizers[head]  # what the gateway encodes with (here a split head)
    assert tok.split is not None
    want = 0.0
    for piece in byte_windows(_head_of(files[1], 3000), 512):
        ids = tok.encode(piece)
        want += sequence_bits(ckpt, head, ids, window=len(ids) + 1)[0]
    assert r.bits == pytest.approx(want, rel=1e-5)
    # Token windows reset the context elsewhere on each head, so they measure differently.
    by_tokens = evaluate(ckpt, files[1:], max_bytes=3000, window=64)
    (t,) = [x for x in by_tokens if x.head == head]
    assert t.bytes == r.bytes and t.bits != pytest.approx(r.bits, rel=1e-4)


def test_kind_of() -> None:
    assert kind_of("hello", True, False) == "native"
    assert kind_of("<0xE3>", False, True) == "byte_fallback"
    assert kind_of("\n\n", False, False) == kind_of(" ,", False, False) == "separator"
    assert kind_of("ell", False, False) == kind_of("語", False, False) == "split_word"
    assert kind_of("ा", False, False) == kind_of("्", False, False) == "split_word"  # marks


def test_cli_eval_per_language_no_update_by_default(tiny_model_dir: Path, tmp_path: Path,
                                                    capsys) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    before = (model / MANIFEST_FILE).read_bytes()
    out = tmp_path / "eval"
    args = ["heads", "eval", str(model), "--languages", "en,de,zh", "--max-bytes", "1500",
            "--window-bytes", "600", "--threads", "1", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "manifest updated" not in printed and "zh" in printed and "1k/native" in printed
    assert (model / MANIFEST_FILE).read_bytes() == before  # measuring did not rewrite it
    table = json.loads((out / "eval-by-source.json").read_text())
    heads = [h.name for h in Manifest.load(model).heads]
    assert list(table) == ["en", "de", "zh"] and all(set(row) == set(heads)
                                                     for row in table.values())
    native = max(Manifest.load(model).heads, key=lambda h: h.vocab_size).name
    for row in table.values():
        assert row[native]["bpb_vs_native"] == 1.0
        assert all(v["bpb"] > 0 and v["bytes_per_token"] >= 1 for v in row.values())
    assert (out / "eval-by-source.png").stat().st_size > 1000
    assert main([*args, "--update"]) == 0
    assert "manifest updated" in capsys.readouterr().out
    assert (model / MANIFEST_FILE).read_bytes() != before
    m = Manifest.load(model)
    assert m.extra["eval_sources"] == ["de", "en", "zh"]
    assert main(["heads", "eval", str(model), "--languages", "xx"]) == 2


def test_byte_fallback_pieces_never_match_a_native_character_token() -> None:
    from tokenizers import Tokenizer, models

    from heads.eval.measure import _byte_token_ids, _native_tokens, _spans

    bytes_vocab = {f"<0x{b:02X}>": b for b in range(256)}
    native = Tokenizer(models.BPE({**bytes_vocab, "a": 256, "é": 257}, [], byte_fallback=True))
    trimmed = Tokenizer(models.BPE({**bytes_vocab, "a": 256}, [], byte_fallback=True))
    native_set = _native_tokens("aé", native, _byte_token_ids(native))
    assert native_set == {(0, 1, False), (1, 2, False)}
    ids, offsets = _spans("aé", trimmed)
    byte_ids = _byte_token_ids(trimmed)
    assert ids == [256, 0xC3, 0xA9] and offsets[1] == offsets[2] == (1, 2)  # char offsets
    kinds = [kind_of("aé"[a:b], (a, b, i in byte_ids) in native_set, i in byte_ids)
             for i, (a, b) in zip(ids, offsets, strict=True)]
    assert kinds == ["native", "byte_fallback", "byte_fallback"]


def test_eval_can_score_a_subset_of_heads(tiny_model_dir: Path) -> None:
    ckpt = load_checkpoint(tiny_model_dir)
    files = [sample_path("en")]
    (r,) = evaluate(ckpt, files, max_bytes=600, window=64, window_bytes=256, only=["1k"])
    (full,) = [x for x in evaluate(ckpt, files, max_bytes=600, window=64, window_bytes=256)
               if x.head == "1k"]
    assert r.head == "1k" and r.bits == pytest.approx(full.bits, rel=1e-9)
    with pytest.raises(KeyError, match="no head 'nope'"):
        evaluate(ckpt, files, max_bytes=600, window=64, only=["nope"])
