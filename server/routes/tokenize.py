"""POST /tokenize and /detokenize in vLLM's shapes, per head.

Every head has its own tokenizer, so each answer names the head it used: the pinned one
(`model` "NAME:HEAD"), or for /tokenize the one the router would pick for this prompt.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from server.deps import ClientDep, GuardDep, ServiceDep
from server.errors import BadRequest
from server.schemas import DetokenizeRequest, TokenizeRequest

router = APIRouter()


def _answer(body: dict, head: str) -> JSONResponse:
    return JSONResponse({**body, "head": head}, headers={"x-polyhead-head": head})


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, svc: ServiceDep, _: ClientDep,
                   guard: GuardDep) -> JSONResponse:
    chat = body.messages is not None
    text = svc.chat_prompt(body.messages) if body.messages is not None else body.prompt or ""
    size = len(text.encode())
    if size > guard.max_prompt_bytes:
        raise BadRequest(f"prompt is {size} bytes; the limit is {guard.max_prompt_bytes}",
                         param="messages" if chat else "prompt")
    pinned = svc.pinned_head(body.model or svc.manifest.model_name)
    svc.refresh_load()  # the choice /v1/completions would make now, for a default max_tokens
    encoded, decision = svc.route([text], chat, svc.limits.default_max_tokens, pinned,
                                  preview=True)
    head = decision.head
    if body.add_special_tokens:
        ids = list(encoded.heads[head].ids[0])
    else:
        tok = svc.tokenizers[head]
        ids = tok.encode_with_specials(text) if chat else tok.encode(text)
    strs = [svc.tokenizers[head].id_to_token(i) for i in ids] if body.return_token_strs else None
    return _answer({"count": len(ids), "max_model_len": svc.limits.max_model_len,
                    "tokens": ids, "token_strs": strs}, head)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, svc: ServiceDep, _: ClientDep) -> JSONResponse:
    head = svc.pinned_head(body.model or svc.manifest.model_name)
    if head is None:
        raise BadRequest(
            "detokenize needs a pinned head: ids differ per head, so name one as model "
            f"'{svc.manifest.model_name}:HEAD' (heads: {', '.join(svc.manifest.head_names)})",
            param="model")
    vocab = svc.manifest.head(head).vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside head {head}'s vocabulary [0, {vocab})",
                         param="tokens")
    text = svc.tokenizers[head].decode(body.tokens, skip_special_tokens=False)
    return _answer({"prompt": text}, head)
