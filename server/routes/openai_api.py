"""POST /v1/completions and /v1/chat/completions, streaming (SSE) and not."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from server.deps import ServiceDep
from server.generation import Outcome
from server.plan import Plan
from server.responses import Collector, sse_stream
from server.schemas import ChatCompletionRequest, CompletionRequest
from server.service import GatewayService

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, svc: ServiceDep):
    return await _respond(svc.plan_completion(body), body.stream, request, svc)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, svc: ServiceDep):
    return await _respond(svc.plan_chat(body), body.stream, request, svc)


async def _respond(plan: Plan, stream: bool, request: Request, svc: GatewayService):
    outcomes = [Outcome() for _ in plan.jobs]
    tok = svc.tokenizers[plan.head]

    def token_text(ids: list[int]) -> list[str]:
        return [tok.decode([i]) for i in ids]

    if stream:
        # Starlette cancels this generator when the client disconnects; closing it aborts
        # every choice in the engine and frees their KV blocks.
        body = sse_stream(plan, svc.stream(plan, outcomes), outcomes, token_text)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={**plan.headers(), "cache-control": "no-cache"})
    collector = Collector(plan, token_text)

    async def collect() -> None:
        async for d in svc.stream(plan, outcomes):
            collector.add(d)

    await _until_disconnect(collect(), request)
    return JSONResponse(collector.body(outcomes), headers=plan.headers())


async def _until_disconnect(work, request: Request) -> None:
    """Run `work`, cancelling it if the client goes away first (frees the engine's blocks)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (watcher, task):
            if not t.done():
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    if task.cancelled():
        raise asyncio.CancelledError("client disconnected")
    task.result()
