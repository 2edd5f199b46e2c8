"""GET /v1/models: the model itself (router picks the head) and one entry per head."""

from __future__ import annotations

from fastapi import APIRouter

from server.api.deps import GatewayDep
from server.errors import NotFound

router = APIRouter()


def _entries(gw: GatewayDep) -> list[dict]:
    """vLLM's `max_model_len` on every entry: the heads share one backbone and one KV cache,
    so one limit (server.gateway.request_planner.Limits), the one /tokenize reports."""
    m, limits = gw.manifest, gw.planner.limits
    shared = {"object": "model", "created": 0, "owned_by": "polyhead",
              "max_model_len": limits.max_model_len}
    out = [{"id": m.model_name, **shared,
            "polyhead": {"routed": True, "heads": m.head_names,
                         "max_prompt_tokens": limits.max_prompt_tokens}}]
    for h in m.heads:
        out.append({"id": f"{m.model_name}:{h.name}", **shared, "root": m.model_name,
                    "polyhead": {"head": h.name, "vocab_size": h.vocab_size,
                                 "bytes_per_token": h.bytes_per_token, "bpb": h.bpb,
                                 "max_prompt_tokens": limits.max_prompt_tokens}})
    return out


@router.get("/v1/models")
async def list_models(gw: GatewayDep) -> dict:
    return {"object": "list", "data": _entries(gw)}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, gw: GatewayDep) -> dict:
    for e in _entries(gw):
        if e["id"] == model_id:
            return e
    raise NotFound(f"model '{model_id}' does not exist", param="model")
