"""Live prompt NLL from the engine's prefill against a full log-softmax reference (tiny model)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from heads.engine.prompt_score import pick_positions, token_nll
from heads.engine.types import GenerationRequest, PromptScore
from heads.model.adapter import HeadOutput
from heads.model.forward import forward_logits
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from tests.heads.engine.run_util import run_requests
from tests.heads.tiny import tiny_model

PROMPT = tuple(range(3, 43))  # 40 tokens: 39 predicted positions


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model()


def reference_nll(model: MultiHeadModel, head: str, ids: tuple[int, ...]) -> torch.Tensor:
    # -> [len(ids) - 1] NLL in nats of ids[1:], from full-vocabulary log-softmax (fp32)
    ckpt = SimpleNamespace(model=model, manifest=model.manifest)
    logp = torch.log_softmax(forward_logits(ckpt, head, list(ids)), dim=-1)  # [T, V]
    return -logp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def _req(head: str, prompt: tuple[int, ...], positions: int = 0, seed: int = 7,
         score: bool = True, rid: str = "r") -> GenerationRequest:
    return GenerationRequest(rid, head, prompt, 2, RowParams(temperature=0.0, seed=seed),
                             frozenset(), False, score, positions)




@pytest.mark.parametrize("head", ["1k", "128"])
def test_exact_score_matches_full_log_softmax(model: MultiHeadModel, head: str):
    (events,) = run_requests(model, _req(head, PROMPT))
    score = events[0].prompt_score
    assert score is not None and all(e.prompt_score is None for e in events[1:])
    ref = reference_nll(model, head, PROMPT)
    assert (score.predicted, score.scored) == (39, 39)
    assert score.nll_nats == pytest.approx(float(ref.sum()), rel=1e-4)


def test_sampled_score_is_the_scaled_sum_at_the_drawn_positions(model: MultiHeadModel):
    (events,) = run_requests(model, _req("1k", PROMPT, positions=8, seed=123))
    score = events[0].prompt_score
    assert score is not None and (score.predicted, score.scored) == (39, 8)
    picked = pick_positions(39, 8, random.Random(123))
    ref = reference_nll(model, "1k", PROMPT)[picked]
    assert score.nll_nats == pytest.approx(float(ref.sum()) * 39 / 8, rel=1e-4)


def test_mixed_head_batch_scores_each_prompt_with_its_own_head(model: MultiHeadModel):
    a, b = PROMPT[:17], tuple(range(50, 75))
    ev = run_requests(model, _req("1k", a, rid="a"), _req("400", b, rid="b"),
              _req("128", (5, 6, 7), score=False, rid="c"))
    for events, head, ids in ((ev[0], "1k", a), (ev[1], "400", b)):
        score = events[0].prompt_score
        assert score is not None
        assert score.nll_nats == pytest.approx(float(reference_nll(model, head, ids).sum()),
                                               rel=1e-4)
    assert all(e.prompt_score is None for e in ev[2])


def test_sampling_positions_is_unbiased():
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(50, 16, generator=gen), torch.randn(300, 16, generator=gen)
    targets = torch.randint(0, 300, (50,), generator=gen)
    nll = token_nll(hidden, HeadOutput(weight), targets)  # [50]
    exact = float(nll.sum())
    estimates = [float(nll[pick_positions(50, 10, random.Random(s))].sum()) * 5
                 for s in range(4000)]
    mean = sum(estimates) / len(estimates)
    sd = math.sqrt(sum((e - mean) ** 2 for e in estimates) / len(estimates))
    assert abs(mean - exact) < 4 * sd / math.sqrt(len(estimates))


def test_chunked_nll_matches_one_log_softmax():
    gen = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(150, 8, generator=gen), torch.randn(40, 8, generator=gen)
    targets = torch.randint(0, 40, (150,), generator=gen)
    ref = -torch.log_softmax(hidden @ weight.T, -1).gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(token_nll(hidden, HeadOutput(weight), targets), ref,
                               rtol=1e-5, atol=1e-5)


def test_bpb_divides_bits_by_bytes():
    s = PromptScore(nll_nats=10 * math.log(2), predicted=5, scored=5)
    assert s.bpb(20) == pytest.approx(0.5)
    assert PromptScore(0.0, 0, 0).bpb(3) is None and s.bpb(0) is None


@pytest.mark.slow
def test_bench_runs_in_quick_mode(tiny_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "heads.bench.prompt_bpb", str(tiny_model_dir),
                           "--repeats", "1", "--positions", "4", "--out", str(out)],
                          cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert {r["prompt"] for r in rows} == {"prose", "code", "random"}
    assert all(r["overhead_exact"] >= 0 and r["bpb_exact"] > 0 for r in rows)
