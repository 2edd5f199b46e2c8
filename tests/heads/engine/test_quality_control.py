"""Measured quality control (heads.engine.quality_control): a reading's log-probabilities
equal the two-level definition, a laddered request starts on the rung its prompt earns, and
a move, at the prefill or mid-stream, continues exactly as the head it moved to would have."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from heads.engine.config import EngineConfig
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, QualityLadder, TokenEvent
from heads.errors import EngineError
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from tests.heads.engine.run_util import run_requests
from tests.heads.engine.test_grouped_reading import _groups
from tests.heads.tiny import HEADS, tiny_model

SMALL, MID, NATIVE = "128", "400", "1k"
GREEDY = RowParams(temperature=0.0)
PROMPT = tuple(range(500, 540))  # 39 predicted positions, none of them a kept piece


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def readings() -> list[GroupedReading]:
    return [GroupedReading.of(h, _groups(HEADS[h], HEADS[NATIVE], seed=i))
            for i, h in enumerate((SMALL, MID))]


def _serve(model: MultiHeadModel, readings: list[GroupedReading],
           *reqs: GenerationRequest) -> list[list[TokenEvent]]:
    try:
        return run_requests(model, *reqs, num_kv_blocks=96, readings=readings)
    finally:  # the module's model serves the next test afresh
        for r in readings:
            model.heads.pop(r.name)
            model._readings.pop(r.name)


def _ladder(readings: list[GroupedReading], bound: float, **kw: int) -> QualityLadder:
    return QualityLadder((readings[0].name, readings[1].name, NATIVE), bound, **kw)


def _req(rid: str, head: str, prompt: tuple[int, ...], n: int,
         ladder: QualityLadder | None = None) -> GenerationRequest:
    return GenerationRequest(rid, head, prompt, n, GREEDY, frozenset(), ladder=ladder)


def test_reading_log_probs_equal_the_two_level_definition() -> None:
    groups = _groups(16, 120, seed=4)
    reading = GroupedReading.of("16", groups)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(5, 120, generator=gen) * 3  # native logits
    first = torch.randn(5, 16, generator=gen) * 3  # level 1
    got = reading.log_probs(z, first)
    p1 = torch.log_softmax(first, -1)
    for i in range(5):
        for t in range(120):
            p = int(groups.piece[t])
            members = torch.from_numpy(groups.group(p))
            want = p1[i, p] + z[i, t] - torch.logsumexp(z[i, members], 0)
            assert math.isclose(float(got[i, t]), float(want), abs_tol=1e-5)
    assert torch.allclose(got.exp().sum(-1), torch.ones(5), atol=1e-5)  # a distribution
    targets = torch.tensor([0, 17, 64, 119, 5])
    assert torch.allclose(reading.token_log_probs(z, first, targets),
                          got[torch.arange(5), targets], atol=1e-5)


def test_first_within_takes_the_cheapest_measured_rung_in_the_bound() -> None:
    ladder = QualityLadder(("a", "b", "n"), 0.05)
    assert ladder.first_within({"a": 0.04, "b": 0.0}) == "a"
    assert ladder.first_within({"a": 0.06, "b": 0.01}) == "b"
    assert ladder.first_within({"a": 0.06, "b": 0.07}) == "n"
    assert ladder.first_within({"b": 0.01}) == "b"  # an unmeasured rung is never within
    assert ladder.first_within({"a": 0.0}, start=1) == "n"
    with pytest.raises(ValueError):
        QualityLadder(("a",), 0.05)
    with pytest.raises(ValueError):
        QualityLadder(("a", "n"), -0.1)


def test_a_loose_bound_keeps_the_cheapest_rung_and_reports_every_rungs_loss(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    [events] = _serve(model, readings,
                      _req("a", readings[0].name, PROMPT, 6, _ladder(readings, 100.0)))
    losses = dict(events[0].prompt_losses or ())
    assert set(losses) == {readings[0].name, readings[1].name}
    assert all(math.isfinite(v) for v in losses.values())
    assert {e.head for e in events} == {readings[0].name}
    assert not any(e.moves for e in events)


def test_a_prompt_over_the_bound_starts_on_the_rung_it_earns_and_serves_its_tokens(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    laddered, alone = _serve(
        model, readings, _req("a", readings[0].name, PROMPT, 8, _ladder(readings, 0.0)),
        _req("b", NATIVE, PROMPT, 8))
    losses = dict(laddered[0].prompt_losses or ())
    assert losses[readings[0].name] > 0  # a reading of a random model loses something
    [move] = laddered[0].moves
    assert (move.at, move.from_head, move.source) == (0, readings[0].name, "prompt")
    assert move.to_head == (readings[1].name if losses[readings[1].name] <= 0 else NATIVE)
    assert {e.head for e in laddered} == {move.to_head}
    if move.to_head == NATIVE:  # the same KV, the same rows: the native head's own tokens
        assert [e.token_id for e in laddered] == [e.token_id for e in alone]


def test_probes_move_a_sequence_mid_stream_and_it_continues_as_the_native_head(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    short = PROMPT[:6]  # fewer predicted positions than min_positions: not measured
    ladder = QualityLadder((readings[0].name, NATIVE), 0.0, probe_every=1, min_probes=3)
    [events] = _serve(model, readings, _req("a", readings[0].name, short, 12, ladder))
    assert events[0].prompt_losses == ()
    moves = [m for e in events for m in e.moves]
    assert len(moves) == 1 and moves[0].source == "probes"
    at = moves[0].at
    # The prefill samples token 0 unprobed; decode steps 1, 2, 3 probe, and the third
    # probe's step samples token 3 on the new head.
    assert at == 3
    assert [e.head for e in events] == [readings[0].name] * at + [NATIVE] * (12 - at)
    tokens = [e.token_id for e in events]
    # From the move on, the tokens are what the native head writes after that prefix.
    [rest] = _serve(model, readings, _req("b", NATIVE, short + tuple(tokens[:at]), 12 - at))
    assert tokens[at:] == [e.token_id for e in rest]


def test_a_ladder_must_run_from_the_request_head_to_the_native_head(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    bad = QualityLadder((readings[1].name, NATIVE), 0.05)
    with pytest.raises(EngineError, match="ladder"):
        _serve(model, readings, _req("a", readings[0].name, PROMPT, 2, bad))


def test_a_sequence_far_inside_its_bound_probes_less_often(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    from heads.engine.quality_control import QualityController
    from heads.engine.sequence import LadderState, Sequence

    for r in readings:
        model.add_reading(r.name, r.head)
    try:
        control = QualityController(model.head_output, {r.name: r for r in readings}, NATIVE)
        ladder = QualityLadder((readings[0].name, NATIVE), 100.0, probe_every=2, window=64,
                               min_probes=1, max_stretch=4)
        tight = QualityLadder((readings[0].name, NATIVE), 100.0, probe_every=2, window=64,
                              min_probes=1, relax_below=0.0)
        seqs = [Sequence("a", readings[0].name, [5], GREEDY, 99),
                Sequence("b", readings[0].name, [5], GREEDY, 99)]
        seqs[0].quality, seqs[1].quality = LadderState(ladder), LadderState(tight)
        hidden = torch.randn(2, model.manifest.backbone.hidden_size)
        probed = []
        for _ in range(32):
            before = [len(s.quality.probes) for s in seqs if s.quality is not None]
            control.at_decode(seqs, hidden)
            after = [len(s.quality.probes) for s in seqs if s.quality is not None]
            probed.append(tuple(a - b for a, b in zip(after, before, strict=True)))
    finally:
        for r in readings:
            model.heads.pop(r.name)
            model._readings.pop(r.name)
    relaxed = [i + 1 for i, p in enumerate(probed) if p[0]]
    every = [i + 1 for i, p in enumerate(probed) if p[1]]
    assert every == list(range(2, 33, 2))  # relax_below 0: never relaxed, every 2nd step
    # far inside its bound: steps 2, 4 (stretch 2), 8 (4), then every 8th, each one shared
    # with the tight sequence's probe
    assert relaxed == [2, 4, 8, 16, 24, 32]
    assert set(relaxed) <= set(every)


def test_a_prefill_timing_counts_the_tokens_computed_and_the_positions_measured(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    """The router prices a prompt's prefill and measurement from these (router.
    prefill_time_fit): tokens the prefix cache served are not computed, and a measured prompt
    scores up to `positions` of the later half of its predicted positions."""
    async def go() -> list:
        engine = LocalEngine(model, EngineConfig(num_kv_blocks=96), readings=readings)
        await engine.start()
        try:
            ladder = _ladder(readings, 100.0, positions=8)
            for r in (_req("a", readings[0].name, PROMPT, 2, ladder),
                      _req("b", NATIVE, PROMPT + (7, 8, 9), 2)):
                async for _ in engine.generate(r):
                    pass
            return engine.drain_step_timings()
        finally:
            await engine.shutdown()
    try:
        timings = asyncio.run(go())
    finally:
        for r in readings:
            model.heads.pop(r.name)
            model._readings.pop(r.name)
    prefills = [t for t in timings if t.prefill]
    decodes = [t for t in timings if not t.prefill]
    assert [t.prompts for t in prefills][0] == ((readings[0].name, len(PROMPT), 8),)
    [(head, computed, measured)] = prefills[1].prompts
    block = EngineConfig(num_kv_blocks=96).block_size
    cached = len(PROMPT) // block * block  # the first prompt's full blocks
    assert (head, computed, measured) == (NATIVE, len(PROMPT) + 3 - cached, 0)
    assert decodes and all(t.prompts == () for t in decodes)


def test_a_ladder_of_no_positions_starts_on_its_first_rung_unmeasured(
        model: MultiHeadModel, readings: list[GroupedReading]) -> None:
    # A zero bound would move any measured prompt off the reading (as the test above shows)
    [events] = _serve(model, readings, _req("a", readings[0].name, PROMPT, 4,
                                            _ladder(readings, 0.0, positions=0)))
    assert not events[0].prompt_losses and not any(e.moves for e in events)
    assert {e.head for e in events} == {readings[0].name}
