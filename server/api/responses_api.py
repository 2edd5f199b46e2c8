"""POST /v1/responses (OpenAI's Responses API), text only: the request becomes the chat
completion it describes, runs on the same plan -> admit -> run path, and its deltas become
a Response object or the Responses stream's typed events."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from server.api.completion_body import usage
from server.api.errors import error_body, to_api_error
from server.errors import BadRequest
from server.gateway.generation import Delta, Outcome
from server.gateway.request_plan import RequestPlan
from server.ops.request_context import new_id
from server.schemas import IGNORED_FIELDS, ChatCompletionRequest, ResponsesRequest

ROLES = ("system", "developer", "user", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")


def _message(item: dict[str, Any], i: int) -> dict[str, Any]:
    where = f"input.{i}"
    kind = item.get("type", "message")
    if kind != "message":
        raise BadRequest(f"{where}: input items of type {kind!r} are not supported; "
                         "only messages", param=where)
    role = item.get("role")
    if role not in ROLES:
        raise BadRequest(f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}.content.{j}: content of type {kind!r} is not "
                                 "supported; only text", param=f"{where}.content.{j}")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise BadRequest(f"{where}.content must be text", param=f"{where}.content")
    return {"role": role, "content": content}


def to_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion a Responses request describes; 400 for what is not served."""
    if body.previous_response_id is not None:
        raise BadRequest("previous_response_id is not supported: responses are not stored; "
                         "send the conversation as input", param="previous_response_id")
    if body.tools or body.tool_choice not in (None, "none", "auto"):
        raise BadRequest("tools are not supported", param="tools")
    fmt = (body.text or {}).get("format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") != "text":
        raise BadRequest("only text output is supported (text.format.type 'text')",
                         param="text")
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        messages += [_message(item, i) for i, item in enumerate(body.input)]
    if not messages:
        raise BadRequest("input must not be empty", param="input")
    ignored = {f: getattr(body, f) for f in IGNORED_FIELDS
               if f in body.model_fields_set and hasattr(body, f)}
    return ChatCompletionRequest(model=body.model, messages=messages,  # type: ignore[arg-type]
                                 max_tokens=body.max_output_tokens,
                                 temperature=body.temperature, top_p=body.top_p,
                                 stream=body.stream, **ignored)


class ResponsesBody:
    """The Response object of one plan (one choice): `add` each delta then `body`, or
    `stream` the deltas as the Responses stream's typed events. Its usage is the chat
    completion's, under the Responses API's names."""

    def __init__(self, plan: RequestPlan, request: ResponsesRequest) -> None:
        self.plan, self.request = plan, request
        self.id = "resp_" + plan.request_id.split("-", 1)[-1]
        self.item_id = new_id("msg_")
        self.text = ""
        self.finish: str | None = None

    def add(self, d: Delta) -> None:
        self.text += d.text
        self.finish = d.finish_reason or self.finish

    def body(self, outcomes: list[Outcome]) -> dict[str, Any]:
        return self.response(self.text, self.finish, outcomes)

    def item(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant",
                "content": content if status == "completed" or text else []}

    def response(self, text: str | None, finish: str | None,
                 outcomes: list[Outcome] | None) -> dict[str, Any]:
        b = self.request
        done = outcomes is not None
        status = "in_progress" if not done else (
            "incomplete" if finish == "length" else "completed")
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.plan.created,
            "status": status, "model": self.plan.model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
            "temperature": b.temperature, "top_p": b.top_p, "parallel_tool_calls": False,
            "tool_choice": "none", "tools": [], "text": {"format": {"type": "text"}},
            "truncation": b.truncation or "disabled", "metadata": b.metadata or {},
            "previous_response_id": None, "store": False,
            "output": [self.item(text, "completed" if status == "completed" else "incomplete")]
            if done and text is not None else [],
            "usage": None,
        }
        if outcomes is not None:
            u = usage(self.plan, outcomes)
            out["usage"] = {"input_tokens": u["prompt_tokens"],
                            "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens": u["completion_tokens"],
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": u["total_tokens"]}
        return out

    async def stream(self, deltas: AsyncIterator[Delta],
                     outcomes: list[Outcome]) -> AsyncGenerator[str, None]:
        """Typed events, each with a sequence number; errors in-band."""
        seq = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal seq
            data = {"type": kind, "sequence_number": seq, **fields}
            seq += 1
            return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        yield event("response.created", response=self.response(None, None, None))
        yield event("response.in_progress", response=self.response(None, None, None))
        yield event("response.output_item.added", output_index=0,
                    item=self.item("", "in_progress"))
        yield event("response.content_part.added", **where,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        try:
            async for d in deltas:
                self.add(d)
                if d.text:
                    yield event("response.output_text.delta", **where, delta=d.text,
                                logprobs=[])
        except Exception as e:  # the status line is sent: report in-band, as a failed response
            err = to_api_error(e)
            failed = {**self.body(outcomes), "status": "failed",
                      "error": {"code": err.code or "server_error", "message": err.message}}
            yield event("error", **error_body(err.message, err.type, err.param, err.code)["error"])
            yield event("response.failed", response=failed)
            return
        final = self.body(outcomes)
        item = final["output"][0]
        yield event("response.output_text.done", **where, text=self.text, logprobs=[])
        yield event("response.content_part.done", **where, part=item["content"][0])
        yield event("response.output_item.done", output_index=0, item=item)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        yield event(kind, response=final)
