"""POST /v1/completions, /v1/chat/completions and /v1/responses, streaming (SSE) and not.

Each route is plan -> admit -> respond on the gateway; this module only speaks HTTP. What
the body says is built in server.api.completion_body (and server.api.responses_api)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from server.api.completion_body import CompletionBody
from server.api.deps import ClientDep, GatewayDep, PathHeadDep, pin_model
from server.api.responses_api import ResponsesBody, to_chat
from server.errors import BadRequest
from server.gateway.gateway import Gateway, RequestRun
from server.gateway.generation import Delta
from server.gateway.request_plan import RequestPlan
from server.schemas import ChatCompletionRequest, CompletionRequest, ResponsesRequest

log = logging.getLogger(__name__)
router = APIRouter()

MAX_SESSION_ID = 256  # characters of x-session-id

Body = TypeVar("Body", CompletionRequest, ChatCompletionRequest, ResponsesRequest)


def session_id(request: Request) -> str | None:
    """The client's conversation id: a session stays on its head (router.affinity)."""
    value = request.headers.get("x-session-id")
    if value is not None and not 0 < len(value) <= MAX_SESSION_ID:
        raise BadRequest(f"x-session-id must be 1 to {MAX_SESSION_ID} characters",
                         param="x-session-id")
    return value


def _pinned(body: Body, head: str | None, gw: Gateway) -> Body:
    """The body under a `/heads/{head}` path, its model pinned to that head."""
    if head is None:
        return body
    return body.model_copy(update={"model": pin_model(body.model, head, gw)})


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, gw: GatewayDep,
                      client: ClientDep, head: PathHeadDep):
    body = _pinned(body, head, gw)
    run = await _admit(await gw.plan_completion(body, session_id(request)), body, request, gw,
                       client)
    return await _respond(run, CompletionBody(run.plan, gw.tokenizers[run.plan.head]), body,
                          request)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, gw: GatewayDep,
                           client: ClientDep, head: PathHeadDep):
    body = _pinned(body, head, gw)
    run = await _admit(await gw.plan_chat(body, session_id(request)), body, request, gw, client)
    return await _respond(run, CompletionBody(run.plan, gw.tokenizers[run.plan.head]), body,
                          request)


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request, gw: GatewayDep,
                    client: ClientDep, head: PathHeadDep):
    body = _pinned(body, head, gw)
    chat = to_chat(body)
    plan = await gw.plan_chat(chat, session_id(request), route="/v1/responses")
    run = await _admit(plan, chat, request, gw, client)
    return await _respond(run, ResponsesBody(run.plan, body), chat, request)


async def _admit(plan: RequestPlan, body: CompletionRequest | ChatCompletionRequest,
                 request: Request, gw: Gateway, client: str) -> RequestRun:
    if request.app.state.settings.log_prompts:
        log.info("prompt of %s (key %s): %s", plan.request_id, client,
                 body.model_dump_json(include={"prompt", "messages"}))
    return await gw.admit(plan, client)


async def _respond(run: RequestRun, built: CompletionBody | ResponsesBody,
                   body: CompletionRequest | ChatCompletionRequest, request: Request):
    """The run's deltas as SSE, or collected into one JSON body."""
    headers = {**run.plan.headers(), **request.app.state.ignored_fields.headers(body)}
    if body.stream:
        return _sse(built.stream(aiter(run), run.outcomes), run, headers)
    await _collect(run, built.add, request)
    return JSONResponse(built.body(run.outcomes), headers=headers)


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


async def _collect(run: RequestRun, add: Callable[[Delta], None], request: Request) -> None:
    """Feed the run's deltas to `add` in this task, cancelling it if the client goes away
    first; the run ends either way. One watcher task per request: collecting in a task of
    its own as well, and waiting on both, would cost a second task and a wait per request."""
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
        async for d in run:
            add(d)
    except asyncio.CancelledError:
        if gone:
            raise asyncio.CancelledError("client disconnected") from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher  # a cancelled watcher left unawaited can stay pending for good
        await run.close()
