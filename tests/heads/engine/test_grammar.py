"""Structured output on the local engine (tiny model): one grammar compiled for the native
head constrains every nested head, and every constrained output matches its schema."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from heads.engine.config import EngineConfig
from heads.engine.grammar import GrammarCompiler
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, StructuredSpec
from heads.errors import GrammarError
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.row_params import RowParams

# A pattern bounds the string (xgrammar 0.2.8 lets control characters into maxLength strings).
SCHEMA = {"type": "object", "properties": {"name": {"type": "string",
                                                    "pattern": "^[a-z ]{0,12}$"},
                                           "n": {"type": "integer", "minimum": -999,
                                                 "maximum": 999}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir: Path) -> Checkpoint:
    return load_checkpoint(tiny_model_dir, compute_dtype="float32")


def compiler(ckpt: Checkpoint, head: str | None = None) -> GrammarCompiler:
    spec = (ckpt.manifest.head(head) if head else
            max(ckpt.manifest.heads, key=lambda h: h.vocab_size))
    return GrammarCompiler(ckpt.tokenizers[spec.name], spec.eos_token_ids)


@pytest.mark.parametrize("spec,text", [
    (StructuredSpec("json_schema", json.dumps(SCHEMA)), '{"name": "zoe and kim", "n": -42}'),
    (StructuredSpec("json_object"), '{"name": "Zoë ß 東京", "tags": ["a", "bß"], "n": 12}'),
])
def test_nested_heads_mask_is_a_prefix_of_the_native_mask(ckpt, spec, text):
    """Compiled for the native head or for head V itself, the grammar allows the same ids
    below V at every step of a real trajectory, split tokens and byte fallback included."""
    native = compiler(ckpt)
    for h in ckpt.manifest.heads:
        own = compiler(ckpt, h.name)
        a, b = native.constraint(spec), own.constraint(spec)
        for t in ckpt.tokenizers[h.name].encode(text):
            la, lb = torch.zeros(1, h.vocab_size), torch.zeros(1, h.vocab_size)
            a.mask(la)
            b.mask(lb)
            assert torch.equal(torch.isinf(la), torch.isinf(lb)), (h.name, t)
            assert not bool(torch.isinf(la[0, t]))  # the text's own token is allowed
            a.accept(t)
            b.accept(t)


def generate(ckpt: Checkpoint, reqs: list[GenerationRequest]) -> list[list[int]]:
    async def go() -> list[list[int]]:
        engine = LocalEngine(ckpt.model, EngineConfig(num_kv_blocks=256), compiler(ckpt))
        await engine.start()
        try:
            async def one(r: GenerationRequest) -> list[int]:
                return [e.token_id async for e in engine.generate(r)]
            return list(await asyncio.gather(*(one(r) for r in reqs)))
        finally:
            await engine.shutdown()
    return asyncio.run(go())


def test_every_constrained_output_matches_its_schema_on_every_head(ckpt):
    spec = StructuredSpec("json_schema", json.dumps(SCHEMA))
    reqs = []
    for h in ckpt.manifest.heads:
        for seed in range(8):
            temperature = 0.0 if seed == 0 else 1.0
            reqs.append(GenerationRequest(
                f"{h.name}-{seed}", h.name, (h.bos_token_id or 0, 5, 6), 96,
                RowParams(temperature=temperature, seed=seed), frozenset(h.eos_token_ids),
                structured=spec))
    # An unconstrained request in the same batches: it runs on the kernels as before.
    reqs.append(GenerationRequest("free", "1k", (0, 5, 6), 8, RowParams(temperature=0.0),
                                  frozenset()))
    outs = generate(ckpt, reqs)
    for req, ids in zip(reqs[:-1], outs[:-1], strict=True):
        head = ckpt.manifest.head(req.head)
        body = [i for i in ids if i not in head.eos_token_ids]
        value = json.loads(ckpt.tokenizers[req.head].decode(body))
        assert set(value) == {"name", "n"} and isinstance(value["n"], int), (req.head, value)
        assert len(value["name"]) <= 12 and -999 <= value["n"] <= 999
    assert len(outs[-1]) == 8


def test_choice_regex_and_bad_specs(ckpt):
    c = compiler(ckpt)
    choice = StructuredSpec("choice", json.dumps(["yes", "no"]))
    (ids,) = generate(ckpt, [GenerationRequest("c", "8k", (0, 9), 16, RowParams(seed=3),
                                               frozenset(ckpt.manifest.head("8k").eos_token_ids),
                                               structured=choice)])
    text = ckpt.tokenizers["8k"].decode(ids)
    assert text in ("yes", "no")
    with pytest.raises(GrammarError):
        c.compile(StructuredSpec("json_schema", "{not json"))
    with pytest.raises(GrammarError):
        c.compile(StructuredSpec("regex", "(unclosed"))
