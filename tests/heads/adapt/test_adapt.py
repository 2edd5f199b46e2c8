"""`heads adapt` on the tiny model: it lowers held-out BPB, leaves the native head and the
shared weights bit-identical, records itself in the manifest, and every logits path (the
engine's kernels, prompt scoring, BPB eval, the vLLM export) applies it."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from heads.adapt.data import DataConfig
from heads.adapt.run import AdaptConfig, adapt
from heads.adapt.train import TrainConfig
from heads.build.tiny import MATRIX
from heads.data.files import TINY_HELDOUT
from heads.engine.config import EngineConfig
from heads.engine.llm_engine import LocalEngine
from heads.engine.types import GenerationRequest, TokenEvent
from heads.errors import AdaptError, CheckpointError
from heads.eval.measure import aggregate, evaluate
from heads.manifest import BIAS, HIDDEN_DOWN, HIDDEN_UP, LOWRANK_A, LOWRANK_B, Manifest
from heads.model.forward import forward_hidden
from heads.model.multi_head import MultiHeadModel
from heads.model.weights import load_adapter_tensors, load_checkpoint
from kernels.row_params import RowParams
from tests.heads.adapt_util import adapt_tiny, tiny_corpus

PROMPT = (5, 6, 7, 9, 11, 300, 17, 42, 99, 100)


@pytest.fixture(scope="module")
def lowrank(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("adapt-lowrank")
    return adapt_tiny(tiny_model_dir, work / "model", work)


@pytest.fixture(scope="module")
def hidden(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("adapt-hidden")
    return adapt_tiny(tiny_model_dir, work / "model", work, kind="hidden", steps=40)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_adaptation_lowers_heldout_bpb(lowrank, tiny_model_dir: Path) -> None:
    r = lowrank.result
    assert r.heldout_bpb_after < r.heldout_bpb_before * 0.97, r.history
    # And through `heads eval`'s own path, on held-out text the adapter never early-stopped
    # on (the start of the file; the adapter's held-out split is its end).
    def bpb(directory: Path) -> dict[str, float]:
        ckpt = load_checkpoint(directory, compute_dtype="float32")
        rows = aggregate(evaluate(ckpt, [TINY_HELDOUT], 8_000, 512, window_bytes=2048))
        return {x.head: x.bpb for x in rows}

    before, after = bpb(tiny_model_dir), bpb(lowrank.checkpoint)
    assert after["1k"] < before["1k"] * 0.98, (before, after)
    assert after["8k"] == before["8k"]  # the native head: same bits, same sum


def test_native_head_and_shared_weights_stay_bit_identical(lowrank, tiny_model_dir) -> None:
    out = lowrank.checkpoint
    m = Manifest.load(out)
    assert _sha(out / m.weights) == _sha(tiny_model_dir / m.weights)
    a = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    b = load_checkpoint(out, compute_dtype="float32")
    for head in ("8k", "4k"):
        assert b.model.head_output(head).bias is None
        ha = forward_hidden(a, head, list(PROMPT))
        hb = forward_hidden(b, head, list(PROMPT))
        assert torch.equal(a.model.head_logits(head, ha), b.model.head_logits(head, hb))
    h1 = forward_hidden(a, "1k", list(PROMPT))
    assert torch.equal(h1, forward_hidden(b, "1k", list(PROMPT)))  # backbone untouched
    assert not torch.equal(a.model.head_logits("1k", h1), b.model.head_logits("1k", h1))


def test_manifest_records_the_adapter_and_round_trips(lowrank) -> None:
    m = Manifest.load(lowrank.checkpoint)
    spec = m.head("1k").adapter
    assert spec is not None and spec.kind == "lowrank" and spec.rank == 8
    assert spec.steps == lowrank.result.best_step > 0
    assert spec.data == ("tiny.train.txt",) and spec.train_positions > 1000
    assert spec.heldout_bpb_after is not None and spec.heldout_bpb_before is not None
    assert spec.heldout_bpb_after < spec.heldout_bpb_before
    assert Manifest.from_dict(json.loads(m.to_json())) == m
    assert lowrank.adapter_bytes == (lowrank.checkpoint / spec.file).stat().st_size


@pytest.mark.parametrize("change", [
    {"kind": "dense"}, {"rank": 0}, {"rank": "8"}, {"file": "../elsewhere.safetensors"},
    {"steps": -1}, {"surprise": 1}, {"heldout_bpb_after": "low"},
])
def test_bad_adapter_fields_are_rejected(lowrank, change: dict) -> None:
    raw = json.loads(Manifest.load(lowrank.checkpoint).to_json())
    raw["heads"][0]["adapter"].update(change)
    with pytest.raises(CheckpointError, match=r"heads\[0\]"):
        Manifest.from_dict(raw)


def test_an_adapter_on_the_native_head_is_refused(lowrank, tmp_path: Path) -> None:
    raw = json.loads(Manifest.load(lowrank.checkpoint).to_json())
    raw["heads"][2]["adapter"] = raw["heads"][0]["adapter"]
    m = Manifest.from_dict(raw)
    tensors = load_file(str(lowrank.checkpoint / m.weights))
    tensors.update(load_adapter_tensors(lowrank.checkpoint, m))

    with pytest.raises(CheckpointError, match="native"):
        MultiHeadModel(m, tensors)
    data = DataConfig(tiny_corpus(tmp_path / "c"), (("tiny", 1.0),))
    with pytest.raises(AdaptError, match="native"):
        adapt(lowrank.checkpoint, AdaptConfig("8k", data))


def _engine_greedy(directory: Path, head: str, n: int) -> tuple[list[TokenEvent], float]:
    ckpt = load_checkpoint(directory, compute_dtype="float32")

    async def go() -> list[TokenEvent]:
        engine = LocalEngine(ckpt.model, EngineConfig(num_kv_blocks=64))
        await engine.start()
        try:
            req = GenerationRequest("a", head, PROMPT, n, RowParams(temperature=0.0),
                                    frozenset(), want_logprobs=True, score_prompt=True)
            return [e async for e in engine.generate(req)]
        finally:
            await engine.shutdown()

    events = asyncio.run(go())
    score = events[0].prompt_score
    assert score is not None
    return events, score.nll_nats


def _reference_logits(directory: Path, head: str, ids: list[int]) -> torch.Tensor:
    """[T, V] from the stored tensors by hand: W' h' + b, not through heads/model/adapter.py."""
    ckpt = load_checkpoint(directory, compute_dtype="float32")
    m = ckpt.manifest
    spec = m.head(head).adapter
    assert spec is not None
    side = load_file(str(directory / spec.file))
    w = load_file(str(directory / m.weights))[MATRIX][: m.head(head).vocab_size].float()
    h = forward_hidden(ckpt, head, ids).float()
    b = side[spec.prefix + BIAS]
    if spec.kind == "lowrank":
        return h @ (w + side[spec.prefix + LOWRANK_A] @ side[spec.prefix + LOWRANK_B]).T + b
    down, up = side[spec.prefix + HIDDEN_DOWN], side[spec.prefix + HIDDEN_UP]
    return (h + (h @ down.T) @ up.T) @ w.T + b


@pytest.mark.parametrize("which", ["lowrank", "hidden"])
def test_engine_decodes_and_scores_with_the_adapter(which: str, request) -> None:
    report = request.getfixturevalue(which)
    n = 12
    events, nll = _engine_greedy(report.checkpoint, "1k", n)
    ids = list(PROMPT) + [e.token_id for e in events]
    logp = torch.log_softmax(_reference_logits(report.checkpoint, "1k", ids), dim=-1)
    want = logp[len(PROMPT) - 1:-1].argmax(-1).tolist()
    assert [e.token_id for e in events] == want
    got_lp = torch.tensor([e.logprob for e in events])
    ref_lp = logp[len(PROMPT) - 1:-1].gather(1, torch.tensor(want)[:, None]).squeeze(1)
    torch.testing.assert_close(got_lp, ref_lp, atol=1e-4, rtol=0)
    ref_nll = -logp[: len(PROMPT) - 1].gather(1, torch.tensor(PROMPT[1:])[:, None]).sum()
    assert nll == pytest.approx(float(ref_nll), rel=1e-4)


def test_vllm_export_carries_the_adapter(lowrank, hidden, tmp_path: Path) -> None:
    from heads.vllm_plugin.export import export_vllm, export_vllm_per_head

    for report, kind in ((lowrank, "lowrank"), (hidden, "hidden")):
        out = tmp_path / kind
        layout = export_vllm(report.checkpoint, out)
        h = layout.head("1k")
        assert (h.adapter, h.adapter_rank) == (kind, 8)
        assert layout.head("8k").adapter == ""
        weights = load_file(str(out / "model.safetensors"))
        spec = Manifest.load(report.checkpoint).head("1k").adapter
        side = load_file(str(report.checkpoint / spec.file))
        assert torch.equal(weights["head_biases.0"], side[spec.prefix + BIAS])
        if kind == "lowrank":
            assert h.unembedding != h.embedding
            rows = weights[f"head_matrices.{h.unembedding}"]
            shared = weights["model.embed_tokens.weight"][:1024]
            assert torch.equal(rows, (shared.float() + side[spec.prefix + LOWRANK_A]
                                      @ side[spec.prefix + LOWRANK_B]))
        else:
            assert torch.equal(weights["head_down.0"], side[spec.prefix + HIDDEN_DOWN])
            assert h.unembedding == h.embedding
    with pytest.raises(CheckpointError, match="adapted"):
        export_vllm_per_head(lowrank.checkpoint, tmp_path / "per-head")


def test_training_resumes_where_it_stopped(tmp_path: Path, lowrank, monkeypatch) -> None:
    """An interrupted run, rerun, ends with the same parameters as one that never stopped."""
    from heads.adapt import train as adapt_train

    cache = next(p for p in (lowrank.checkpoint.parent / "cache").iterdir() if p.is_dir())
    train_data = load_file(str(cache / "train.safetensors"))
    heldout = load_file(str(cache / "heldout.safetensors"))
    w = load_checkpoint(lowrank.checkpoint, compute_dtype="float32").model \
        .unembedding_rows("1k").float()
    cfg = TrainConfig(rank=4, steps=40, batch=128, eval_every=10, patience=100)
    straight = adapt_train.train(w, train_data, heldout, cfg, tmp_path / "a.pt")

    real_save = adapt_train._save

    def save_then_die(path, cfg, params, opt, step, progress):
        real_save(path, cfg, params, opt, step, progress)
        if step == 20:
            raise KeyboardInterrupt

    monkeypatch.setattr(adapt_train, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        adapt_train.train(w, train_data, heldout, cfg, tmp_path / "b.pt")
    monkeypatch.setattr(adapt_train, "_save", real_save)
    assert torch.load(tmp_path / "b.pt", weights_only=False)["step"] == 20
    resumed = adapt_train.train(w, train_data, heldout, cfg, tmp_path / "b.pt")
    assert resumed.steps == straight.steps == 40
    assert resumed.history == straight.history
    for k, v in straight.params.state_dict().items():
        assert torch.equal(v, resumed.params.state_dict()[k]), k
