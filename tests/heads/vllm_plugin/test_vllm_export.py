"""The concatenated-vocabulary layout and `polyhead export vllm` (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from heads.errors import CheckpointError
from heads.manifest import Manifest
from heads.vllm_plugin.export import export_vllm, export_vllm_per_head
from heads.vllm_plugin.layout import ARCHITECTURE, CONFIG_KEY, VocabLayout


def test_layout_lays_heads_end_to_end(tiny_model_dir: Path) -> None:
    layout = VocabLayout.from_manifest(Manifest.load(tiny_model_dir))
    assert [(h.name, h.offset, h.vocab_size) for h in layout.heads] == [
        ("1k", 0, 1024), ("4k", 1024, 4096), ("8k", 5120, 8192)]
    assert layout.total_vocab == 13312
    assert layout.matrices == (("matrices.shared", 8192),)  # nested: one matrix, no copies
    assert [layout.head_of(g).name for g in (0, 1023, 1024, 5119, 5120, 13311)] == [
        "1k", "1k", "4k", "4k", "8k", "8k"]
    with pytest.raises(ValueError):
        layout.head_of(13312)
    assert VocabLayout.from_json(json.loads(json.dumps(layout.to_json()))) == layout


def test_layout_rejects_gaps_and_bad_matrices(tiny_model_dir: Path) -> None:
    doc = VocabLayout.from_manifest(Manifest.load(tiny_model_dir)).to_json()
    doc["heads"][1]["offset"] += 1
    with pytest.raises(CheckpointError, match=r"heads\[1\].offset"):
        VocabLayout.from_json(doc)
    doc = VocabLayout.from_manifest(Manifest.load(tiny_model_dir)).to_json()
    doc["matrices"][0]["rows"] = 100
    with pytest.raises(CheckpointError, match="bad matrix"):
        VocabLayout.from_json(doc)


def test_export_writes_config_weights_and_every_eos(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "vllm"
    layout = export_vllm(tiny_model_dir, out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == sum(h.vocab_size for h in layout.heads)
    assert VocabLayout.from_json(config[CONFIG_KEY]) == layout
    manifest = Manifest.load(tiny_model_dir)
    eos = [layout.head(h.name).offset + t for h in manifest.heads for t in h.eos_token_ids]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [8192, 128]
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not [n for n in names if n.startswith("head_matrices.")]  # tied and nested


def test_per_head_export_is_a_stock_model_per_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    dirs = export_vllm_per_head(tiny_model_dir, tmp_path / "per-head")
    assert sorted(dirs) == ["1k", "4k", "8k"]
    config = json.loads((dirs["4k"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 4096 and config["tie_word_embeddings"] is True
    with safe_open(str(dirs["4k"] / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [4096, 128]
    assert (dirs["4k"] / "tokenizer.json").is_file()


def test_per_head_tokenizer_encodes_prompts_as_the_gateway_does(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    """Stock vLLM tokenizes text prompts with the exported tokenizer (transformers'
    AutoTokenizer): it must send the engine the ids the gateway sends, BOS first."""
    from transformers import AutoTokenizer

    from heads.model.weights import load_checkpoint
    from heads.vocab.prompt_encoder import PromptEncoder

    dirs = export_vllm_per_head(tiny_model_dir, tmp_path / "per-head")
    manifest = Manifest.load(tiny_model_dir)
    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    encoder = PromptEncoder(ckpt.tokenizers, {h.name: h.bos_token_id for h in manifest.heads})
    text = "The water buffalo, also called the domestic water buffalo, is a large bovine."
    try:
        for h in manifest.heads:
            assert h.bos_token_id is not None
            stock = AutoTokenizer.from_pretrained(str(dirs[h.name]))
            ours = list(encoder.encode([text], False, [h.name]).heads[h.name].ids[0])
            assert stock(text)["input_ids"] == ours and ours[0] == h.bos_token_id
            assert stock.convert_tokens_to_ids(stock.eos_token) == h.eos_token_ids[0]
            assert stock.chat_template == manifest.chat_template
    finally:
        encoder.close()
