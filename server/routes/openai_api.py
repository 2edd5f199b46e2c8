"""POST /v1/completions and /v1/chat/completions, streaming (SSE) and not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from server.deps import ClientDep, GuardDep, ServiceDep
from server.generation import Outcome
from server.plan import Plan
from server.request_context import bind_request_id
from server.request_metrics import observe_choices
from server.responses import Collector, sse_stream
from server.schemas import ChatCompletionRequest, CompletionRequest
from server.service import GatewayService

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, svc: ServiceDep,
                      client: ClientDep, guard: GuardDep):
    guard.check_shape(body)
    plan = svc.plan_completion(body)
    await _admit(plan, client, guard, request, body)
    plan = await svc.admit(plan)  # KV admission: may wait, spill, or raise 429
    return await _respond(plan, body.stream, request, svc,
                          request.app.state.ignored_fields.headers(body))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, svc: ServiceDep,
                           client: ClientDep, guard: GuardDep):
    guard.check_shape(body)
    plan = svc.plan_chat(body)
    await _admit(plan, client, guard, request, body)
    plan = await svc.admit(plan)  # KV admission: may wait, spill, or raise 429
    return await _respond(plan, body.stream, request, svc,
                          request.app.state.ignored_fields.headers(body))


async def _admit(plan: Plan, client: str, guard: GuardDep, request: Request,
                 body: CompletionRequest | ChatCompletionRequest) -> None:
    bind_request_id(plan.request_id)  # the log correlation id, unless the client sent one
    await guard.admit(client, plan)
    if request.app.state.settings.log_prompts:
        log.info("prompt of %s (key %s): %s", plan.request_id, client,
                 body.model_dump_json(include={"prompt", "messages"}))


async def _respond(plan: Plan, stream: bool, request: Request, svc: GatewayService,
                   extra_headers: dict[str, str]):
    outcomes = [Outcome() for _ in plan.jobs]
    tok = svc.tokenizers[plan.head]

    def token_text(ids: list[int]) -> list[str]:
        return [tok.decode([i]) for i in ids]

    if stream:
        # Starlette cancels this generator when the client disconnects; closing it aborts
        # every choice in the engine and frees their KV blocks.
        body = _observed(sse_stream(plan, svc.stream(plan, outcomes), outcomes, token_text),
                         plan, outcomes, svc)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={**plan.headers(), **extra_headers,
                                          "cache-control": "no-cache"})
    collector = Collector(plan, token_text)

    async def collect() -> None:
        async for d in svc.stream(plan, outcomes):
            collector.add(d)

    try:
        await _until_disconnect(collect(), request)
    finally:
        observe_choices(svc.metrics, plan, outcomes)
    return JSONResponse(collector.body(outcomes), headers={**plan.headers(), **extra_headers})


async def _observed(chunks: AsyncIterator[str], plan: Plan, outcomes: list[Outcome],
                    svc: GatewayService) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        observe_choices(svc.metrics, plan, outcomes)


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
