"""The Gemma-3 backbone through the fused CPU ops (heads.model.gemma3_fused): transformers'
logits in fp32 through the paged cache, bf16 no worse than the eager bf16 forward, and the
engine's switch."""

from __future__ import annotations

import asyncio

import pytest
import torch

from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.model_runner import ModelRunner
from heads.engine.types import GenerationRequest
from heads.model.attention import AttentionMetadata, allocate_kv_cache, slots_for
from heads.model.multi_head import MultiHeadModel
from heads.model.native import build
from kernels.row_params import RowParams
from tests.heads.model.tiny_gemma3 import V, hf_model, random_model
from tests.heads.paged_oracle import BLOCK, check_cached_prefix, check_prefill_and_decode


@pytest.fixture(scope="module")
def base() -> MultiHeadModel:
    assert build.load(), "fused CPU ops did not build"
    return random_model()


def _copy(model: MultiHeadModel, fused: bool, dtype: str = "float32") -> MultiHeadModel:
    out = MultiHeadModel(model.manifest, model.state_dict_for_save(), compute_dtype=dtype)
    out.backbone.fused_ops = fused
    return out


def test_fused_forward_matches_transformers(base) -> None:
    fused = _copy(base, fused=True)
    hf = hf_model(base)
    check_prefill_and_decode(fused, hf, V, (11, 7))  # past the window of 5, across blocks
    check_cached_prefix(fused, hf, V, (12, 0), (5, 9))


def _steps(model: MultiHeadModel, dtype: torch.dtype) -> list[torch.Tensor]:
    # Two prompts prefilled together, then 8 decode steps: every step's logits, fp32 [B, V]
    b = model.manifest.backbone
    kv = allocate_kv_cache(b.num_layers, 32, BLOCK, b.num_kv_heads, b.head_dim, dtype)
    w = model.unembedding_rows("1k").float()
    gen = torch.Generator().manual_seed(4)
    lens = (11, 6)  # + 8 decode steps: 19 tokens, inside 5 blocks of 4
    tables = [[7, 2, 30, 11, 5, 19], [3, 25, 0, 14, 9]]
    seqs = [torch.randint(0, V, (n,), generator=gen).tolist() for n in lens]
    slots = [s for t, n in zip(tables, lens, strict=True) for s in slots_for(t, 0, n, BLOCK)]
    meta = AttentionMetadata.prefill(list(lens), torch.tensor(slots))
    out = []
    with torch.inference_mode():
        h = model(model.embed("1k", torch.tensor(seqs[0] + seqs[1])),
                  torch.tensor([p for n in lens for p in range(n)]), meta, kv)
        out.append(h.float() @ w.T)
        for _ in range(8):
            nxt = [int(torch.randint(0, V, (1,), generator=gen)) for _ in seqs]
            for s, t in zip(seqs, nxt, strict=True):
                s.append(t)
            pos = [len(s) - 1 for s in seqs]
            meta = AttentionMetadata.decode(
                torch.tensor([slots_for(t, p, p + 1, BLOCK)[0]
                              for t, p in zip(tables, pos, strict=True)]),
                torch.tensor([t[:5] for t in tables]), torch.tensor([len(s) for s in seqs]))
            h = model(model.embed("1k", torch.tensor(nxt)), torch.tensor(pos), meta, kv)
            out.append(h.float() @ w.T)
    return out


def test_bf16_fused_is_no_worse_than_bf16_eager(base) -> None:
    """Against the fp32 forward, the fused bf16 forward's logit error is within the eager bf16
    forward's own (both round to bf16 at the same points; only fp32 summation order differs,
    so neither is systematically closer)."""
    want = _steps(_copy(base, fused=False), torch.float32)
    eager = _steps(_copy(base, fused=False, dtype="bfloat16"), torch.bfloat16)
    fused = _steps(_copy(base, fused=True, dtype="bfloat16"), torch.bfloat16)
    for i, (w, e, f) in enumerate(zip(want, eager, fused, strict=True)):
        err_eager, err_fused = (e - w).abs().max().item(), (f - w).abs().max().item()
        assert err_eager > 0  # bf16 does differ from fp32: the comparison means something
        assert err_fused <= 1.25 * err_eager + 0.02 * w.abs().max().item(), (i, err_fused,
                                                                              err_eager)


def test_the_engine_switches_the_fused_ops(base) -> None:
    on = _copy(base, fused=False)
    ModelRunner(on, EngineConfig(block_size=BLOCK, num_kv_blocks=16), 16)
    assert on.backbone.fused_ops
    off = _copy(base, fused=False)
    ModelRunner(off, EngineConfig(block_size=BLOCK, num_kv_blocks=16, cpu_fused_ops=False), 16)
    assert not off.backbone.fused_ops


def test_engine_tokens_are_the_same_fused_or_eager(base) -> None:
    """Greedy decoding through the engine (packed projections, sliding KV, prefix cache, a
    batch of 4): the same tokens with the fused ops as with the eager ones, in fp32."""
    prompts = [tuple(range(40, 52)) + (i,) for i in range(4)]

    def run(fused: bool) -> list[list[int]]:
        model = _copy(base, fused=False)

        async def main() -> list[list[int]]:
            engine = LocalEngine(model, EngineConfig(block_size=BLOCK, num_kv_blocks=64,
                                                     cpu_fused_ops=fused))
            await engine.start()
            try:
                async def one(i: int, p: tuple[int, ...]) -> list[int]:
                    req = GenerationRequest(str(i), "1k", p, 12, RowParams(temperature=0.0),
                                            frozenset())
                    return [e.token_id async for e in engine.generate(req)]
                return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
            finally:
                await engine.shutdown()
        out = asyncio.run(main())
        assert model.backbone.fused_ops == fused
        return out

    eager = run(False)
    assert len({tuple(x) for x in eager}) > 1  # distinct continuations, not one repeated
    assert run(True) == eager
