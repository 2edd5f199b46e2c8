"""A split head's two-level reading served by the local engine (heads.engine.grouped_reading):
greedy tokens and logprobs equal a dense two-level computation over every native row, a
mixed batch gives each row what it gets alone, sampling follows the reading's distribution
(χ²), and what the reading cannot serve is refused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from heads.engine.grouped_reading import GroupedReading
from heads.engine.types import GenerationRequest, LogitRules, TokenEvent
from heads.errors import EngineUnsupported
from heads.model.forward import forward_hidden
from heads.model.multi_head import MultiHeadModel
from heads.model.weights import Checkpoint
from heads.vocab.piece_groups import PieceGroups
from heads.vocab.split_table import SplitTable
from kernels.reference import sample_from_logits
from kernels.row_params import RowParams
from kernels.sampling_params import SamplingBatch
from tests.heads.engine.run_util import run_requests
from tests.heads.tiny import HEADS, tiny_model

HEAD, NATIVE = "128", "1k"
GREEDY = RowParams(temperature=0.0)


def _groups(v: int, n: int, seed: int = 0) -> PieceGroups:
    """A split table spelling each removed id t in [v, n) as 1-3 random kept pieces."""
    rng = np.random.default_rng(seed)
    spell = [[t] for t in range(v)] + [list(rng.integers(0, v, rng.integers(1, 4)))
                                        for _ in range(v, n)]
    # A few pieces lead many removed ids, as "▁" does on a real head.
    for t in range(v, n, 7):
        spell[t][0] = 5
    offsets = np.cumsum([0] + [len(s) for s in spell]).astype(np.int64)
    pieces = np.array([p for s in spell for p in s], dtype=np.int32)
    return PieceGroups.from_split(SplitTable(offsets, pieces, v, "test"))


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model(seed=2)


@pytest.fixture(scope="module")
def reading() -> GroupedReading:
    return GroupedReading.of(HEAD, _groups(HEADS[HEAD], HEADS[NATIVE]))


def _serve(model: MultiHeadModel, reading: GroupedReading, reqs: list[GenerationRequest],
           nested: str = "auto") -> list[list[TokenEvent]]:
    try:
        return run_requests(model, *reqs, num_kv_blocks=96, readings=[reading],
                            nested_heads=nested)
    finally:  # the module's model serves the next test afresh
        model.heads.pop(reading.name)
        model._readings.pop(reading.name)


def _req(rid: str, head: str, prompt: tuple[int, ...], n: int, params: RowParams,
         **kw: object) -> GenerationRequest:
    return GenerationRequest(rid, head, prompt, n, params, frozenset(), want_logprobs=True,
                             **kw)  # type: ignore[arg-type]


def _dense_greedy(model: MultiHeadModel, reading: GroupedReading, prompt: list[int],
                  n: int) -> tuple[list[int], list[float]]:
    """Argmax of level 1 over W[:V], then of level 2 over the group's native rows, from a
    fresh full forward each step; logprob = log P1(p) + log P2(t | p)."""
    ckpt = Checkpoint(Path("."), model.manifest, model, {})
    w = model.unembedding_rows(NATIVE).float()
    ids, toks, lps = list(prompt), [], []
    for _ in range(n):
        h = forward_hidden(ckpt, NATIVE, ids)[-1].float()  # [d]
        l1 = torch.log_softmax(w[:reading.vocab] @ h, 0)
        p = int(torch.argmax(l1))
        group = reading.members[reading.offsets[p]:reading.offsets[p + 1]]
        l2 = torch.log_softmax(w[group] @ h, 0)
        k = int(torch.argmax(l2))
        toks.append(int(group[k]))
        lps.append(float(l1[p] + l2[k]))
        ids.append(toks[-1])
    return toks, lps


def test_greedy_tokens_and_logprobs_equal_a_dense_two_level_reading(model, reading) -> None:
    prompt = (900, 800, 5, 5)
    [events] = _serve(model, reading, [_req("a", reading.name, prompt, 12, GREEDY)])
    toks, lps = _dense_greedy(model, reading, list(prompt), 12)
    assert [e.token_id for e in events] == toks
    assert any(t >= HEADS[HEAD] for t in toks)  # it emitted removed native ids
    for e, lp in zip(events, lps, strict=True):
        assert e.logprob is not None and math.isclose(e.logprob, lp, abs_tol=1e-3)


def _mixed() -> list[GenerationRequest]:
    params = [GREEDY, RowParams(temperature=0.9, seed=11),
              RowParams(temperature=1.2, top_k=30, seed=12)]
    heads = [HEAD + "+groups", NATIVE, HEAD, "400", HEAD + "+groups", HEAD + "+groups"]
    return [_req(str(i), h, tuple(range(2 + i, 8 + 2 * i)), 10, params[i % 3])
            for i, h in enumerate(heads)]


@pytest.mark.parametrize("nested", ["always", "never"])
def test_a_mixed_batch_gives_each_row_what_it_gets_alone(model, reading, nested) -> None:
    together = _serve(model, reading, _mixed(), nested)
    for req, got in zip(_mixed(), together, strict=True):
        [alone] = _serve(model, reading, [req], nested)
        assert [e.token_id for e in got] == [e.token_id for e in alone]
        for a, b in zip(got, alone, strict=True):
            assert a.logprob is not None and b.logprob is not None
            assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4)


def test_sampling_follows_the_two_level_distribution(reading) -> None:
    """χ² of 20,000 seeded draws against P(t) = P1(p(t)) · P2(t | p(t)) at T = 0.8."""
    g = torch.Generator().manual_seed(0)
    v, n, d, temp, draws = HEADS[HEAD], HEADS[NATIVE], 8, 0.8, 20_000
    w = torch.randn(n, d, generator=g)
    h = torch.randn(1, d, generator=g)
    batch = SamplingBatch(torch.full((draws,), temp), torch.ones(draws),
                          torch.zeros(draws, dtype=torch.int64), torch.arange(draws),
                          torch.full((draws,), 5, dtype=torch.int64), want_logprobs=True)
    hs = h.expand(draws, d)
    first = sample_from_logits(hs @ w[:v].T, batch)
    from heads.model.adapter import HeadOutput

    out = reading.second_level(HeadOutput(w), hs, first, batch)
    piece = torch.from_numpy(_groups(v, n).piece)
    logits = (h @ w.T)[0] / temp
    p1 = torch.softmax(logits[:v], 0)[piece]
    p2 = torch.empty(n)
    for p in range(v):
        group = reading.members[reading.offsets[p]:reading.offsets[p + 1]]
        p2[group] = torch.softmax(logits[group], 0)
    exact = (p1 * p2).double()
    assert math.isclose(float(exact.sum()), 1.0, abs_tol=1e-6)
    obs = torch.bincount(out.token_ids, minlength=n).double()
    keep = exact * draws >= 5  # χ² needs expected counts of 5 or more; pool the rest
    o = torch.cat([obs[keep], obs[~keep].sum()[None]])
    e = torch.cat([exact[keep], exact[~keep].sum()[None]])
    e = e / e.sum() * draws  # float32 rounding left the sum 1e-7 off
    assert stats.chisquare(o.numpy(), e.numpy()).pvalue > 1e-3
    # The logprob is the reading's own at T = 1, not the tempered one.
    t1 = torch.softmax((h @ w.T)[0][:v], 0)[piece]
    t2 = torch.empty(n)
    for p in range(v):
        group = reading.members[reading.offsets[p]:reading.offsets[p + 1]]
        t2[group] = torch.softmax((h @ w.T)[0][group], 0)
    assert out.logprobs is not None
    want = torch.log(t1 * t2)[out.token_ids[:50]]
    assert torch.allclose(out.logprobs[:50], want, atol=1e-4)


@pytest.mark.parametrize("ask", [
    {"top_logprobs": 2}, {"prompt_logprobs": 1}, {"score_prompt": True},
    {"rules": LogitRules(logit_bias=((3, 2.0),))},
])
def test_what_the_reading_cannot_serve_is_refused(model, reading, ask) -> None:
    with pytest.raises(EngineUnsupported, match=r"128\+groups"):
        _serve(model, reading, [_req("r", reading.name, (3, 4), 2, GREEDY, **ask)])
