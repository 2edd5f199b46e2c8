"""Real weights: `fetch_model` output against transformers' own GGUF load, greedy, token for token.

The checkpoint stores bf16 weights. Both sides run in float32 on the same bf16-rounded weights
(transformers' are rounded after its GGUF load), so a mismatch means a loader or backbone bug,
not bf16 arithmetic drift. Downloads are cached in $POLYHEAD_CACHE_DIR (else ~/.cache/polyhead)
so reruns on one machine skip them; a fresh machine fetches everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from heads.loaders.fetch import fetch_gguf, fetch_model
from heads.model.attention import AttentionMetadata, allocate_kv_cache, slots_for
from heads.model.multi_head import MultiHeadModel
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.cache_paths import cache_root

pytestmark = pytest.mark.model

BLOCK = 16
GEMMA_PROMPTS = ("Once upon a time", "def fibonacci(n):", "The capital of France is")
STEPS = 32


def greedy(model: MultiHeadModel, head: str, prompt: list[int], steps: int) -> list[int]:
    """Prefill, then `steps` decode steps through the paged cache in float32, argmax."""
    b = model.manifest.backbone
    n_blocks = (len(prompt) + steps) // BLOCK + 1
    kv = allocate_kv_cache(b.num_layers, n_blocks, BLOCK, b.num_kv_heads, b.head_dim,
                           torch.float32)
    table = list(range(n_blocks))[::-1]  # non-contiguous on purpose
    w = model.unembedding_rows(head)
    ids = list(prompt)
    meta = AttentionMetadata.prefill([len(ids)], torch.tensor(slots_for(table, 0, len(ids), BLOCK)))
    with torch.inference_mode():
        h = model(model.embed(head, torch.tensor(ids)), torch.arange(len(ids)), meta, kv)[-1]
        out: list[int] = []
        for _ in range(steps):
            out.append(int(torch.argmax(h @ w.T)))
            pos = len(ids) + len(out) - 1
            meta = AttentionMetadata.decode(
                torch.tensor(slots_for(table, pos, pos + 1, BLOCK)), torch.tensor([table]),
                torch.tensor([pos + 1]),
            )
            x = model.embed(head, torch.tensor(out[-1:]))
            h = model(x, torch.tensor([pos]), meta, kv)[0]
    return out


def hf_greedy(hf: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(  # type: ignore[operator]
            torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt):]]


def _hf_from_gguf(cls: Any, gguf: Path) -> torch.nn.Module:
    hf = cls.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return hf


def _fp32(ckpt: Checkpoint) -> MultiHeadModel:
    return ckpt.model.float()


@pytest.fixture(scope="module")
def cache() -> Path:
    return cache_root(expand_user=True)


@pytest.fixture(scope="module")
def gemma(cache: Path) -> tuple[Checkpoint, torch.nn.Module]:
    from transformers import Gemma3ForCausalLM

    ckpt = load_checkpoint(fetch_model("gemma3-270m", cache_dir=cache, progress=False))
    return ckpt, _hf_from_gguf(Gemma3ForCausalLM, fetch_gguf("gemma3-270m", cache, False))


def test_gemma_manifest(gemma) -> None:
    ckpt, _ = gemma
    m = ckpt.manifest
    assert m.dtype == "bfloat16" and m.backbone.architecture == "gemma3"
    (head,) = m.heads
    assert (head.name, head.vocab_size, head.bos_token_id) == ("262k", 262144, 2)
    assert 1 in head.eos_token_ids
    assert head.embedding == head.unembedding  # tied
    assert m.backbone.layer_types.count("full_attention") == 3
    assert ckpt.tokenizers["262k"].encode("Once upon a time")[0] != 2  # BOS is not added here


def test_gemma_weights_equal_transformers_gguf_load(gemma) -> None:
    ckpt, hf = gemma
    ours = ckpt.model.state_dict_for_save()
    theirs = hf.state_dict()
    assert torch.equal(ours["matrices.shared"].float(), theirs["model.embed_tokens.weight"])
    for k, v in ours.items():
        if k.startswith("backbone."):
            assert torch.equal(v.float(), theirs["model." + k.removeprefix("backbone.")]), k


def test_gemma_greedy_matches_transformers(gemma) -> None:
    ckpt, hf = gemma
    model, tok = _fp32(ckpt), ckpt.tokenizers["262k"]
    texts = {}
    for prompt in GEMMA_PROMPTS:
        ids = [2, *tok.encode(prompt)]  # <bos> first, as the gateway does
        ours = greedy(model, "262k", ids, STEPS)
        assert ours == hf_greedy(hf, ids, STEPS), prompt
        texts[prompt] = tok.decode(ours)
    print(texts)  # noqa: T201  (shown with -s, for reading the samples)
    assert "Lily" in texts["Once upon a time"] or "little" in texts["Once upon a time"]


def test_smollm2_greedy_matches_transformers(cache: Path) -> None:
    from transformers import LlamaForCausalLM

    ckpt = load_checkpoint(fetch_model("smollm2-135m", cache_dir=cache, progress=False))
    (head,) = ckpt.manifest.heads
    assert (head.name, head.vocab_size, head.bos_token_id) == ("49k", 49152, None)
    assert ckpt.manifest.chat_template and "<|im_start|>" in ckpt.manifest.chat_template
    hf = _hf_from_gguf(LlamaForCausalLM, fetch_gguf("smollm2-135m", cache, False))
    tok = ckpt.tokenizers["49k"]
    ids = tok.encode("The three primary colors are")
    ours = greedy(_fp32(ckpt), "49k", ids, 24)
    assert ours == hf_greedy(hf, ids, 24)
    print(repr(tok.decode(ours)))  # noqa: T201


def test_gemma_past_the_window_through_the_engine_matches_transformers(gemma) -> None:
    """A prompt longer than the 512-token window, through the engine with sliding-window KV
    (sliding layers hold only their window) and then again from the prefix cache: greedy
    tokens equal transformers' both times."""
    import asyncio

    from heads.engine.config import EngineConfig
    from heads.engine.llm_engine import LocalEngine
    from heads.engine.types import GenerationRequest
    from kernels.row_params import RowParams

    ckpt, hf = gemma
    tok = ckpt.tokenizers["262k"]
    model = MultiHeadModel(ckpt.manifest, ckpt.model.state_dict_for_save(), "float32")
    story = " ".join(f"Day {i}: the fox walked to the river and counted {i * 7} stones."
                     for i in range(40))
    ids = [2, *tok.encode(story)]
    assert len(ids) > 600
    steps = 16
    want = hf_greedy(hf, ids, steps)

    async def main() -> tuple[list[list[int]], list[int | None], int, int]:
        engine = LocalEngine(model, EngineConfig(num_kv_blocks=128))
        await engine.start()
        try:
            outs, cached = [], []
            for rid in ("cold", "warm"):
                req = GenerationRequest(rid, "262k", tuple(ids), steps,
                                        RowParams(temperature=0.0), frozenset())
                events = [e async for e in engine.generate(req)]
                outs.append([e.token_id for e in events])
                cached.append(events[0].cached_tokens)
            return outs, cached, engine.layout.num_groups, engine.layout.group_size
        finally:
            await engine.shutdown()

    outs, cached, groups, size = asyncio.run(main())
    assert (groups, size) == (6, 3)  # 1 full + 5 sliding groups of 3 layers
    assert outs == [want, want]
    assert cached[0] == 0 and cached[1] == (len(ids) - 1) // BLOCK * BLOCK
