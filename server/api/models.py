"""GET /v1/models: the model itself (router picks the head) and one entry per head."""

from __future__ import annotations

from fastapi import APIRouter

from server.api.deps import GatewayDep
from server.errors import NotFound

router = APIRouter()


def _entries(gw: GatewayDep) -> list[dict]:
    m = gw.manifest
    out = [{"id": m.model_name, "object": "model", "created": 0, "owned_by": "polyhead",
            "polyhead": {"routed": True, "heads": m.head_names}}]
    for h in m.heads:
        out.append({"id": f"{m.model_name}:{h.name}", "object": "model", "created": 0,
                    "owned_by": "polyhead", "root": m.model_name,
                    "polyhead": {"head": h.name, "vocab_size": h.vocab_size,
                                 "bytes_per_token": h.bytes_per_token, "bpb": h.bpb}})
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
