"""The paged Gemma-3 backbone against transformers' Gemma3ForCausalLM, prefill and decode."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM

from heads.errors import CheckpointError
from heads.manifest import Manifest
from heads.model.attention import AttentionMetadata, allocate_kv_cache
from heads.model.multi_head import MultiHeadModel
from tests.heads.model.tiny_gemma3 import (
    LAYER_TYPES,
    WINDOW,
    V,
    hf_model,
    random_model,
    tiny_manifest,
)
from tests.heads.paged_oracle import BLOCK, check_cached_prefix, check_prefill_and_decode


@pytest.fixture(scope="module")
def models() -> tuple[MultiHeadModel, Gemma3ForCausalLM]:
    model = random_model()
    return model, hf_model(model)


def test_prefill_and_decode_match_transformers(models) -> None:
    model, hf = models
    check_prefill_and_decode(model, hf, V, (11, 7))



def test_prefill_after_a_cached_prefix_matches_transformers(models) -> None:
    """Prefix longer than the window, so the sliding mask spans cached and new keys."""
    model, hf = models
    check_cached_prefix(model, hf, V, (12, 0), (5, 9))

def test_window_changes_the_output(models) -> None:
    """Guards the test above: with a window wider than every sequence the logits differ."""
    model, _ = models
    wide = MultiHeadModel(tiny_manifest(sliding_window=64), model.state_dict_for_save())
    ids = torch.arange(11) * 7
    meta = AttentionMetadata.prefill([11], torch.arange(11))
    outs = []
    for m in (model, wide):
        b = m.manifest.backbone
        kv = allocate_kv_cache(b.num_layers, 4, BLOCK, b.num_kv_heads, b.head_dim, torch.float32)
        with torch.inference_mode():
            outs.append(m(m.embed("1k", ids), torch.arange(11), meta, kv))
    assert torch.allclose(outs[0][:WINDOW], outs[1][:WINDOW], atol=1e-5)
    assert not torch.allclose(outs[0][WINDOW:], outs[1][WINDOW:], atol=1e-3)


def test_manifest_round_trip_and_validation() -> None:
    m = tiny_manifest()
    again = Manifest.from_dict(__import__("json").loads(m.to_json()))
    assert again.backbone == m.backbone
    assert again.backbone.layer_types == LAYER_TYPES
    with pytest.raises(CheckpointError, match="layer_types"):
        tiny_manifest(layer_types=("sliding_attention",)).validate()
    with pytest.raises(CheckpointError, match="sliding_window"):
        tiny_manifest(sliding_window=None).validate()
    with pytest.raises(CheckpointError, match="layer_types"):
        raw = __import__("json").loads(m.to_json())
        raw["backbone"]["layer_types"] = [1, 2, 3, 4]
        Manifest.from_dict(raw)
    with pytest.raises(CheckpointError, match="softcapping"):
        MultiHeadModel.random(tiny_manifest(final_logit_softcapping=30.0), seed=0)


def test_sliding_kv_groups_match_transformers(models) -> None:
    """Through the engine's block manager and runner: sliding layers keep only their window's
    blocks (a prompt of 3 windows, then decode), and a second prompt reuses the first's
    cached prefix, sliding blocks included; every step's logits match transformers."""
    from heads.engine.block_manager import BlockManager
    from heads.engine.config import EngineConfig
    from heads.engine.model_runner import ModelRunner
    from heads.engine.sequence import Sequence
    from kernels.row_params import RowParams
    from tests.heads.paged_oracle import TOL, hf_logits

    model, hf = models
    # Unpacked projections: packing (on by default) would change the shared fixture model.
    cfg = EngineConfig(block_size=BLOCK, num_kv_blocks=16, cpu_packed_weights=False)
    layout = cfg.layout(model.manifest.backbone)
    assert layout.windows == (None, WINDOW, WINDOW, WINDOW) and layout.group_size == 1
    units = cfg.num_blocks(model.manifest.backbone, "float32")
    runner = ModelRunner(model, cfg, units)
    bm = BlockManager(units, BLOCK, True, layout)
    w = model.unembedding_rows("1k")
    gen = torch.Generator().manual_seed(5)

    def logits(seq: Sequence, prefill: bool) -> torch.Tensor:
        prep = runner._prepare_prefill if prefill else runner._prepare_decode
        ids, pos, metas, last = prep([seq])
        with torch.inference_mode():
            h = model(model.embed("1k", torch.tensor(ids)), torch.tensor(pos), metas,
                      runner.kv_cache)
        return h @ w.T

    prompt = torch.randint(0, V, (15,), generator=gen).tolist()
    first = Sequence("a", "1k", prompt, RowParams(temperature=0.0), max_tokens=10)
    bm.allocate(first)

    def held(seq: Sequence) -> list[int]:
        return [len([b for b in t if b != bm.pad]) for t in seq.block_tables]

    # The prefill writes every block (caching keeps the window before any later cut); the
    # sliding groups hand back all but blocks (15 - 5) // 4 = 2 on right after it.
    assert held(first) == [4, 4, 4, 4]
    torch.testing.assert_close(logits(first, True), hf_logits(hf, prompt), atol=TOL, rtol=0)
    first.output_ids.append(int(torch.randint(0, V, (1,), generator=gen)))
    bm.trim(first)  # the scheduler does this after each step
    assert held(first) == [4, 2, 2, 2]
    bm.may_append(first)
    torch.testing.assert_close(logits(first, False)[0], hf_logits(hf, first.token_ids)[-1],
                               atol=TOL, rtol=0)
    for _ in range(5):
        first.output_ids.append(int(torch.randint(0, V, (1,), generator=gen)))
        bm.may_append(first)
        want = hf_logits(hf, first.token_ids)[-1]
        torch.testing.assert_close(logits(first, False)[0], want, atol=TOL, rtol=0)
    assert held(first)[0] == 6 and max(held(first)[1:]) <= 3  # 21 tokens: a window sliding
    off = BlockManager(units, BLOCK, False, layout)  # without caching: never past the window
    plain = Sequence("c", "1k", prompt, RowParams(temperature=0.0), max_tokens=10)
    off.allocate(plain)
    assert [len([b for b in t if b != off.pad]) for t in plain.block_tables] == [4, 2, 2, 2]

    second = Sequence("b", "1k", first.token_ids[:16] + [7, 8, 9], RowParams(temperature=0.0),
                      max_tokens=4)
    bm.free(first)
    bm.allocate(second)
    assert second.num_cached_tokens == 16
    torch.testing.assert_close(logits(second, True), hf_logits(hf, second.token_ids)[16:],
                               atol=TOL, rtol=0)


def test_engine_output_is_the_same_with_and_without_sliding_kv(models) -> None:
    """Greedy decoding through the engine, prompts longer than the window, a shared prefix
    and a cache small enough to preempt: the same tokens whether sliding layers keep their
    window or every position, with the prefix cache on or off."""
    import asyncio

    from heads.engine.config import EngineConfig
    from heads.engine.llm_engine import LocalEngine
    from heads.engine.types import GenerationRequest
    from kernels.row_params import RowParams

    model = MultiHeadModel(models[0].manifest, models[0].state_dict_for_save())  # a copy
    base = tuple(range(40, 58))  # 18 tokens
    reqs = [GenerationRequest(str(i), "1k", base + (i + 3,), 14, RowParams(temperature=0.0),
                              frozenset()) for i in range(5)]

    async def collect(engine: LocalEngine, req: GenerationRequest) -> list[int]:
        return [e.token_id async for e in engine.generate(req)]

    def run(**config: object) -> tuple[list[list[int]], int]:
        async def main() -> tuple[list[list[int]], int]:
            engine = LocalEngine(model, EngineConfig(block_size=4, **config))  # type: ignore[arg-type]
            await engine.start()
            try:
                outs = await asyncio.gather(*(collect(engine, r) for r in reqs))
                return list(outs), engine._scheduler.num_preemptions
            finally:
                await engine.shutdown()
        return asyncio.run(main())

    want, _ = run(num_kv_blocks=64, sliding_window_kv=False, enable_prefix_caching=False)
    for sliding in (True, False):
        for caching in (True, False):
            out, _ = run(num_kv_blocks=64, sliding_window_kv=sliding,
                         enable_prefix_caching=caching)
            assert out == want, (sliding, caching)
    # Caches too small to hold all three at once: preemptions. Without caching a prefill
    # never holds more than the window, so a smaller cache still takes each request.
    for blocks, caching in ((9, True), (7, False)):
        out, preemptions = run(num_kv_blocks=blocks, sliding_window_kv=True,
                               enable_prefix_caching=caching)
        assert out == want and preemptions > 0, (blocks, caching, preemptions)
