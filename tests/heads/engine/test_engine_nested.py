"""The local engine's nested pass (one read of the largest head's rows per mixed step) gives
token for token what per-group passes give, on the tiny three-head model, with and without
adapters; low-rank heads (their own folded rows) never join it."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
import torch

from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, TokenEvent
from heads.manifest import BIAS, HIDDEN_DOWN, HIDDEN_UP, LOWRANK_A, LOWRANK_B, AdapterSpec
from heads.model.multi_head import MultiHeadModel
from kernels.row_params import RowParams
from tests.heads.tiny import HEADS, tiny_manifest, tiny_model

HEAD_MIX = ["1k", "400", "128", "1k", "128", "400", "400", "1k"]
SAMPLING = [RowParams(temperature=0.0), RowParams(temperature=0.9, seed=3),
            RowParams(temperature=1.1, top_k=20, seed=4), RowParams(temperature=0.8, top_p=0.9,
                                                                    seed=5)]


def _reqs() -> list[GenerationRequest]:
    return [GenerationRequest(str(i), head, tuple(range(3 + i, 9 + 2 * i)), 9 + i,
                              SAMPLING[i % len(SAMPLING)], frozenset(), want_logprobs=i % 2 == 0)
            for i, head in enumerate(HEAD_MIX)]


def _serve(model: MultiHeadModel, nested: str) -> tuple[list[list[TokenEvent]], dict]:
    async def main() -> tuple[list[list[TokenEvent]], dict]:
        engine = LocalEngine(model, EngineConfig(num_kv_blocks=96, nested_heads=nested))
        await engine.start()
        try:
            async def collect(r: GenerationRequest) -> list[TokenEvent]:
                return [ev async for ev in engine.generate(r)]

            out = await asyncio.gather(*(collect(r) for r in _reqs()))
            return list(out), engine.kernel_counts()
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def _assert_same(a: list[list[TokenEvent]], b: list[list[TokenEvent]]) -> None:
    assert [[e.token_id for e in ev] for ev in a] == [[e.token_id for e in ev] for ev in b]
    for ea, eb in zip(a, b, strict=True):
        for x, y in zip(ea, eb, strict=True):
            if x.logprob is None:
                assert y.logprob is None
            else:
                assert y.logprob is not None and math.isclose(x.logprob, y.logprob, abs_tol=1e-4)


def _adapted(model: MultiHeadModel) -> MultiHeadModel:
    """The tiny model with a hidden adapter on "400" (shared rows) and a low-rank one on "128"
    (its own folded rows), random tensors large enough to change the tokens."""
    g = torch.Generator().manual_seed(7)
    m = tiny_manifest()
    d, r = m.backbone.hidden_size, 4
    specs = {"400": AdapterSpec("hidden", r, "adapters.400.", "adapters.safetensors"),
             "128": AdapterSpec("lowrank", r, "adapters.128.", "adapters.safetensors")}
    heads = tuple(dataclasses.replace(h, adapter=specs.get(h.name)) for h in m.heads)
    tensors = dict(model.state_dict_for_save())
    for name, spec in specs.items():
        v, p = HEADS[name], spec.prefix
        tensors[p + BIAS] = torch.randn(v, generator=g)
        if spec.kind == "hidden":
            tensors[p + HIDDEN_DOWN] = torch.randn(r, d, generator=g)
            tensors[p + HIDDEN_UP] = torch.randn(d, r, generator=g) * 0.3
        else:
            tensors[p + LOWRANK_A] = torch.randn(v, r, generator=g) * 0.3
            tensors[p + LOWRANK_B] = torch.randn(r, d, generator=g) * 0.3
    return MultiHeadModel(dataclasses.replace(m, heads=heads), tensors)


@pytest.fixture(scope="module")
def model() -> MultiHeadModel:
    return tiny_model()


def test_nested_engine_equals_per_group_token_for_token(model) -> None:
    per_group, counts_pg = _serve(model, "never")
    nested, counts_n = _serve(model, "always")
    _assert_same(nested, per_group)
    assert not any(k.startswith("nested") for _, k in counts_pg)
    assert {h for h, k in counts_n if k.startswith("nested")} == set(HEADS)
    auto, _ = _serve(model, "auto")  # whichever the plan picks, the tokens are the same
    _assert_same(auto, per_group)
    for ev, head in zip(nested, HEAD_MIX, strict=True):
        assert all(e.token_id < HEADS[head] for e in ev)


def test_nested_engine_with_adapters_equals_per_group(model) -> None:
    adapted = _adapted(model)
    per_group, _ = _serve(adapted, "never")
    nested, counts = _serve(adapted, "always")
    _assert_same(nested, per_group)
    nested_heads = {h for h, k in counts if k.startswith("nested")}
    # The hidden-adapted head shares the native rows; the low-rank head owns a folded copy.
    assert nested_heads == {"1k", "400"}
    assert any(h == "128" and not k.startswith("nested") for h, k in counts)
    plain, _ = _serve(model, "never")
    assert [[e.token_id for e in ev] for ev in plain] != [[e.token_id for e in ev]
                                                          for ev in per_group]


@pytest.mark.parametrize("mix", [{"1k": 1, "400": 1}, {"1k": 4, "128": 4},
                                 {"1k": 1, "400": 8, "128": 8}, {"400": 3, "128": 1},
                                 {"1k": 40, "400": 40, "128": 40}])
def test_engine_and_router_agree_on_the_nested_pass(model, mix: dict[str, int]) -> None:
    from types import SimpleNamespace

    from heads.engine.model_runner import ModelRunner, _by_rows, _Group, _Rows
    from heads.engine.types import NO_LOGIT_RULES
    from kernels.devices import detect_cpu
    from router.cost import Group, unembed_passes
    from router.profiles import HeadProfile

    runner = ModelRunner(model, EngineConfig(num_kv_blocks=8), num_blocks=8)
    seqs, rows = [], {}
    for head, b in mix.items():
        rows[head] = list(range(len(seqs), len(seqs) + b))
        seqs += [SimpleNamespace(params=RowParams(temperature=0.8, seed=i), num_tokens=7,
                                 want_logprobs=False, head=head, rules=NO_LOGIT_RULES,
                                 draft=None)
                 for i in range(b)]
    step = _Rows.of(seqs, torch.zeros(len(seqs), model.manifest.backbone.hidden_size))
    groups = [_Group(h, r, step, model.head_output(h), torch.device("cpu"))
              for h, r in rows.items()]
    (shared,) = _by_rows(groups).values()  # one matrix: one key
    engine = runner._nest(shared)
    b = model.manifest.backbone
    profiles = {h.name: HeadProfile(h.name, h.vocab_size, b.hidden_size, b.num_parameters(),
                                    b.kv_bytes_per_token_per_elem * 4, 4.0,
                                    shared_rows=h.unembedding) for h in model.manifest.heads}
    # the router sees the engine's device: the detected CPU, or this machine's calibrated
    # roofline where `kernels calibrate` has run
    passes = unembed_passes([Group(profiles[h], n, 10.0) for h, n in mix.items()],
                            runner.device_spec, runner.selector.calibration)
    assert runner.device_spec.name == detect_cpu().name
    assert (len(passes) == 1) == engine
