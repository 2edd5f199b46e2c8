"""OpenAI response bodies and SSE chunks, built from a RequestPlan and its deltas."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator

from heads.engine.types import TokenLogprobs
from server.api.errors import sse_error, to_api_error
from server.api.logprobs import chat_logprobs, completion_logprobs, prompt_logprobs
from server.gateway.generation import Delta, Outcome
from server.gateway.request_plan import ChoiceJob, RequestPlan


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


def _trim(lps: tuple[TokenLogprobs, ...], n: int) -> list[TokenLogprobs]:
    return [TokenLogprobs(t.logprob, t.top[:n], t.rank) for t in lps]


def _logprobs(plan: RequestPlan, job: ChoiceJob, outcome: Outcome, ids: list[int],
              lps: list[float], tops: list[TokenLogprobs], token_text, first: bool) -> dict:
    """One choice's (or one delta's) logprobs block; `first`: it opens the choice, so an
    echoed prompt's logprobs go first."""
    if plan.kind != "completion":
        return chat_logprobs(ids, lps, tops, token_text)
    ext = job.extensions
    prompt = None
    if first and ext.echo_prompt and outcome.prompt_logprobs is not None:
        prompt = (job.request.prompt_ids, _trim(outcome.prompt_logprobs, ext.top_logprobs))
    return completion_logprobs(ids, lps, tops, token_text, prompt)


def _prompt_logprobs(job: ChoiceJob, outcome: Outcome, token_text) -> list | None:
    n = job.extensions.prompt_logprobs
    if n is None or outcome.prompt_logprobs is None:
        return None
    return prompt_logprobs(job.request.prompt_ids, _trim(outcome.prompt_logprobs, n),
                           token_text)


class Collector:
    """Gathers deltas per choice for a non-streaming response."""

    def __init__(self, plan: RequestPlan, token_text) -> None:  # token_text: ids -> list[str]
        self.plan = plan
        self.token_text = token_text
        n = len(plan.jobs)
        self.text = [""] * n
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.lps: list[list[float]] = [[] for _ in range(n)]
        self.tops: list[list[TokenLogprobs]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n

    def add(self, d: Delta) -> None:
        self.text[d.index] += d.text
        self.ids[d.index].extend(d.token_ids)
        self.lps[d.index].extend(d.logprobs)
        self.tops[d.index].extend(d.tops)
        if d.finish_reason:
            self.finish[d.index] = d.finish_reason

    def body(self, outcomes: list[Outcome]) -> dict:
        p = self.plan
        choices = []
        for i, (job, outcome) in enumerate(zip(p.jobs, outcomes, strict=True)):
            lp = None
            if p.want_logprobs:
                lp = _logprobs(p, job, outcome, self.ids[i], self.lps[i], self.tops[i],
                               self.token_text, True)
            if p.kind == "completion":
                choice = {"index": i, "text": self.text[i], "logprobs": lp,
                          "finish_reason": self.finish[i]}
            else:
                choice = {"index": i, "logprobs": lp, "finish_reason": self.finish[i],
                          "message": {"role": "assistant", "content": self.text[i]}}
            plps = _prompt_logprobs(job, outcome, self.token_text)
            if plps is not None:
                choice["prompt_logprobs"] = plps
            choices.append(choice)
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
            first = d.index not in started
            started.add(d.index)
            job, outcome = plan.jobs[d.index], outcomes[d.index]
            lp = None
            if plan.want_logprobs and (d.token_ids or first):
                lp = _logprobs(plan, job, outcome, list(d.token_ids), list(d.logprobs),
                               list(d.tops), token_text, first)
            if plan.kind == "completion":
                choice = {"index": d.index, "text": d.text, "logprobs": lp,
                          "finish_reason": d.finish_reason}
            else:
                delta: dict = {"content": d.text}
                if first:
                    delta["role"] = "assistant"
                choice = {"index": d.index, "delta": delta, "logprobs": lp,
                          "finish_reason": d.finish_reason}
            if first and (plps := _prompt_logprobs(job, outcome, token_text)) is not None:
                choice["prompt_logprobs"] = plps
            yield _chunk(plan, [choice])
        if plan.include_usage:
            yield _chunk(plan, [], usage(plan, outcomes))
        yield "data: [DONE]\n\n"
    except Exception as e:  # the status line is already sent: report in-band, then end
        yield sse_error(to_api_error(e))
        yield "data: [DONE]\n\n"
