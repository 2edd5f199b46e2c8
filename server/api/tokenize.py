"""POST /tokenize and /detokenize in vLLM's shapes, per head.

Every head has its own tokenizer, so each answer names the head it used: the pinned one
(`model` "NAME:HEAD"), or for /tokenize the one the router would pick for this prompt.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from server.api.deps import ClientDep, GatewayDep, PathHeadDep, pin_model
from server.errors import BadRequest
from server.schemas import DetokenizeRequest, TokenizeRequest

router = APIRouter()


def _answer(body: dict, head: str) -> JSONResponse:
    return JSONResponse({**body, "head": head}, headers={"x-polyhead-head": head})


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, gw: GatewayDep, _: ClientDep,
                   path_head: PathHeadDep) -> JSONResponse:
    body.model = pin_model(body.model, path_head, gw)
    planner = gw.planner
    chat = body.messages is not None
    text = planner.chat_prompt(body.messages) if body.messages is not None else body.prompt or ""
    planner.check_prompt_bytes(len(text.encode()), "messages" if chat else "prompt")
    pinned = planner.pinned_head(body.model or gw.manifest.model_name)
    gw.refresh_load()  # the choice /v1/completions would make now, for a default max_tokens
    encoded, decision = await planner.route([text], chat, planner.limits.default_max_tokens,
                                            pinned, preview=True)
    head = decision.head
    tok = gw.tokenizers[head]
    # A prompt that is exactly one special token's text is that token, as in vLLM: clients
    # such as lm-eval's remote tokenizer find bos/eos ids this way. Anywhere else in a
    # completion prompt special-token text stays plain text (no forged control tokens).
    special = None if chat else tok.special_id(text)
    if special is not None:
        bos = gw.manifest.head(head).bos_token_id
        ids = [bos, special] if body.add_special_tokens and bos is not None else [special]
    elif body.add_special_tokens:
        ids = list(encoded.heads[head].ids[0])
    else:
        ids = tok.encode_with_specials(text) if chat else tok.encode(text)
    strs = [gw.tokenizers[head].id_to_token(i) for i in ids] if body.return_token_strs else None
    return _answer({"count": len(ids), "max_model_len": planner.limits.max_model_len,
                    "tokens": ids, "token_strs": strs}, head)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, gw: GatewayDep, _: ClientDep,
                     path_head: PathHeadDep) -> JSONResponse:
    body.model = pin_model(body.model, path_head, gw)
    head = gw.planner.pinned_head(body.model or gw.manifest.model_name)
    if head is None:
        raise BadRequest(
            "detokenize needs a pinned head: ids differ per head, so name one as model "
            f"'{gw.manifest.model_name}:HEAD' (heads: {', '.join(gw.manifest.head_names)})",
            param="model")
    vocab = gw.manifest.head(head).vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside head {head}'s vocabulary [0, {vocab})",
                         param="tokens")
    text = gw.tokenizers[head].decode(body.tokens, skip_special_tokens=False)
    return _answer({"prompt": text}, head)


@router.get("/tokenizer_info")
async def tokenizer_info(gw: GatewayDep, _: ClientDep, path_head: PathHeadDep,
                         model: str | None = None) -> JSONResponse:
    """vLLM's /tokenizer_info for one head: the pinned one (path or `?model=NAME:HEAD`), else
    the native (largest) head, whose ids every nested head shares up to its own V."""
    head = gw.planner.pinned_head(pin_model(model, path_head, gw) or gw.manifest.model_name)
    spec = gw.manifest.head(head) if head is not None else max(
        gw.manifest.heads, key=lambda h: h.vocab_size)
    tok = gw.tokenizers[spec.name]
    info = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.id_to_token(spec.bos_token_id) if spec.bos_token_id is not None
        else None,
        "eos_token": tok.id_to_token(spec.eos_token_ids[0]) if spec.eos_token_ids else None,
        "model_max_length": gw.planner.limits.max_model_len,
        "vocab_size": spec.vocab_size,
        "add_bos_token": spec.bos_token_id is not None,
    }
    if gw.manifest.chat_template:
        info["chat_template"] = gw.manifest.chat_template
    return _answer(info, spec.name)
