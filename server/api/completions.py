"""POST /v1/completions, /v1/chat/completions and /v1/responses, streaming (SSE) and not.

Each route is plan -> admit -> respond on the gateway; this module only speaks HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from server.api.deps import ClientDep, GatewayDep, PathHeadDep, pin_model
from server.api.responses import Collector, sse_stream
from server.api.responses_api import ResponseBuilder, response_events, to_chat
from server.errors import BadRequest
from server.gateway.gateway import RequestRun
from server.gateway.request_plan import RequestPlan
from server.schemas import ChatCompletionRequest, CompletionRequest, ResponsesRequest

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
async def completions(body: CompletionRequest, request: Request, gw: GatewayDep,
                      client: ClientDep, head: PathHeadDep):
    if head is not None:
        body = body.model_copy(update={"model": pin_model(body.model, head, gw)})
    return await _complete(await gw.plan_completion(body, session_id(request)), body, request,
                           gw, client)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, gw: GatewayDep,
                           client: ClientDep, head: PathHeadDep):
    if head is not None:
        body = body.model_copy(update={"model": pin_model(body.model, head, gw)})
    return await _complete(await gw.plan_chat(body, session_id(request)), body, request, gw,
                           client)


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request, gw: GatewayDep,
                    client: ClientDep, head: PathHeadDep):
    if head is not None:
        body = body.model_copy(update={"model": pin_model(body.model, head, gw)})
    chat = to_chat(body)
    plan = await gw.plan_chat(chat, session_id(request), route="/v1/responses")
    run = await _admit(plan, chat, request, gw, client)
    headers = _headers(run.plan, chat, request)
    if body.stream:
        return _sse(response_events(run.plan, body, aiter(run), run.outcomes), run, headers)
    parts: list[str] = []
    finish: list[str | None] = [None]

    async def collect() -> None:
        async for d in run:
            parts.append(d.text)
            finish[0] = d.finish_reason or finish[0]

    await _collect(run, collect, request)
    built = ResponseBuilder(run.plan, body).response("".join(parts), finish[0], run.outcomes)
    return JSONResponse(built, headers=headers)


async def _complete(plan: RequestPlan, body: CompletionRequest | ChatCompletionRequest,
                    request: Request, gw: GatewayDep, client: str):
    """Admit the plan, then respond: what both completion routes do once planned."""
    run = await _admit(plan, body, request, gw, client)
    return await _respond(run, body, request, gw.tokenizers[run.plan.head].decode)


async def _admit(plan: RequestPlan, body: CompletionRequest | ChatCompletionRequest,
                 request: Request, gw: GatewayDep, client: str) -> RequestRun:
    if request.app.state.settings.log_prompts:
        log.info("prompt of %s (key %s): %s", plan.request_id, client,
                 body.model_dump_json(include={"prompt", "messages"}))
    return await gw.admit(plan, client)


def _headers(plan: RequestPlan, body: CompletionRequest | ChatCompletionRequest,
             request: Request) -> dict[str, str]:
    return {**plan.headers(), **request.app.state.ignored_fields.headers(body)}


async def _respond(run: RequestRun, body: CompletionRequest | ChatCompletionRequest,
                   request: Request, decode: Callable[[list[int]], str]):
    headers = _headers(run.plan, body, request)

    def token_text(ids: list[int]) -> list[str]:
        return [decode([i]) for i in ids]

    if body.stream:
        return _sse(sse_stream(run.plan, aiter(run), run.outcomes, token_text), run, headers)
    collector = Collector(run.plan, token_text)

    async def collect() -> None:
        async for d in run:
            collector.add(d)

    await _collect(run, collect, request)
    return JSONResponse(collector.body(run.outcomes), headers=headers)


def _sse(chunks: AsyncGenerator[str, None], run: RequestRun,
         headers: dict[str, str]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        # Starlette closes this iterator when the client disconnects; closing ends the run,
        # which aborts every choice in the engine and frees their KV blocks.
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()
            await run.close()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={**headers, "cache-control": "no-cache"})


async def _collect(run: RequestRun, collect: Callable[[], Awaitable[None]],
                   request: Request) -> None:
    """Run `collect` in this task, cancelling it if the client goes away first; the run ends
    either way. One watcher task per request: collecting in a task of its own as well, and
    waiting on both, would cost a second task and a wait per request."""
    handler = asyncio.current_task()
    assert handler is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await collect()
    except asyncio.CancelledError:
        if gone:
            raise asyncio.CancelledError("client disconnected") from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher  # a cancelled watcher left unawaited can stay pending for good
        await run.close()
