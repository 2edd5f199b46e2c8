"""`heads adapt --head <split>+groups` on the tiny model: it trains the two-level reading's
first level over native context, stores it as the split head's `reading_adapter`, lowers the
reading's held-out bits without touching the split head or the native head, and the engine
serves exactly the adapted reading."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from heads.build.tiny import MATRIX
from heads.data.files import TINY_HELDOUT
from heads.engine.config import EngineConfig
from heads.engine.grouped_reading import GroupedReading
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest
from heads.errors import CheckpointError
from heads.eval.measure import GROUPED, aggregate, evaluate
from heads.manifest import BIAS, HIDDEN_DOWN, HIDDEN_UP, READING_SUFFIX, Manifest
from heads.model.forward import forward_hidden
from heads.model.weights import load_checkpoint
from heads.vocab.piece_groups import PieceGroups
from kernels.row_params import RowParams
from tests.heads.adapt_util import adapt_tiny

PROMPT = (5, 6, 7, 9, 11, 300, 17, 42, 99, 100)


def _split_head(directory: Path) -> str:
    m = Manifest.load(directory)
    return sorted(m.readings.values(), key=lambda h: m.head(h).vocab_size)[0]


@pytest.fixture(scope="module")
def adapted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("adapt-reading")
    head = _split_head(tiny_model_dir)
    return head, adapt_tiny(tiny_model_dir, work / "model", work, kind="hidden", steps=60,
                            head=head + READING_SUFFIX)


def test_the_reading_adapter_is_stored_on_its_split_head(adapted, tiny_model_dir) -> None:
    head, report = adapted
    m = Manifest.load(report.checkpoint)
    spec = m.head(head)
    assert spec.adapter is None and spec.reading_adapter == report.spec
    assert report.spec.prefix == f"adapters.{head}{READING_SUFFIX}."
    assert (report.checkpoint / report.spec.file).is_file()
    assert Manifest.from_dict(json.loads(m.to_json())) == m  # round trip
    raw = json.loads(m.to_json())
    by_name = {h["name"]: h for h in raw["heads"]}
    by_name[m.native.name]["reading_adapter"] = by_name[head]["reading_adapter"]
    with pytest.raises(CheckpointError, match="only a split head"):
        Manifest.from_dict(raw)


def test_it_lowers_the_readings_bits_and_nothing_else(adapted, tiny_model_dir) -> None:
    head, report = adapted
    r = report.result
    assert r.heldout_bpb_after < r.heldout_bpb_before * 0.99, r.history

    def bpb(directory: Path) -> dict[str, float]:
        ckpt = load_checkpoint(directory, compute_dtype="float32")
        rows = evaluate(ckpt, [TINY_HELDOUT], 8_000, 512, window_bytes=2048, grouped=True)
        return {x.head: x.bpb for x in aggregate(rows)}

    before, after = bpb(tiny_model_dir), bpb(report.checkpoint)
    assert after[head + GROUPED] < before[head + GROUPED], (before, after)
    for name in Manifest.load(tiny_model_dir).head_names:  # split head and native untouched
        assert after[name] == before[name]


def _dense_greedy(directory: Path, head: str, n: int) -> list[int]:
    """The adapted reading by hand from the stored tensors: argmax of
    (h + U D h) W[:V] + b picks the piece, argmax of the group's native rows the token."""
    ckpt = load_checkpoint(directory, compute_dtype="float32")
    m = ckpt.manifest
    spec = m.head(head).reading_adapter
    assert spec is not None
    side = load_file(str(directory / spec.file))
    w = load_file(str(directory / m.weights))[MATRIX].float()
    v = m.head(head).vocab_size
    split = ckpt.tokenizers[head].split
    assert split is not None
    groups = PieceGroups.from_split(split)
    ids = list(PROMPT)
    for _ in range(n):
        h = forward_hidden(ckpt, m.native.name, ids)[-1].float()
        h1 = h + side[spec.prefix + HIDDEN_UP] @ (side[spec.prefix + HIDDEN_DOWN] @ h)
        p = int((w[:v] @ h1 + side[spec.prefix + BIAS]).argmax())
        members = torch.from_numpy(groups.group(p))
        ids.append(int(members[int((w[members] @ h).argmax())]))
    return ids[len(PROMPT):]


def test_the_engine_serves_the_adapted_reading(adapted) -> None:
    head, report = adapted
    ckpt = load_checkpoint(report.checkpoint, compute_dtype="float32").with_readings([head])
    name = head + READING_SUFFIX
    assert ckpt.model.reading_output(head).adapted

    async def go() -> list[int]:
        engine = LocalEngine(ckpt.model, EngineConfig(num_kv_blocks=64),
                             readings=GroupedReading.served(ckpt))
        await engine.start()
        try:
            req = GenerationRequest("a", name, PROMPT, 10, RowParams(temperature=0.0),
                                    frozenset())
            return [e.token_id async for e in engine.generate(req)]
        finally:
            await engine.shutdown()

    assert asyncio.run(go()) == _dense_greedy(report.checkpoint, head, 10)
