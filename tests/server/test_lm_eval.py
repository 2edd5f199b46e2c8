"""lm-eval-harness (`local-completions`, remote tokenizer) against a real polyhead process on
the tiny model, one pinned head at a time through its `/heads/{head}` prefix: a multiple-choice
task and a perplexity task on local data. Its loglikelihoods equal polyhead's in-process
scoring of the same ids, and its bits per byte equal `heads eval` on the same text."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from heads.data.files import WIKI_SAMPLE_A
from heads.eval.measure import byte_windows, evaluate
from heads.model.forward import forward_logits
from heads.model.weights import Checkpoint, load_checkpoint
from tests.conftest import Gateway, start_gateway, stop_gateway

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

DATA = Path(__file__).parent / "lm_eval_data"
WINDOW_BYTES = 256
HEADS = ("1k", "4k", "8k")


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir: Path) -> Checkpoint:
    return load_checkpoint(tiny_model_dir, compute_dtype="float32")


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway in fp32, as the in-process reference scores (the default is bf16 where the
    CPU has a bf16 GEMM, whose logits round to 8 bits: equal to 1e-4 only in fp32)."""
    tmp = tmp_path_factory.mktemp("lm-eval-gw")
    gw = start_gateway(tiny_model_dir, tmp / "gateway.log", POLYHEAD_COMPUTE_DTYPE="float32",
                       POLYHEAD_CACHE_DIR=str(tmp / "cache"))
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="module")
def ppl_text(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """About 1 KB of wiki prose as one document, and the file `heads eval` reads it from."""
    words = " ".join(WIKI_SAMPLE_A.read_text().split()).split(" ")
    text = ""
    while len((text + " " + words[0]).encode()) < 1000:
        text = f"{text} {words.pop(0)}".strip()
    path = tmp_path_factory.mktemp("ppl") / "wiki.txt"
    path.write_text(text)  # one paragraph: heads eval reads exactly this text
    return text, path


@pytest.fixture(scope="module")
def tasks(ppl_text, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    docs = out / "ppl.jsonl"
    docs.write_text("".join(json.dumps({"text": p}) + "\n"
                            for p in byte_windows(ppl_text[0], WINDOW_BYTES)))
    (out / "polyhead_mc.yaml").write_text(f"""task: polyhead_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {DATA / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    (out / "polyhead_ppl.yaml").write_text(f"""task: polyhead_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
""")
    return out


def run_lm_eval(url: str, head: str, tasks: Path, bos: int, monkeypatch) -> dict:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": "tiny", "base_url": f"{url}/heads/{head}/v1/completions",
                    "tokenizer_backend": "remote", "tokenized_requests": True,
                    "num_concurrent": 1, "max_retries": 1, "max_length": 512,
                    # lm-eval takes `bos_token_id or eos_token_id`: the tiny model's BOS is
                    # id 0, so it is named outright (Gemma's, 2, needs no help).
                    "custom_prefix_token_id": bos},
        tasks=["polyhead_mc", "polyhead_ppl"], task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True, batch_size=4)


def loglikelihood(ckpt: Checkpoint, head: str, context: list[int], cont: list[int]) -> float:
    """Σ log p(cont | context) from a full log-softmax over the head's rows (fp32)."""
    ids = context + cont
    logp = torch.log_softmax(forward_logits(ckpt, head, ids), dim=-1)  # [T, V]
    return sum(float(logp[len(context) + i - 1, t]) for i, t in enumerate(cont))


@pytest.mark.parametrize("head", HEADS)
def test_lm_eval_matches_in_process_scoring(gateway, ckpt, tasks, ppl_text, head,
                                            monkeypatch):
    bos = ckpt.manifest.head(head).bos_token_id
    results = run_lm_eval(gateway.url, head, tasks, bos, monkeypatch)
    tok = ckpt.tokenizers[head]
    correct = 0
    samples = results["samples"]["polyhead_mc"]
    assert len(samples) == 10
    for s in samples:
        doc = s["doc"]
        ctx = tok.encode(doc["question"])  # what lm-eval's remote tokenizer got back
        lls = []
        for choice, resp in zip(doc["choices"], s["resps"], strict=True):
            whole = tok.encode(f"{doc['question']} {choice}")
            ref = loglikelihood(ckpt, head, ctx, whole[len(ctx):])
            assert resp[0][0] == pytest.approx(ref, abs=1e-4)
            lls.append(ref)
        correct += max(range(len(lls)), key=lls.__getitem__) == doc["answer"]
    assert results["results"]["polyhead_mc"]["acc,none"] == pytest.approx(correct / 10)

    text, path = ppl_text
    (ref,) = evaluate(ckpt, [path], max_bytes=10**6, window=512, window_bytes=WINDOW_BYTES,
                      only=[head])
    bpb = results["results"]["polyhead_ppl"]["bits_per_byte,none"]
    assert ref.bytes == len(text.encode())
    # The side-by-side a reader wants, in the -s / -rP output.
    acc = results["results"]["polyhead_mc"]["acc,none"]
    print(f"\nlm-eval {head}: acc {acc:.2f} (in-process {correct / 10:.2f}); "  # noqa: T201
          f"bits/byte {bpb:.5f} (heads eval {ref.bpb:.5f})")
    assert bpb == pytest.approx(ref.bpb, rel=1e-5)
    assert math.isfinite(bpb)
