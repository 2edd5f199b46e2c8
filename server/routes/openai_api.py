"""POST /v1/completions, /v1/chat/completions and /v1/responses, streaming (SSE) and not."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from server.client_guard import ClientGuard
from server.deps import ClientDep, GuardDep, ServiceDep
from server.errors import BadRequest
from server.generation import Outcome
from server.request_context import bind_request_id
from server.request_metrics import observe_choices
from server.request_plan import RequestPlan
from server.responses import Collector, sse_stream
from server.responses_api import ResponseBuilder, response_events, to_chat
from server.schemas import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from server.service import GatewayService

log = logging.getLogger(__name__)
router = APIRouter()


MAX_SESSION_ID = 256  # characters of x-session-id


def session_id(request: Request) -> str | None:
    """The client's conversation id: a session stays on its head (router.affinity)."""
    value = request.headers.get("x-session-id")
    if value is not None and not 0 < len(value) <= MAX_SESSION_ID:
        raise BadRequest(f"x-session-id must be 1 to {MAX_SESSION_ID} characters",
                         param="x-session-id")
    return value


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, svc: ServiceDep,
                      client: ClientDep, guard: GuardDep):
    guard.check_shape(body)
    plan = svc.plan_completion(body, session_id(request))
    return await _run(plan, body, request, svc, client, guard)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, svc: ServiceDep,
                           client: ClientDep, guard: GuardDep):
    guard.check_shape(body)
    plan = svc.plan_chat(body, session_id(request))
    return await _run(plan, body, request, svc, client, guard)


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request, svc: ServiceDep,
                    client: ClientDep, guard: GuardDep):
    chat = to_chat(body)
    guard.check_shape(chat)
    plan = dataclasses.replace(svc.plan_chat(chat, session_id(request)), route="/v1/responses")

    async def respond(plan: RequestPlan, stream: bool, request: Request, svc: GatewayService,
                      extra_headers: dict[str, str],
                      settle: Callable[[list[Outcome]], Awaitable[None]]):
        outcomes = [Outcome() for _ in plan.jobs]
        headers = {**plan.headers(), **extra_headers}
        if stream:
            events = _observed(response_events(plan, body, svc.stream(plan, outcomes), outcomes),
                               plan, outcomes, svc, settle)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={**headers, "cache-control": "no-cache"})
        parts: list[str] = []
        finish: list[str | None] = [None]

        async def collect() -> None:
            async for d in svc.stream(plan, outcomes):
                parts.append(d.text)
                finish[0] = d.finish_reason or finish[0]

        try:
            await _until_disconnect(collect(), request)
        finally:
            observe_choices(svc.metrics, plan, outcomes)
            await settle(outcomes)
        built = ResponseBuilder(plan, body).response("".join(parts), finish[0], outcomes)
        return JSONResponse(built, headers=headers)

    return await _run(plan, chat, request, svc, client, guard, respond)


async def _run(plan: RequestPlan, body: CompletionRequest | ChatCompletionRequest, request: Request,
               svc: GatewayService, client: str, guard: ClientGuard, respond=None):
    bind_request_id(plan.request_id)  # the log correlation id, unless the client sent one
    charge = await guard.admit(client, plan)  # rate limits: prompt + max_tokens, up front
    if request.app.state.settings.log_prompts:
        log.info("prompt of %s (key %s): %s", plan.request_id, client,
                 body.model_dump_json(include={"prompt", "messages"}))
    try:
        admitted = await svc.admit(plan)  # KV admission: may wait, spill, or raise 429
    except BaseException:
        await guard.settle(charge, plan, [])  # nothing ran: give back the output budget
        raise

    async def settle(outcomes: list[Outcome]) -> None:  # the tokens actually used
        await guard.settle(charge, admitted, outcomes)

    return await (respond or _respond)(admitted, body.stream, request, svc,
                                       request.app.state.ignored_fields.headers(body), settle)


async def _respond(plan: RequestPlan, stream: bool, request: Request, svc: GatewayService,
                   extra_headers: dict[str, str],
                   settle: Callable[[list[Outcome]], Awaitable[None]]):
    outcomes = [Outcome() for _ in plan.jobs]
    tok = svc.tokenizers[plan.head]

    def token_text(ids: list[int]) -> list[str]:
        return [tok.decode([i]) for i in ids]

    if stream:
        # Starlette cancels this generator when the client disconnects; closing it aborts
        # every choice in the engine and frees their KV blocks.
        body = _observed(sse_stream(plan, svc.stream(plan, outcomes), outcomes, token_text),
                         plan, outcomes, svc, settle)
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
        await settle(outcomes)
    return JSONResponse(collector.body(outcomes), headers={**plan.headers(), **extra_headers})


async def _observed(chunks: AsyncIterator[str], plan: RequestPlan, outcomes: list[Outcome],
                    svc: GatewayService, settle: Callable[[list[Outcome]], Awaitable[None]]
                    ) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        observe_choices(svc.metrics, plan, outcomes)
        await settle(outcomes)


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
