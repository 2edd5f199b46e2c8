"""Exact drafting (heads.engine.drafting): a reading drafts, the native head verifies, and
the client gets the native head's own output token for token: greedy, seeded sampling with
top-k / top-p, stop ids, max_tokens, preemption by recompute, and a χ² test of the sampled
tokens against the native distribution."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import TypeVar

import pytest
import torch
from scipy.stats import chi2

from heads.engine.config import EngineConfig
from heads.engine.drafting import (
    DraftPlanner,
    StepCosts,
    accepted_prefix,
    expected_tokens,
)
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import DraftTally, GenerationRequest, TokenEvent
from heads.errors import EngineError
from heads.model.forward import forward_logits
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from tests.heads.engine.run_util import run_requests
from tests.heads.engine.test_grouped_reading import _groups
from tests.heads.tiny import HEADS, tiny_model

SMALL, MID, NATIVE = "128", "400", "1k"
T = TypeVar("T")
PROMPTS = [tuple(range(500, 520)), (7, 300, 12, 999, 4), tuple(range(40, 52)), (600,)]


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model(seed=5)


@pytest.fixture(scope="module")
def readings() -> list[GroupedReading]:
    return [GroupedReading.of(h, _groups(HEADS[h], HEADS[NATIVE], seed=i))
            for i, h in enumerate((SMALL, MID))]


def _serve(model: MultiHeadModel, readings: list[GroupedReading],
           *reqs: GenerationRequest, **config: int) -> list[list[TokenEvent]]:
    """Every request's events. Drafting runs at a fixed k unless told otherwise: on the
    tiny model every head's step costs the same, so the priced k would be 0."""
    config.setdefault("num_draft_tokens", 4)
    try:
        return run_requests(model, *reqs, readings=readings, **config)
    finally:  # the module's model serves the next test afresh
        for r in readings:
            model.heads.pop(r.name)
            model._readings.pop(r.name)


def _on_engine(model: MultiHeadModel, readings: list[GroupedReading],
               go: Callable[[LocalEngine], Awaitable[T]], **config: int) -> T:
    """`go` run on one started engine (requests in turn share its state), then shut down."""
    async def run() -> T:
        engine = LocalEngine(model, EngineConfig(num_kv_blocks=64, **config),
                             readings=readings)
        await engine.start()
        try:
            return await go(engine)
        finally:
            await engine.shutdown()

    try:
        return asyncio.run(run())
    finally:
        for r in readings:
            model.heads.pop(r.name)
            model._readings.pop(r.name)


def _req(rid: str, prompt: tuple[int, ...], n: int, params: RowParams,
         drafter: str | None = None, **kw: object) -> GenerationRequest:
    return GenerationRequest(rid, NATIVE, prompt, n, params, kw.pop("stops", frozenset()),
                             drafter=drafter, **kw)  # type: ignore[arg-type]


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events]


@pytest.mark.parametrize("params", [
    RowParams(temperature=0.0),
    RowParams(temperature=0.9, seed=11),
    RowParams(temperature=1.0, top_k=20, seed=3),
    RowParams(temperature=0.7, top_p=0.8, seed=8),
], ids=["greedy", "sampled", "top_k", "top_p"])
@pytest.mark.parametrize("drafter", [SMALL, MID])
def test_drafted_output_is_the_native_heads(model: MultiHeadModel,
                                            readings: list[GroupedReading],
                                            params: RowParams, drafter: str) -> None:
    name = drafter + "+groups"
    native = _serve(model, readings, *(_req(f"n{i}", p, 24, params)
                                       for i, p in enumerate(PROMPTS)))
    drafted = _serve(model, readings, *(_req(f"d{i}", p, 24, params, name)
                                        for i, p in enumerate(PROMPTS)))
    for a, b in zip(native, drafted, strict=True):
        assert _tokens(b) == _tokens(a)
        assert [e.finish_reason for e in b] == [e.finish_reason for e in a]


def test_the_engine_drafts_verifies_and_counts(model: MultiHeadModel,
                                              readings: list[GroupedReading]) -> None:
    async def go(engine: LocalEngine) -> tuple[list[int], dict[str, DraftTally], int]:
        req = _req("d", PROMPTS[0], 40, RowParams(temperature=0.0), MID + "+groups")
        toks = [e.token_id async for e in engine.generate(req)]
        return toks, engine.drafting_tallies(), engine.draft_k()

    toks, tallies, k = _on_engine(model, readings, go, num_draft_tokens=5)
    t = tallies[MID + "+groups"]
    assert len(toks) == 40 and 0 < t.accepted <= t.drafted and k == 5
    assert 40 / 6 <= t.verifies < 40 and t.committed >= 40 and t.verify_seconds > 0


def test_a_lone_request_and_logprobs_match_native(model: MultiHeadModel,
                                                  readings: list[GroupedReading]) -> None:
    params = RowParams(temperature=0.8, seed=21)
    [native] = _serve(model, readings, _req("n", PROMPTS[0], 40, params, want_logprobs=True))
    [drafted] = _serve(model, readings, _req("d", PROMPTS[0], 40, params, SMALL + "+groups",
                                             want_logprobs=True))
    assert _tokens(drafted) == _tokens(native)
    for a, b in zip(native, drafted, strict=True):  # from the verifying native logits
        assert a.logprob is not None and b.logprob is not None
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4)
    assert drafted[0].cached_tokens is not None and drafted[1].cached_tokens is None


def test_stop_ids_and_max_tokens_end_where_native_ends(model: MultiHeadModel,
                                                       readings: list[GroupedReading]) -> None:
    params = RowParams(temperature=0.0)
    [free] = _serve(model, readings, _req("n", PROMPTS[1], 30, params))
    stop = _tokens(free)[9]  # a token native decoding writes at position 9
    reqs = [_req("s", PROMPTS[1], 30, params, stops=frozenset({stop})),
            _req("m", PROMPTS[1], 7, params)]
    native = _serve(model, readings, *reqs)
    drafted = _serve(model, readings, *(GenerationRequest(
        r.request_id, r.head, r.prompt_ids, r.max_tokens, r.sampling, r.stop_token_ids,
        drafter=MID + "+groups") for r in reqs))
    for a, b in zip(native, drafted, strict=True):
        assert _tokens(b) == _tokens(a)
        assert b[-1].finish_reason == a[-1].finish_reason
    assert drafted[0][-1].finish_reason == "stop" and _tokens(drafted[0])[-1] == stop
    assert len(drafted[1]) == 7 and drafted[1][-1].finish_reason == "length"


def test_preemption_recomputes_from_verified_tokens(model: MultiHeadModel,
                                                    readings: list[GroupedReading]) -> None:
    # 10 blocks of 16 tokens for 4 sequences of up to 20 + 48 tokens: decode preempts
    params = RowParams(temperature=0.9, seed=2)
    reqs = [_req(f"r{i}", p, 48, params) for i, p in enumerate(PROMPTS)]
    native = _serve(model, readings, *reqs, num_kv_blocks=64)
    drafted = _serve(model, readings, *(GenerationRequest(
        r.request_id, r.head, r.prompt_ids, r.max_tokens, r.sampling, r.stop_token_ids,
        drafter=SMALL + "+groups") for r in reqs), num_kv_blocks=10)
    for a, b in zip(native, drafted, strict=True):
        assert _tokens(b) == _tokens(a)


def test_drafting_needs_the_native_head_and_a_served_reading(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    bad = [GenerationRequest("a", SMALL, (5,), 4, RowParams(), frozenset(),
                             drafter=SMALL + "+groups"),
           GenerationRequest("b", NATIVE, (5,), 4, RowParams(), frozenset(),
                             drafter="nope")]
    for req in bad:
        with pytest.raises(EngineError, match="exact drafting"):
            _serve(model, readings, req)


def test_sampled_tokens_follow_the_native_distribution(model: MultiHeadModel,
                                                       readings: list[GroupedReading]) -> None:
    # The third token of each sequence was drafted (k > 2 on a fresh engine) and verified.
    # Given the same two tokens before it, its empirical distribution over many seeds is
    # the native head's softmax (χ² over the likely tokens, the rest pooled).
    prompt = PROMPTS[2]
    [greedy] = _serve(model, readings, _req("g", prompt, 2, RowParams(temperature=0.0)))
    prefix = prompt + tuple(_tokens(greedy))
    # The tiny model's logits are close together: a low temperature spreads them over a
    # few dozen likely tokens, so 600 samples can tell a wrong distribution apart.
    temperature = 0.05
    reqs = [_req(f"s{i}", prefix, 3, RowParams(temperature=temperature, seed=1000 + i),
                 SMALL + "+groups") for i in range(600)]
    firsts = [_tokens(e)[0] for e in _serve(model, readings, *reqs, max_num_seqs=64,
                                            num_kv_blocks=512)]
    with torch.inference_mode():
        probs = _native_probs(model, prefix, temperature)
    likely = [t for t in range(len(probs)) if probs[t] * len(firsts) >= 5]
    observed = [firsts.count(t) for t in likely]
    expected = [float(probs[t]) * len(firsts) for t in likely]
    rest = len(firsts) - sum(observed)
    rest_expected = len(firsts) - sum(expected)
    if rest_expected >= 5:
        observed.append(rest)
        expected.append(rest_expected)
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert len(expected) >= 3
    assert stat < chi2.ppf(0.999, len(expected) - 1), (stat, observed, expected)


def _native_probs(model: MultiHeadModel, prefix: tuple[int, ...], temperature: float
                  ) -> torch.Tensor:
    """The native head's sampling distribution after `prefix` at `temperature`, from a
    plain forward of the model (no engine)."""
    ckpt = SimpleNamespace(model=model, manifest=model.manifest)
    logits = forward_logits(ckpt, NATIVE, list(prefix))[-1].float()  # [V]
    return torch.softmax(logits / temperature, dim=-1)


def test_accepted_prefix_and_expected_tokens() -> None:
    assert accepted_prefix([1, 2, 3], [1, 2, 4, 9]) == 2
    assert accepted_prefix([1, 2, 3], [1, 2, 3, 9]) == 3
    assert accepted_prefix([], [5]) == 0
    assert expected_tokens(0.5, 0) == 1.0
    assert math.isclose(expected_tokens(0.5, 3), 1 + 0.5 + 0.25 + 0.125)


def test_k_follows_measured_costs_and_acceptance() -> None:
    costs = StepCosts()
    # batch 1: drafting costs half a native step, a verify of 5 rows 1.05 native steps
    costs.observe("d", 1, 0, 0.010)
    costs.observe("d", 1, 1, 0.020)
    for rows in range(2, 9):
        costs.observe("d", 1, rows, 0.020 + 0.0005 * rows)
    planner = DraftPlanner(costs)
    assert planner.choose_k("d", 1, [0.9]) >= 3
    assert planner.choose_k("d", 1, [0.05]) == 0  # rejections waste the drafting steps
    # batch 16: the verify is compute-bound (cost grows with the rows): native wins
    costs.observe("d", 16, 0, 0.030)
    costs.observe("d", 16, 16, 0.040)
    costs.observe("d", 16, 64, 0.160)
    costs.observe("d", 16, 128, 0.320)
    assert planner.choose_k("d", 16, [0.9] * 16) == 0
    assert planner.break_even("d", 0.9, [1, 16]) == 16
    planner.record("d", drafted=40, accepted=38, seconds=0.1)
    assert planner.tallies()["d"].break_even_batch == 16  # over the batches measured
    assert planner.choose_k("d", 4, []) == 0  # nobody drafts
    # a batch whose plain native step was never measured takes one first
    assert planner.choose_k("d", 2, [0.9, 0.9]) == 0
    costs.observe("d", 2, 2, 0.021)
    assert planner.choose_k("d", 2, [0.9, 0.9]) > 0  # then drafting is tried


def test_costs_interpolate_along_rows_and_fall_back_to_the_nearest_batch() -> None:
    costs = StepCosts()
    assert costs.predict("d", 1, 1) is None
    costs.observe("d", 2, 2, 0.02)
    costs.observe("d", 2, 6, 0.06)
    assert math.isclose(costs.predict("d", 2, 4) or 0, 0.04)
    assert math.isclose(costs.predict("d", 2, 0) or 0, 0.6 * 0.02)  # the prior's share
    assert costs.predict("d", 3, 3) is not None  # from batch 2
    # past the last measured rows: on the last two measurements' slope, not flat
    assert math.isclose(costs.predict("d", 2, 10) or 0, 0.10)


def test_k_explores_one_doubling_past_the_measured_rows() -> None:
    costs = StepCosts()
    costs.observe("d", 16, 16, 0.040)
    planner = DraftPlanner(costs)
    assert planner.choose_k("d", 16, [0.95] * 16) == 1  # 32 rows: one doubling
    # that verify turned out compute-bound: its slope prices every larger k, and native wins
    costs.observe("d", 16, 0, 0.030)
    costs.observe("d", 16, 32, 0.075)
    assert planner.choose_k("d", 16, [0.95] * 16) == 0
    # at one row the product stays memory-bound: each doubling measured opens the next
    costs.observe("d", 1, 1, 0.020)
    costs.observe("d", 1, 0, 0.010)
    assert planner.choose_k("d", 1, [0.9]) == 1
    costs.observe("d", 1, 2, 0.0202)
    assert planner.choose_k("d", 1, [0.9]) == 3
    costs.observe("d", 1, 4, 0.0206)
    assert planner.choose_k("d", 1, [0.97]) >= 4


def test_verified_blocks_enter_the_prefix_cache(model: MultiHeadModel,
                                                readings: list[GroupedReading]) -> None:
    # A follow-up whose prompt is the first request's prompt and output finds the blocks
    # the drafting sequence filled with verified tokens.
    async def go(engine: LocalEngine) -> tuple[list[int], int | None]:
        first = _req("a", PROMPTS[0], 40, RowParams(temperature=0.0), SMALL + "+groups")
        toks = [e.token_id async for e in engine.generate(first)]
        follow = _req("b", PROMPTS[0] + tuple(toks), 4, RowParams(temperature=0.0),
                      SMALL + "+groups")
        events = [e async for e in engine.generate(follow)]
        return toks, events[0].cached_tokens

    toks, cached = _on_engine(model, readings, go, num_draft_tokens=4)
    # 20 + 40 tokens: three full blocks of 16 hold verified tokens with their KV written
    assert len(toks) == 40 and cached == 48
