"""OpenAI response bodies and SSE chunks, built from a RequestPlan and its deltas."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator

from server.api.errors import sse_error, to_api_error
from server.gateway.generation import Delta, Outcome
from server.gateway.request_plan import RequestPlan


def usage(plan: RequestPlan, outcomes: list[Outcome]) -> dict:
    completion = sum(o.completion_tokens for o in outcomes)
    # Prompts count once however many choices they have, so cached tokens do too: per prompt,
    # the most any of its choices got from the prefix cache.
    cached: dict[tuple[int, ...], int] = {}
    for job, o in zip(plan.jobs, outcomes, strict=True):
        key = job.request.prompt_ids
        cached[key] = max(cached.get(key, 0), o.cached_tokens)
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": plan.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": min(plan.prompt_tokens, sum(cached.values()))},
    }


def _completion_logprobs(ids: list[int], lps: list[float], tokens: list[str]) -> dict:
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None, "text_offset": None}


def _chat_logprobs(lps: list[float], tokens: list[str]) -> dict:
    content = [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(tokens, lps, strict=True)
    ]
    return {"content": content}


class Collector:
    """Gathers deltas per choice for a non-streaming response."""

    def __init__(self, plan: RequestPlan, token_text) -> None:  # token_text: ids -> list[str]
        self.plan = plan
        self.token_text = token_text
        n = len(plan.jobs)
        self.text = [""] * n
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n

    def add(self, d: Delta) -> None:
        self.text[d.index] += d.text
        self.ids[d.index].extend(d.token_ids)
        self.lps[d.index].extend(d.logprobs)
        if d.finish_reason:
            self.finish[d.index] = d.finish_reason

    def body(self, outcomes: list[Outcome]) -> dict:
        p = self.plan
        choices = []
        for i in range(len(p.jobs)):
            lp = None
            if p.want_logprobs:
                toks = self.token_text(self.ids[i])
                lp = (_completion_logprobs(self.ids[i], self.lps[i], toks) if p.kind == "completion"
                      else _chat_logprobs(self.lps[i], toks))
            if p.kind == "completion":
                choices.append({"index": i, "text": self.text[i], "logprobs": lp,
                                "finish_reason": self.finish[i]})
            else:
                choices.append({"index": i, "logprobs": lp, "finish_reason": self.finish[i],
                                "message": {"role": "assistant", "content": self.text[i]}})
        obj = "text_completion" if p.kind == "completion" else "chat.completion"
        return {"id": p.request_id, "object": obj, "created": p.created, "model": p.model,
                "choices": choices, "usage": usage(p, outcomes)}


def _chunk(plan: RequestPlan, choices: list[dict], usage_block: dict | None = None) -> str:
    obj = "text_completion" if plan.kind == "completion" else "chat.completion.chunk"
    body = {"id": plan.request_id, "object": obj, "created": plan.created, "model": plan.model,
            "choices": choices}
    if plan.include_usage:
        body["usage"] = usage_block
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def sse_stream(
    plan: RequestPlan, deltas: AsyncIterator[Delta], outcomes: list[Outcome], token_text
) -> AsyncGenerator[str, None]:
    started: set[int] = set()
    try:
        async for d in deltas:
            lp = None
            if plan.want_logprobs and d.token_ids:
                toks = token_text(list(d.token_ids))
                lp = (_completion_logprobs(list(d.token_ids), list(d.logprobs), toks)
                      if plan.kind == "completion" else _chat_logprobs(list(d.logprobs), toks))
            if plan.kind == "completion":
                choice = {"index": d.index, "text": d.text, "logprobs": lp,
                          "finish_reason": d.finish_reason}
            else:
                delta: dict = {"content": d.text}
                if d.index not in started:
                    delta["role"] = "assistant"
                    started.add(d.index)
                choice = {"index": d.index, "delta": delta, "logprobs": lp,
                          "finish_reason": d.finish_reason}
            yield _chunk(plan, [choice])
        if plan.include_usage:
            yield _chunk(plan, [], usage(plan, outcomes))
        yield "data: [DONE]\n\n"
    except Exception as e:  # the status line is already sent: report in-band, then end
        yield sse_error(to_api_error(e))
        yield "data: [DONE]\n\n"
