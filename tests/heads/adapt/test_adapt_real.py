"""A short `heads adapt` run on the real Gemma-3 demo checkpoint (model tier): the 32k head's
held-out BPB drops and the native head stays bit-identical."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from heads.adapt.data import DataConfig
from heads.adapt.run import AdaptConfig, adapt
from heads.adapt.train import TrainConfig
from heads.model.forward import forward_hidden
from heads.model.weights import load_checkpoint
from kernels.cache_paths import cache_root
from server.model_source import resolve_model_dir

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1800)]

CORPUS = cache_root(expand_user=True) / "corpus"


@pytest.fixture(scope="module")
def demo() -> Path:
    if not (CORPUS / "wiki.train.txt").is_file():
        pytest.skip("needs the built corpus (polyhead corpus build)")
    return resolve_model_dir("gemma3-270m", cache_root(expand_user=True))


def test_short_real_run_lowers_heldout_bpb(demo: Path, tmp_path: Path) -> None:
    data = DataConfig(CORPUS, (("wiki", 0.7), ("python-doc", 0.3)), train_bytes=12_000,
                      heldout_bytes=4_000)
    cfg = AdaptConfig("32k", data, TrainConfig(rank=8, steps=30, batch=256, eval_every=10,
                                                patience=10), cache_dir=tmp_path / "cache")
    report = adapt(demo, cfg, tmp_path / "adapted")
    r = report.result
    assert r.heldout_bpb_after < r.heldout_bpb_before, r.history
    assert report.adapter_bytes < 8 * 2**20
    weights = report.checkpoint / "model.safetensors"
    assert hashlib.sha256(weights.read_bytes()).digest() == \
        hashlib.sha256((demo / "model.safetensors").read_bytes()).digest()
    a = load_checkpoint(demo, compute_dtype="float32")
    b = load_checkpoint(report.checkpoint, compute_dtype="float32")
    ids = a.tokenizers["262k"].encode("The quick brown fox jumps over the lazy dog.")
    ha, hb = forward_hidden(a, "262k", ids), forward_hidden(b, "262k", ids)
    assert torch.equal(a.model.head_logits("262k", ha), b.model.head_logits("262k", hb))
