"""Implicit chat stops: a chat request's jobs stop at the chat format's end-of-turn tokens on
every head (also after a spill) and carry its next-turn markers as stop strings; a
completion gets neither. The app is built in process on a copy of the tiny model whose EOS
is `<|eos|>` alone, so `<|im_end|>` (its template's end of turn) is the implicit stop."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from server.bootstrap import create_app
from server.schemas import ChatCompletionRequest, CompletionRequest
from server.settings import Settings


@pytest.fixture(scope="module")
def eos_only_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eos-only") / "tiny"
    shutil.copytree(tiny_model_dir, out)
    raw = json.loads((out / "manifest.json").read_text())
    for h in raw["heads"]:
        h["eos_token_ids"] = h["eos_token_ids"][:1]  # <|eos|>; drops <|im_end|>
    (out / "manifest.json").write_text(json.dumps(raw))
    return out


def _plans(model: Path, tmp_path: Path, chat_format: str) -> tuple:
    settings = Settings(model=str(model), cache_dir=tmp_path, backend="echo",
                        lambda_store=tmp_path / "lambda.json", chat_format=chat_format)
    app = create_app(settings)
    msgs = [{"role": "user", "content": "hi"}]

    async def run() -> tuple:
        async with app.router.lifespan_context(app):
            planner = app.state.gateway.planner
            chat = await planner.chat(ChatCompletionRequest(model="tiny", messages=msgs, n=2,
                                                            stop=["zz"]))
            done = await planner.completion(CompletionRequest(model="tiny", prompt="hi"))
            moved = [planner.on_head(chat, h) for h in planner.manifest.head_names]
            tokens = {h: t.token_to_id("<|im_end|>") for h, t in planner.tokenizers.items()}
            eos = {h.name: h.eos_token_ids for h in planner.manifest.heads}
            return planner.chat_format, chat, done, moved, tokens, eos

    return asyncio.run(run())


def test_model_template_end_of_turn_is_a_stop_token_on_chat_only(eos_only_model, tmp_path):
    fmt, chat, done, moved, im_end, eos = _plans(eos_only_model, tmp_path, "auto")
    assert fmt.name == "model" and fmt.stop_tokens == ("<|im_end|>",)
    for plan in (chat, *moved):
        assert len(plan.jobs) == 2
        for job in plan.jobs:
            head = job.request.head
            assert job.request.stop_token_ids == {*eos[head], im_end[head]}
            assert job.stops == ("zz",)
    assert {m.jobs[0].request.head for m in moved} == set(eos)
    (job,) = done.jobs
    assert job.request.stop_token_ids == set(eos[job.request.head]) and job.stops == ()


@pytest.mark.parametrize(("chat_format", "markers"), [
    ("qa", ("\nQuestion:", "\nAnswer:")), ("plain", ("\nuser:", "\nassistant:"))])
def test_next_turn_markers_are_stop_strings_on_chat_only(eos_only_model, tmp_path,
                                                         chat_format, markers):
    fmt, chat, done, moved, _, eos = _plans(eos_only_model, tmp_path, chat_format)
    assert fmt.name == chat_format
    for plan in (chat, *moved):
        for job in plan.jobs:
            assert job.stops == ("zz",) and job.turn_stops == markers
            assert job.request.stop_token_ids == set(eos[job.request.head])
    assert done.jobs[0].stops == () and done.jobs[0].turn_stops == ()


def test_vllm_gets_the_end_of_turn_ids_in_its_global_id_space(eos_only_model, tmp_path):
    from server.backends.vllm.backend import VllmBackend
    from server.backends.vllm.remote import RemoteReplica

    _, chat, _, _, im_end, eos = _plans(eos_only_model, tmp_path, "auto")
    req = chat.jobs[0].request
    offset = 10_000  # where the head's ids start in the engine's concatenated vocabulary
    params = VllmBackend([], {h: 8192 for h in eos})._params(req, offset)
    want = sorted(t + offset for t in (*eos[req.head], im_end[req.head]))
    assert list(params.stop_token_ids) == want
    body = RemoteReplica("http://engine", frozenset(eos), {req.head: offset})._body(params)
    assert body["stop_token_ids"] == want and body["ignore_eos"] is False


def test_min_tokens_never_holds_back_the_end_of_turn_token(eos_only_model, tmp_path):
    """min_tokens masks EOS and the client's stop ids (vLLM's rule), not the template's end
    of turn: the layout's stop ends the reply at any length. A chat without min_tokens keeps
    no rules, so its rows stay on the streaming kernels."""
    import torch

    from heads.engine.logit_rules import shape_logits
    from heads.engine.types import NO_LOGIT_RULES

    settings = Settings(model=str(eos_only_model), cache_dir=tmp_path, backend="echo",
                        lambda_store=tmp_path / "lambda.json")
    app = create_app(settings)
    msgs = [{"role": "user", "content": "hi"}]

    async def run() -> tuple:
        async with app.router.lifespan_context(app):
            planner = app.state.gateway.planner
            held = await planner.chat(ChatCompletionRequest(model="tiny:1k", messages=msgs,
                                                            min_tokens=4))
            plain = await planner.chat(ChatCompletionRequest(model="tiny:1k", messages=msgs))
            return held.jobs[0].request, plain.jobs[0].request, \
                planner.tokenizers["1k"].token_to_id("<|im_end|>")

    held, plain, im_end = asyncio.run(run())
    assert plain.rules == NO_LOGIT_RULES
    assert held.rules.min_tokens == 4 and held.rules.unmasked_stop_ids == {im_end}
    eos = set(held.stop_token_ids) - {im_end}
    logits = torch.zeros(1, 1024)
    shape_logits(logits, held.rules, held.prompt_ids, [], held.stop_token_ids)
    assert logits[0, im_end] == 0 and all(logits[0, t] == float("-inf") for t in eos)
