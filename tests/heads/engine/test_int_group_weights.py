"""The engine reading integer groups (weights=quantized) against the same values served as
plain weights: a model whose matrices are exactly its integer groups' values must write the same
greedy tokens and score a prompt alike, whichever bytes its products read. Also the
checkpoint file that carries the groups, with its sha256."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest
from heads.errors import CheckpointError
from heads.model.native import build
from heads.model.weights import INT_GROUPS_FILE, load_int_groups, save_checkpoint
from kernels import int_groups, precision
from kernels.int_groups import GROUP, IntGroups
from kernels.row_params import RowParams
from tests.heads.tiny import HEADS, tiny_model


def _quantise(w: torch.Tensor) -> IntGroups:
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    scales = g.abs().amax(-1) / 127
    values = torch.round(g / scales[..., None].clamp_min(1e-12)).to(torch.int8)
    return IntGroups(values.view(n, k), scales)


def _int8_model(with_groups: bool):
    """The tiny model with every matrix replaced by its integer groups' exact values."""
    model = tiny_model()
    with torch.no_grad():
        for name, p in [*model.backbone.named_parameters(prefix="backbone"),
                        ("matrices.shared", model.unembedding_rows("1k"))]:
            if p.dim() != 2:
                continue
            groups = _quantise(p.detach().float())
            p.copy_(groups.dequantize())
            if with_groups:
                model.int8[name] = groups
    return model


async def _serve(model, weights: str, int8_rows: int) -> tuple[dict, dict]:
    engine = LocalEngine(model, EngineConfig(kv_cache_bytes=8 << 20, weights=weights))
    assert engine._runner.int8_rows == int8_rows  # which bytes its products read
    await engine.start()
    tokens, nll = {}, {}
    try:
        for head in HEADS:
            req = GenerationRequest(head, head, (5, 6, 7, 9, 11, 3, 2), 10,
                                    RowParams(temperature=0.0), frozenset(), False, True, 0)
            events = [e async for e in engine.generate(req)]
            tokens[head] = [e.token_id for e in events]
            nll[head] = events[0].prompt_score.nll_nats
    finally:
        await engine.shutdown()
    return tokens, nll


@pytest.mark.skipif(not build.load() or not int_groups.gemv_available(),
                    reason="no int8 GEMV on this CPU")
def test_int8_products_serve_what_the_same_values_serve_as_floats() -> None:
    int8_model = _int8_model(with_groups=True)
    assert len(int8_model.int8) == 1 + 7 * 2  # the shared matrix, 7 projections per layer
    want_tokens, want_nll = asyncio.run(_serve(_int8_model(with_groups=False), "bf16", 0))
    got_tokens, got_nll = asyncio.run(_serve(int8_model, "quantized",
                                                    precision.EVERY_BATCH))
    assert got_tokens == want_tokens
    for head in HEADS:
        assert got_nll[head] == pytest.approx(want_nll[head], rel=1e-3)


def test_int8_file_round_trips_with_its_sha256(tmp_path) -> None:
    from heads.build.tiny import build_tiny
    from heads.manifest import Manifest

    src = tmp_path / "tiny"
    build_tiny(src)
    manifest = Manifest.load(src)
    from safetensors.torch import load_file

    tensors = load_file(str(src / manifest.weights))
    groups = {"matrices.shared": _quantise(tensors["matrices.shared"].float())}
    tokenizers = {h.tokenizer: (src / h.tokenizer).read_text() for h in manifest.heads}
    tokenizers.update({h.split_table: (src / h.split_table).read_bytes()
                       for h in manifest.heads if h.split_table})
    out = tmp_path / "with-int8"
    save_checkpoint(out, manifest, tensors, tokenizers, groups)
    saved = Manifest.load(out)
    assert saved.extra["int_groups"]["file"] == INT_GROUPS_FILE
    assert len(saved.extra["int_groups"]["sha256"]) == 64
    back = load_int_groups(out, saved)
    torch.testing.assert_close(back["matrices.shared"].dequantize(),
                               groups["matrices.shared"].dequantize())
    (out / INT_GROUPS_FILE).write_bytes((out / INT_GROUPS_FILE).read_bytes()[:-1] + b"\0")
    with pytest.raises(CheckpointError, match="sha256"):
        load_int_groups(out, saved)
    assert load_int_groups(out, dataclasses.replace(saved, extra={})) == {}
