"""Logprobs for evaluators from the local engine (tiny model): each prompt token's logprob,
rank and top-N, and each sampled token's top-N, against a full log-softmax over the head's
own rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from heads.engine.logprob_tops import position_logprobs
from heads.engine.types import GenerationRequest
from heads.model.adapter import HeadOutput
from heads.model.forward import forward_logits
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from tests.heads.engine.run_util import run_requests
from tests.heads.tiny import tiny_model

PROMPT = tuple(range(5, 36))  # 31 tokens: 30 predicted positions


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model()


def reference_logp(model: MultiHeadModel, head: str, ids: list[int]) -> torch.Tensor:
    # -> [len(ids), V] log-softmax over the head's rows of the logits after each token (fp32)
    ckpt = SimpleNamespace(model=model, manifest=model.manifest)
    return torch.log_softmax(forward_logits(ckpt, head, ids), dim=-1)




def request(head: str, rid: str = "r", top: int = 3, prompt_top: int | None = 5,
            max_tokens: int = 4, temperature: float = 0.0) -> GenerationRequest:
    return GenerationRequest(rid, head, PROMPT, max_tokens,
                             RowParams(temperature=temperature, seed=11), frozenset(), True,
                             top_logprobs=top, prompt_logprobs=prompt_top)


@pytest.mark.parametrize("head", ["1k", "128"])
def test_prompt_logprobs_match_full_log_softmax(model, head):
    (events,) = run_requests(model, request(head))
    lps = events[0].prompt_logprobs
    assert lps is not None and all(e.prompt_logprobs is None for e in events[1:])
    ref = reference_logp(model, head, list(PROMPT))[:-1]  # row p predicts PROMPT[p + 1]
    assert len(lps) == len(PROMPT) - 1
    for p, lp in enumerate(lps):
        target = PROMPT[p + 1]
        assert lp.logprob == pytest.approx(float(ref[p, target]), abs=1e-4)
        assert lp.rank == int((ref[p] > ref[p, target]).sum()) + 1
        values, ids = ref[p].topk(5)
        assert [i for i, _ in lp.top] == ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_sampled_tops_are_the_heads_own_distribution(model):
    (events,) = run_requests(model, request("128", max_tokens=5))
    ids = list(PROMPT)
    for e in events:
        ref = reference_logp(model, "128", ids)[-1]  # [V=128]
        assert e.top is not None and len(e.top.top) == 3
        assert all(i < 128 for i, _ in e.top.top)
        values, top_ids = ref.topk(3)
        assert [i for i, _ in e.top.top] == top_ids.tolist()
        assert e.top.top[0][0] == e.token_id  # greedy: the sampled token is the top one
        assert e.top.logprob == pytest.approx(float(ref[e.token_id]), abs=1e-4)
        assert e.logprob == pytest.approx(e.top.logprob, abs=1e-4)
        ids.append(e.token_id)


def test_mixed_batch_each_request_on_its_own_head(model):
    a, b, c = run_requests(model, request("1k", "a"), request("128", "b", top=0, prompt_top=None),
                  request("128", "c", top=2, prompt_top=0))
    assert a[0].prompt_logprobs is not None and a[0].top is not None
    assert b[0].prompt_logprobs is None and all(e.top is None for e in b)
    assert c[0].prompt_logprobs is not None and all(not lp.top for lp in c[0].prompt_logprobs)
    assert all(len(e.top.top) == 2 for e in c if e.top is not None)


def test_position_logprobs_odd_shapes():
    torch.manual_seed(0)
    for k, v, d in [(1, 7, 3), (67, 131, 5), (130, 50, 9)]:
        weight = torch.randn(v, d)
        hidden = torch.randn(k, d)
        targets = torch.randint(0, v, (k,))
        got = position_logprobs(hidden, HeadOutput(weight), targets, 4)
        ref = torch.log_softmax(hidden @ weight.T, dim=-1)
        for r in range(k):
            assert got[r].logprob == pytest.approx(float(ref[r, targets[r]]), abs=1e-5)
            assert [i for i, _ in got[r].top] == ref[r].topk(min(4, v)).indices.tolist()
